"""Lightning fine-tuning step vs a plain PyTorch loop step: same model, same batches, same optimizer and schedule.

    .venv/bin/python bench/bench_lightning_step.py                  # MiniLM, synthetic NLI batches
    .venv/bin/python bench/bench_lightning_step.py --model tiny_bert --steps 30

A step is timed from one batch's start to the next's (fetch, forward, backward, clipping,
optimizer, scheduler, logging: everything the loop does). The two loops alternate for several
rounds so that load from other processes falls on both; the ratio is of the medians.
Target: Lightning / plain <= 1.05.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import parse_args  # noqa: E402


def make_task(model_name: str, n_batches: int, batch_size: int):
    """An NLIModule and a list of ready (padded) synthetic batches."""
    from hydra import compose, initialize_config_dir

    from headprune.models.build import build_tokenizer
    from headprune.tasks.nli.data import NLIDataConfig, NLIDataModule
    from headprune.tasks.nli.task import NLIModule
    from headprune.tasks.registry import build_task_model

    conf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf")
    with initialize_config_dir(config_dir=os.path.abspath(conf), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "experiment=nli_finetune",
                f"model={model_name}",
                "data=nli_synthetic",
                f"data.batch_size={batch_size}",
                "data.importance_size=0",
                f"data.synthetic.train_size={n_batches * batch_size}",
                "data.synthetic.eval_size=30",
                "data.synthetic.mismatched_size=30",
            ],
        )
    model_cfg = cfg.model
    tokenizer = build_tokenizer(model_cfg)
    data = NLIDataModule(NLIDataConfig.from_cfg(cfg.data), tokenizer)
    data.setup()
    batches = [b for b in data.train_dataloader()][:n_batches]
    torch.manual_seed(0)
    return NLIModule(build_task_model(model_cfg), tokenizer, data, lr=5e-5, weight_decay=0.01, warmup_ratio=0.06), batches


class StepClock(L.Callback):
    """Wall time at the start of every training batch (and at the end of training)."""

    def __init__(self):
        self.marks = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.marks.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module):
        self.marks.append(time.perf_counter())


def lightning_steps(module, batches, warmup: int) -> list[float]:
    clock = StepClock()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=len(batches),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[clock],
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    trainer.fit(module, train_dataloaders=loader)
    times = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    return times[warmup:]


def plain_steps(module, batches, warmup: int) -> list[float]:
    from transformers import get_linear_schedule_with_warmup

    model = module.model
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "LayerNorm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "LayerNorm" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=5e-5)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.06 * len(batches)), len(batches))
    marks = []
    for batch in batches:
        marks.append(time.perf_counter())
        logits = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}).logits
        loss = F.cross_entropy(logits, batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())  # what Lightning's loss logging syncs on
    marks.append(time.perf_counter())
    times = [b - a for a, b in zip(marks, marks[1:])]
    return times[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm", help="a conf/model name (minilm, tiny_bert, ...)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (after warm-up)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two loops")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 1)))
    args = parse_args(parser, smoke={"model": "tiny_bert", "steps": 2, "warmup": 1, "rounds": 1, "batch_size": 4})
    torch.set_num_threads(args.threads)
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    task, batches = make_task(args.model, args.steps + args.warmup, args.batch_size)
    state = copy.deepcopy(task.model.state_dict())
    lit, plain = [], []
    for _ in range(args.rounds):
        task.model.load_state_dict(state)
        plain += plain_steps(task, batches, args.warmup)
        task.model.load_state_dict(state)
        lit += lightning_steps(task, batches, args.warmup)
    p, l = statistics.median(plain), statistics.median(lit)
    print(f"model={args.model} batch={args.batch_size} steps={len(plain)} per loop, threads={args.threads}")
    print(f"plain PyTorch step: median {1000 * p:.1f} ms (mean {1000 * statistics.mean(plain):.1f})")
    print(f"Lightning step:     median {1000 * l:.1f} ms (mean {1000 * statistics.mean(lit):.1f})")
    print(f"ratio Lightning / plain = {l / p:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
