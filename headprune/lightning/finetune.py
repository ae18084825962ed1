"""Fine-tune recovery through Lightning: a short fine-tune of a physically pruned model, optionally distilled."""

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from headprune.core.inputs import model_inputs
from headprune.lightning.layer_distill import LayerTargets, layer_distillation_loss, layer_targets
from headprune.lightning.lora import add_lora, merge_lora
from headprune.lightning.precisions import PRECISIONS
from headprune.lightning.resume import SaveEvery, forget, resume_from, weights_digest
from headprune.scoring.importance import per_example_loss


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """KL(teacher_T || student_T) * T^2, averaged over examples (or over the ``valid`` tokens of sequence outputs)."""
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}")
    vocab = student_logits.shape[-1]
    student_logits, teacher_logits = student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab)  # (N, V)
    if valid is not None:  # only the valid rows get a softmax over the vocabulary (an LLM's is large)
        keep = valid.reshape(-1).to(student_logits.device).bool()
        student_logits, teacher_logits = student_logits[keep], teacher_logits[keep]
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)  # (N,)
    return kl.mean() * temperature**2


def real_tokens(batch: dict) -> int:
    """Real input tokens of a training batch: attention-mask ones, every input id without a mask (examples without ids)."""
    mask, ids = batch.get("attention_mask"), batch.get("input_ids")
    if mask is not None:
        return int(mask.sum())
    return int(ids.numel()) if ids is not None else int(next(iter(batch.values())).shape[0])


class RecoveryModule(L.LightningModule):
    """Fine-tune ``model`` on (1 - distill_weight) * task + distill_weight * logit KL to ``teacher`` + layer_distill * hidden-state loss."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable = per_example_loss,
        teacher: nn.Module | None = None,
        temperature: float = 2.0,
        distill_weight: float = 0.0,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        warmup: float = 0.0,
        total_steps: int | None = None,
        log_prefix: str = "recover",
        layer_distill: float = 0.0,
        targets: LayerTargets | None = None,
        layer_loss: str = "batch",
    ):
        super().__init__()
        if (distill_weight > 0 or layer_distill > 0) and teacher is None:
            raise ValueError("distillation (distill_weight or layer_distill > 0) needs a teacher (the unpruned model); pass teacher=")
        self.model, self.loss_fn = model, loss_fn
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None else None
        if not 0.0 <= warmup < 1.0:
            raise ValueError(f"warmup is the fraction of the fine-tune's steps spent warming up: it must be in [0, 1), got {warmup}")
        self.temperature, self.distill_weight, self.lr, self.weight_decay = temperature, distill_weight, lr, weight_decay
        if layer_loss not in ("batch", "token"):
            raise ValueError(f"layer_loss is 'batch' (one normaliser per layer) or 'token' (each token's own), got {layer_loss!r}")
        self.layer_distill, self.per_token = float(layer_distill), layer_loss == "token"
        self.targets = targets if targets is not None or not self.layer_distill else layer_targets(model, teacher)
        self.warmup, self.total_steps, self.log_prefix = warmup, total_steps, log_prefix
        self.history: list[dict] = []
        self._mark = 0.0  # perf_counter at the end of the last step (or the start of training)

    def losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(task loss, logit distillation loss, hidden-state distillation loss) of one batch; a term not asked for is 0."""
        hidden = self.layer_distill > 0
        outputs = self.model(**model_inputs(self.model, batch), **({"output_hidden_states": True} if hidden else {}))
        task = self.loss_fn(outputs, batch).mean()
        zero = task.new_zeros(())
        if self.teacher is None or (self.distill_weight == 0 and not hidden):
            return task, zero, zero
        with torch.no_grad():
            teacher_outputs = self.teacher(**model_inputs(self.teacher, batch), **({"output_hidden_states": True} if hidden else {}))
        distill = zero
        if self.distill_weight > 0:  # sequence logits (B, T, V): the real target tokens only; one prediction per example: all
            logits, labels = outputs.logits, batch.get("labels")
            valid = labels != -100 if logits.dim() == 3 and labels is not None and labels.shape == logits.shape[:2] else None
            distill = distillation_loss(logits, teacher_outputs.logits, self.temperature, valid)
        layers = layer_distillation_loss(outputs, teacher_outputs, batch, self.targets, self.per_token) if hidden else zero
        return task, distill, layers

    def on_train_start(self) -> None:
        self._mark = time.perf_counter()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """A resume checkpoint holds the student, not the frozen teacher, and the steps' history so far."""
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("teacher.")}
        now = time.perf_counter()  # saved from a step's end, before this module's own end of step timed it
        checkpoint["history"] = [{"seconds": now - self._mark, **step} for step in self.history]

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """The teacher's weights come from the teacher itself; the history continues."""
        if self.teacher is not None:
            checkpoint["state_dict"].update({f"teacher.{k}": v for k, v in self.teacher.state_dict().items()})
        self.history = list(checkpoint.get("history", []))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        task, distill, layers = self.losses(batch)
        loss = (1 - self.distill_weight) * task + self.distill_weight * distill + self.layer_distill * layers
        terms = {"loss": loss, "task": task, "distill": distill, "layer_distill": layers}
        logged = {f"{self.log_prefix}/{k}": v for k, v in terms.items() if k != "layer_distill" or self.layer_distill > 0}
        self.log_dict(logged, batch_size=next(iter(batch.values())).shape[0])
        self.history.append({**{k: float(v.detach()) for k, v in terms.items()}, "tokens": real_tokens(batch)})
        return loss

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        """The step's wall time (data, forward, backward and optimizer step) and the tokens per second so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.history[-1]["seconds"], self._mark = now - self._mark, now
        tokens, seconds = sum(h["tokens"] for h in self.history), sum(h["seconds"] for h in self.history)
        prefix = self.log_prefix
        self.log_dict({f"{prefix}/tokens": float(tokens), f"{prefix}/tokens_per_s": tokens / max(seconds, 1e-9)}, batch_size=1)

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        if not self.total_steps:
            return optimizer
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(self.total_steps, self.warmup))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def linear_warmup_decay(total_steps: int, warmup: float):
    """lr factor at step t: linear from 0 to 1 over ``warmup * total_steps`` steps, then linear down to 0 at ``total_steps``."""
    warm = max(int(round(warmup * total_steps)), 0)

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(total_steps - step, 0) / max(total_steps - warm, 1)

    return factor


def finetune_recover(
    model: nn.Module,
    batches: Iterable[dict] | DataLoader,
    max_steps: int = 100,
    max_epochs: int | None = None,
    decay: bool = False,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    seed: int = 0,
    progress: bool = False,
    checkpoints: Path | None = None,
    checkpoint_every: int | None = None,
    accelerator: str = "auto",
    precision: str = "32-true",
    logger=False,
    callbacks: Iterable[L.Callback] = (),
    **training,
) -> list[dict]:
    """Fine-tune a (physically pruned) model in place for ``max_steps`` (or ``max_epochs``) with RecoveryModule's ``training``
    settings (teacher, distill_weight, lr, ...) in ``precision`` (one of PRECISIONS); each step's losses, tokens and seconds. With ``checkpoints`` (a folder) and
    ``checkpoint_every``, a rerun resumes from the last save (removed once the fine-tune ends)."""
    total = int(max_steps) if decay and max_epochs is None else None
    teacher, layer_distill = training.get("teacher"), training.get("layer_distill")  # RecoveryModule's defaults: none, 0
    targets = layer_targets(model, teacher) if layer_distill and teacher is not None else None  # read before LoRA wraps it
    trained = add_lora(model, int(lora_rank), lora_alpha, seed) if lora_rank is not None else model
    module = RecoveryModule(trained, total_steps=total, targets=targets, **training)
    if precision not in PRECISIONS:
        raise ValueError(f"precision is one of {', '.join(PRECISIONS)} (Lightning's names), got {precision!r}")
    settings = dict(
        precision=precision,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        accelerator=accelerator,
        devices=1,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
    )
    batches = batches if isinstance(batches, DataLoader) else list(batches)
    folder = Path(checkpoints) if checkpoints is not None else None
    resumable = bool(folder and checkpoint_every and max_epochs is None and not isinstance(batches, DataLoader) and batches)
    resume, done = None, 0
    if resumable:
        fingerprint = {
            "steps": int(max_steps),
            "batches": len(batches),
            "tokens": sum(map(real_tokens, batches)),
            "lr": float(module.lr),
            "seed": int(seed),
            "lora_rank": lora_rank,
            "precision": precision,
            "trained": sum(p.numel() for p in trained.parameters() if p.requires_grad),
            "decay": bool(decay),
            "losses": [module.distill_weight, module.layer_distill, module.temperature, module.warmup, module.per_token],
            "teacher": weights_digest(module.teacher),  # the unpruned model or the control: a resume keeps its teacher
        }
        resume, done = resume_from(folder, fingerprint)
        settings["callbacks"].append(SaveEvery(folder, int(checkpoint_every), fingerprint))
    trainer = L.Trainer(max_steps=max_steps if max_epochs is None else -1, max_epochs=max_epochs, **settings)
    if resumable:  # one pass over the steps not yet taken, batch i of step i mod len(batches) as epochs would give it
        batches = [batches[step % len(batches)] for step in range(done, int(max_steps))]
    loader = batches if isinstance(batches, DataLoader) else DataLoader(batches, batch_size=None)
    model.train()  # dropout on while fine-tuning (HF models load in eval mode and Lightning keeps the mode)
    try:
        with torch.random.fork_rng():  # dropout drawn from ``seed``: the same inputs give the same model wherever it runs
            torch.manual_seed(int(seed) + done)
            trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)
    finally:
        if lora_rank is not None:
            merge_lora(trained)  # the adapters folded into ``model``'s own projections
        model.eval()
    if resumable:
        forget(folder)
    return module.history
