"""TranslationModule: a BART/Marian-family translation model with head gates on enc_self, enc_dec and dec_self."""

import time
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from transformers import StoppingCriteria, StoppingCriteriaList

from headprune.core.inputs import eval_mode
from headprune.core.units import model_gates
from headprune.core.vocab.generation import removed_token_processors
from headprune.models.tokenizers import decode, has_tokenizer, load_tokenizer, special_ids
from headprune.results.writer import texts_fingerprint
from headprune.tasks.base import EvalResult, TimedCall
from headprune.tasks.common import LazySizes, SharedTaskMethods
from headprune.tasks.mt.data import TokenBatches, TranslationDataModule, split_of

# task.* besides name (conf/task/mt.yaml)
TASK_SETTINGS = ("label_smoothing", "beam_size", "val_beam_size", "len_ratio", "len_extra", "mask_chunk")


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, list[list[int]]]:
    """sacrebleu corpus BLEU and the per-sentence sufficient statistics a paired bootstrap resamples."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    stats = bleu._extract_corpus_statistics(hypotheses, [references])  # per sentence: [hyp_len, ref_len, correct 1-4, total 1-4]
    score = bleu.corpus_score(hypotheses, [references]).score
    return float(score), [list(map(int, s)) for s in stats]


def inverse_sqrt(warmup: int):
    """lr factor: linear warm-up to 1 over ``warmup`` steps, then ``sqrt(warmup / step)``."""
    warmup = max(1, int(warmup))

    def factor(step: int) -> float:
        step = step + 1
        return step / warmup if step < warmup else (warmup / step) ** 0.5

    return factor


class BatchProgress(StoppingCriteria):
    """``on_batch`` told of ``sentences`` in shares: one per decoding step of at most ``steps`` steps, the rest at ``done``."""

    def __init__(self, on_batch, sentences: int, steps: int):
        self.on_batch, self.sentences, self.share, self.told = on_batch, sentences, sentences / max(steps, 1), 0.0

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        """At every decoding step: one share told, generation never stopped."""
        share = min(self.share, 0.99 * self.sentences - self.told)  # the last share waits for the batch's end
        if share > 0:
            self.told += share
            self.on_batch(share)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def done(self) -> None:
        """The batch is scored: report what is left of its sentences."""
        if self.on_batch is not None:
            self.on_batch(self.sentences - self.told)


class TranslationModule(SharedTaskMethods, L.LightningModule):
    """Train and evaluate a seq2seq model (corpus BLEU) with every attention head gated."""

    name = "mt"
    metric = "bleu"
    higher_is_better = True
    paired_test_name = "sacrebleu PairedTest(bs)"
    selection_split = "heldout"  # data.heldout_split (valid): the paper's appendix A

    def __init__(self, model, tokenizer, data: TranslationDataModule, task_cfg, optim_cfg=None, scheduler_cfg=None):
        super().__init__()
        self.model = model
        self.gates = model_gates(model)
        self.tokenizer = tokenizer
        self.data = data
        self.task_cfg = OmegaConf.to_container(task_cfg, resolve=True) if OmegaConf.is_config(task_cfg) else dict(task_cfg or {})
        missing = sorted(set(TASK_SETTINGS) - set(self.task_cfg))  # task.* of conf/task/mt.yaml
        if missing:
            raise ValueError(f"task setting(s) {missing} missing: compose the config with the MT task group (conf/task/mt.yaml)")
        self.optim_cfg, self.scheduler_cfg = optim_cfg, scheduler_cfg
        self._val_outputs: list[tuple[list[int], list[str]]] = []
        self._val_nll: list[tuple[float, int]] = []
        self._eval_cache: dict[str, list[dict]] = {}

    def forward(self, batch: dict) -> torch.Tensor:
        """Teacher-forced logits (B, T, V) of a batch, in float32."""
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"])
        return out.logits.float()

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=self.task_cfg["label_smoothing"])
        tokens = int((labels != -100).sum())
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        self.log("train/tokens", float(tokens), reduce_fx="sum", on_step=False, on_epoch=True)
        return loss

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Mean token cross-entropy of each sentence (pad ignored), shape (B,)."""
        labels = batch["labels"]
        logits = self(batch)
        token_loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")  # (B, T)
        counts = (labels != -100).sum(1).clamp(min=1)
        return token_loss.sum(1) / counts

    def on_train_epoch_start(self) -> None:
        self.data.train_set.set_epoch(self.current_epoch)  # reshuffle the token batches each epoch

    def max_new_tokens(self, input_ids: torch.Tensor) -> int:
        """The most tokens a translation of a batch may take: ``task.len_ratio`` x its length + ``task.len_extra``."""
        max_pos = getattr(self.model.config, "max_position_embeddings", 512)
        return min(int(input_ids.shape[1] * self.task_cfg["len_ratio"] + self.task_cfg["len_extra"]), max_pos - 1)

    def generate(self, batch: dict, beam_size: int, max_time: float | None = None, progress: BatchProgress | None = None) -> list[str]:
        """Detokenized translations of a batch (beam search, or greedy at beam 1), stopped after ``max_time`` s; ``progress`` per step."""
        config = self.model.config
        out = self.model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=int(beam_size),
            do_sample=False,
            max_new_tokens=self.max_new_tokens(batch["input_ids"]),
            length_penalty=1.0,
            num_return_sequences=1,
            decoder_start_token_id=config.decoder_start_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            bad_words_ids=[[config.pad_token_id]],
            logits_processor=removed_token_processors(self.model),  # a cut vocabulary's removed tokens are never emitted
            max_time=max_time,
            stopping_criteria=None if progress is None or progress.on_batch is None else StoppingCriteriaList([progress]),
        )
        return decode(self.tokenizer, out)

    @torch.no_grad()
    def timed_beam(self, batch: dict) -> None:
        """Beam search (``task.beam_size``) of a timing batch's sources, detokenized: what a translation user waits for."""
        from headprune.engine.timing import budget_cut, seconds_left

        left, start = seconds_left(), time.perf_counter()
        self.generate(batch, int(self.task_cfg["beam_size"]), max_time=left)
        if left is not None and time.perf_counter() - start >= left:
            budget_cut()

    def timed_calls(self) -> dict:
        """The teacher-forced forward (examples/s) and beam-search translation (sentences/s, timed last: Pareto points use it)."""
        return {"forward": TimedCall(self.timed_call), "beam": TimedCall(self.timed_beam, "sentences")}

    def validation_step(self, batch, batch_idx):
        ids = batch["ids"].tolist()
        labels = batch["labels"]
        logits = self(batch)
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        self._val_nll.append((float(nll), int((labels != -100).sum())))
        self._val_outputs.append((ids, self.generate(batch, self.task_cfg["val_beam_size"])))

    def on_validation_epoch_end(self) -> None:
        outputs, nll = self._val_outputs, self._val_nll
        self._val_outputs, self._val_nll = [], []
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, (outputs, nll))
            outputs = [o for part in gathered for o in part[0]]
            nll = [n for part in gathered for n in part[1]]
        by_id = {i: h for ids, hyps in outputs for i, h in zip(ids, hyps)}
        if not by_id:
            return
        refs = self.data.references("valid")
        hyps = [by_id.get(i, "") for i in range(len(refs))]
        bleu, _ = corpus_bleu(hyps, refs)
        tokens = sum(n for _, n in nll)
        self.log("val/bleu", bleu, prog_bar=True, sync_dist=False, rank_zero_only=False)
        self.log("val/nll", sum(v for v, _ in nll) / max(tokens, 1), sync_dist=False)

    def split_sizes(self) -> LazySizes:
        """{split: sentences} of train, valid, test and their roles eval and heldout (0 = missing), counted when read."""

        def count(split: str) -> int:  # unreadable data files raise (they are not "empty")
            return len(self.data.references(split_of(self.data.cfg, split)))

        return LazySizes(("train", "valid", "test", "eval", "heldout"), count)

    def data_fingerprint(self, split: str) -> str:
        """A hash of the split's reference translations."""
        return texts_fingerprint(self.data.references(split_of(self.data.cfg, split)))

    def paired_test(
        self, baseline: EvalResult, systems: list[EvalResult], n_samples: int = 1000, seed: int = 0, alpha: float = 0.01
    ) -> list:
        """sacrebleu's paired bootstrap of corpus BLEU."""
        from headprune.scoring.significance import paired_bootstrap_bleu

        return paired_bootstrap_bleu(
            baseline.per_example["hypotheses"],
            [s.per_example["hypotheses"] for s in systems],
            baseline.per_example["references"],
            n_samples=n_samples,
            seed=seed,
            alpha=alpha,
        )

    @contextmanager
    def split_by(self, split_row, tokenizer, splits: list[str]):
        """Within: ``splits`` hold their sources and targets split again by ``split_row`` into ``tokenizer``'s ids, and
        translations are decoded by ``tokenizer`` (a pruned vocabulary's own); BLEU still reads the reference text."""
        data, names = self.data, {split_of(self.data.cfg, split) for split in splits}
        own = {name: data.split_encoded(name) for name in names}, data.tokenizer, self.tokenizer, self._eval_cache
        data.encoded.update({name: tuple([split_row(ids)[0] for ids in rows] for rows in pair) for name, pair in own[0].items()})
        data.tokenizer = self.tokenizer = tokenizer  # the pad / start ids and the detokenizer follow
        self._eval_cache = {}  # batches of the split rows
        try:
            yield self
        finally:
            data.encoded.update(own[0])
            data.tokenizer, self.tokenizer, self._eval_cache = own[1:]

    def token_rows(self, split: str) -> list[list[int]]:
        """Each example's source and target token ids: a cut vocabulary keeps what either language uses."""
        return [row for rows in self.data.split_encoded(split_of(self.data.cfg, split)) for row in rows]

    def forward_batches(self, split: str) -> list[dict]:
        return self.data.eval_batches(split_of(self.data.cfg, split), with_targets=True)

    def translate(self, split: str = "eval", mask=None, beam_size: int | None = None, on_batch=None) -> list[str]:
        """Translations of every source sentence of ``split``, in the split's order; ``on_batch(n)`` after each batch of ``n``."""
        return self._translations(split, [mask], beam_size, on_batch, per_row=False)[0]

    def _result(self, hyps: list[str], split: str) -> EvalResult:
        refs = self.data.references(split_of(self.data.cfg, split))
        score, stats = corpus_bleu(hyps, refs)
        return EvalResult(score=score, metric="bleu", n=len(refs), per_example={"hypotheses": hyps, "references": refs, "stats": stats})

    def evaluate(self, mask=None, split: str = "eval", beam_size: int | None = None, on_batch=None) -> EvalResult:
        """Corpus BLEU on ``split`` under ``mask`` (beam search, ``task.beam_size``); ``on_batch(n)`` after each batch."""
        return self._result(self.translate(split, mask, beam_size, on_batch), split)

    def evaluate_many(self, masks: list, split: str = "eval", beam_size: int | None = None, on_batch=None) -> list[EvalResult]:
        """BLEU for each mask; ``task.mask_chunk`` masks share one batched generate (a mask per example row)."""
        if not masks:
            return []
        ones = self.gates.ones()
        masks = [{**ones, **(self.gates.normalize_mask(m) if m is not None else {})} for m in masks]  # None = all heads
        return [self._result(hyps, split) for hyps in self._translations(split, masks, beam_size, on_batch, per_row=True)]

    def _translations(self, split: str, masks: list, beam_size: int | None, on_batch, per_row: bool) -> list[list[str]]:
        """Translations of ``split`` per mask, in order: ``per_row``, ``task.mask_chunk`` masks per generate (one per row), else the one; ``on_batch(n)`` per batch."""
        split = split_of(self.data.cfg, split)
        beam_size = int(beam_size or self.task_cfg["beam_size"])
        chunk = max(1, int(self.task_cfg["mask_chunk"])) if per_row else 1
        hyps: list[dict[int, str]] = [{} for _ in masks]
        if split not in self._eval_cache:  # the split's source batches, made once
            self._eval_cache[split] = self.data.eval_batches(split, with_targets=False)
        with eval_mode(self.model), torch.no_grad():
            for batch in self._eval_cache[split]:
                ids, inputs = batch["ids"].tolist(), self._to_device(batch)
                n = len(ids)
                steps = self.max_new_tokens(batch["input_ids"]) * -(-len(masks) // chunk)  # decoding steps of every chunk
                progress = BatchProgress(on_batch, n, steps)
                for start in range(0, len(masks), chunk):
                    group = masks[start : start + chunk]
                    k = len(group)
                    if per_row:  # (k*B, L, H): row j*B + b = example b under mask j
                        inputs_k = {key: value.repeat(k, 1) for key, value in inputs.items()}
                        mask = {g: torch.stack([m[g] for m in group]).repeat_interleave(n, dim=0) for g in group[0]}
                    else:
                        inputs_k, mask = inputs, group[0]
                    with self.gates.masked(mask):
                        out = self.generate(inputs_k, beam_size, progress=progress)
                    for j in range(k):
                        hyps[start + j].update(zip(ids, out[j * n : (j + 1) * n]))
                progress.done()
        return [[h[i] for i in range(len(h))] for h in hyps]

    def importance_batches(self) -> list[dict]:
        """Batches with labels of the fixed importance subset of the training split (model inputs only)."""
        return [self._to_device(b) for b in self.data.importance_batches()]

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """Shuffled token-count batches of the training split (``seed``) until about ``examples`` sentences are in."""
        src, tgt = self.data.split_encoded("train")
        shuffled = TokenBatches(src, tgt, self.data.pad_id, self.data.start_id, int(self.data.cfg.max_tokens), shuffle=True, seed=seed)
        batches, seen = [], 0
        for batch in shuffled:
            if seen >= examples:
                break
            batches.append(self._to_device(batch))
            seen += len(batch["input_ids"])
        return batches

    def configure_optimizers(self):
        from hydra.utils import instantiate

        if self.optim_cfg is None or self.scheduler_cfg is None:
            raise ValueError("training needs optim and scheduler settings: compose the config with the MT task group (conf/task/mt.yaml)")
        optimizer = instantiate(self.optim_cfg)(self.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt(self.scheduler_cfg["warmup_steps"]))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _task_tokenizer(cfg):
    """The tokenizer of a saved/pretrained model, ``model.tokenizer``, the run's own, or None (train one)."""
    pretrained = cfg.model.get("pretrained")
    is_ckpt = bool(pretrained) and str(pretrained).endswith(".ckpt")
    if pretrained and not is_ckpt and (has_tokenizer(pretrained) or not Path(str(pretrained)).exists()):
        return load_tokenizer(pretrained)  # a saved run dir with its tokenizer, or a hub name
    if cfg.model.get("tokenizer"):
        return load_tokenizer(cfg.model.tokenizer)
    if is_ckpt:
        run_dir = Path(pretrained).resolve().parent.parent  # <run>/checkpoints/x.ckpt -> <run>
        candidates = [run_dir / "tokenizer", run_dir / "model"]
    elif cfg.get("ckpt_path"):
        candidates = [Path(cfg.paths.output_dir) / "tokenizer"]  # resuming: reuse this run's tokenizer
    else:
        candidates = []
    for candidate in candidates:
        if has_tokenizer(candidate):
            return load_tokenizer(candidate)
    if pretrained and not (cfg.data.tokenizer.get("path") and has_tokenizer(cfg.data.tokenizer.path)):
        raise FileNotFoundError(
            f"model.pretrained={pretrained} comes without a tokenizer: looked in {[str(c) for c in candidates] or pretrained}; "
            "set model.tokenizer=<dir> (or data.tokenizer.path) to the tokenizer it was trained with"
        )
    return None


def load_translation_task(cfg) -> TranslationModule:
    """The TranslationModule (datamodule at ``.data``) of a Hydra config; ``model.pretrained`` may be a saved dir, a hub name or a .ckpt."""
    from headprune.tasks.registry import build_task_model

    data = TranslationDataModule(cfg.data, tokenizer=_task_tokenizer(cfg), seed=int(cfg.seed))
    tokenizer = data.build_tokenizer()
    pretrained = cfg.model.get("pretrained")
    if pretrained and not str(pretrained).endswith(".ckpt"):
        model = build_task_model(cfg.model, seed=int(cfg.seed))
    else:
        fresh = OmegaConf.merge(cfg.model, {"pretrained": None})
        model = build_task_model(fresh, vocab_size=len(tokenizer), seed=int(cfg.seed), **special_ids(tokenizer))
        if pretrained:
            from headprune.lightning.trainer import read_training_checkpoint

            state = read_training_checkpoint(pretrained)["state_dict"]
            try:
                model.load_state_dict({k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")})
            except RuntimeError as err:
                raise ValueError(f"checkpoint {pretrained} does not fit model={cfg.model.get('name')} with this tokenizer: {err}") from err
    model.generation_config.max_length = None  # max_new_tokens is set per batch
    module = TranslationModule(model, tokenizer, data, cfg.get("task"), cfg.get("optim"), cfg.get("scheduler"))
    module.model.eval()
    return module


def train(cfg) -> dict:
    """experiment=mt_train: train, validate (greedy BLEU), save, then beam-search BLEU on the test split."""
    from headprune.lightning.trainer import fit
    from headprune.results.writer import output_dir, update_results, write_json_atomic

    module = load_translation_task(cfg)  # fit() switches the module to train mode
    data = module.data
    out = output_dir(cfg)
    if not cfg.model.get("pretrained"):
        data.build_tokenizer().save_pretrained(str(out / "tokenizer"))
    metrics = fit(cfg, module, data)
    if module.trainer is not None and not module.trainer.is_global_zero:
        return metrics
    final = module.evaluate(split="eval")
    split = split_of(cfg.data, "eval")
    metrics.update({f"{split}/bleu": final.score, f"{split}/beam_size": int(module.task_cfg["beam_size"])})
    print(f"{split} BLEU (beam {module.task_cfg['beam_size']}): {final.score:.2f} on {final.n} sentences")
    update_results(out / "results.json", metrics, OmegaConf.to_container(cfg, resolve=True))
    write_json_atomic(out / f"translations.{split}.json", {"hypotheses": final.per_example["hypotheses"], "bleu": final.score})
    metrics["objective"] = metrics.get("val/bleu")
    return metrics
