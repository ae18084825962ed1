"""LanguageModelingTask: perplexity of a decoder-only LLM on texts, with head gates on its attention."""

import math
import random
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from headprune.core.inputs import DECODER_INPUTS, eval_mode
from headprune.core.units import model_gates
from headprune.engine.ablation_causal import output_logits
from headprune.results.writer import texts_fingerprint
from headprune.tasks.base import EvalResult, TimedCall, rows_of
from headprune.tasks.common import SharedTaskMethods, checked_settings, drawn_groups
from headprune.tasks.lm.data import LMData, load_texts, long_documents, text_pools

TASK_SETTINGS = ("mask_chunk", "selection_split", "decode_tokens", "decode_prompt_tokens")  # task.* besides name (conf/task/lm.yaml)
HEAD_ROWS = 8  # texts whose (T, V) logits exist at once: the vocabulary projection runs in row chunks


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(NLL sum (B,), predicted tokens (B,)) from logits (B, T, V) and next-token labels (B, T) with -100 ignored."""
    # log-softmax over the contiguous vocabulary axis: (B*T, V), not a (B, V, T) view, whose float32 sums over
    # 49,152 words are off by up to 1e-4 nats per token (headprune.engine.ablation_causal.label_stats rounds the same way)
    nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="none")
    return nll.view_as(labels).double().sum(1), (labels != -100).sum(1)


class LanguageModelingTask(SharedTaskMethods):
    """A causal LM under head gates and its texts: the task protocol of headprune.tasks.base (metric: perplexity)."""

    name = "lm"
    metric = "perplexity"
    higher_is_better = False
    across_tokenizers = "bits_per_byte"  # the measure that compares models whose tokenizers split the text otherwise
    paired_test_name = "paired bootstrap of corpus perplexity over texts (Koehn 2004)"
    sort_training = True  # training batches of texts of similar lengths
    empty_importance = (
        "the importance split holds no text of two tokens or more: check data.files.importance "
        "(one text per line) and data.limits.importance"
    )

    def __init__(
        self,
        model,
        tokenizer,
        data: LMData,
        mask_chunk: int = 8,
        selection_split: str = "importance",
        decode_tokens: int = 32,
        decode_prompt_tokens: int = 16,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.data = data
        self.gates = model_gates(model)
        self.mask_chunk = max(1, int(mask_chunk))  # task.* are checked before work (headprune.tasks.lm.config_check)
        self.selection_split = str(selection_split)  # the split for choices such as keep-one's head (never eval)
        self.decode_tokens = int(decode_tokens)
        self.decode_prompt_tokens = int(decode_prompt_tokens)
        model.eval()

    def to(self, device) -> "LanguageModelingTask":
        self.model.to(device)
        return self

    def _inputs(self, batch: dict, *extra: str) -> dict:
        """The model inputs of a batch (and ``extra`` keys such as labels) on the model's device."""
        return {k: batch[k].to(self.model_device) for k in (*DECODER_INPUTS, *extra)}

    @contextmanager
    def split_by(self, split_row, tokenizer, splits: list[str]):
        """Within: ``splits`` hold their texts split again by ``split_row`` into ``tokenizer``'s ids (a pruned vocabulary's own)."""
        own = self.data, self.tokenizer
        self.data, self.tokenizer = self.data.split_again(split_row, tokenizer, splits), tokenizer
        try:
            yield self
        finally:
            self.data, self.tokenizer = own

    def split_sizes(self) -> dict[str, int]:
        """{split: rows} (texts shorter than one predicted token are left out; passkey: examples)."""
        return {split: len(rows) for split, rows in self.data.rows.items()}

    def data_fingerprint(self, split: str) -> str:
        """A hash of the texts of ``split``."""
        self.data.split(split)
        return texts_fingerprint(self.data.texts[split])

    STAT_COLUMNS = 1  # per-example columns evaluate_many collects: the NLL sum

    def _engine_stats(self, engine, inputs: dict, masks: list) -> torch.Tensor:
        """The per-example columns (M, B, STAT_COLUMNS) of a batch under every mask, from the batched engine."""
        return engine.nll(inputs, masks).unsqueeze(-1)

    def _forward_stats(self, batch: dict) -> torch.Tensor:
        """The NLL sum per row (B, STAT_COLUMNS) of one forward under the gates as they are, the logits of ``HEAD_ROWS`` rows at a time."""
        hidden = self.model.base_model(**self._inputs(batch)).last_hidden_state  # (B, T, D)
        head = output_logits(self.model)  # the LM head and the model's own logit scaling or soft-capping
        labels = batch["labels"].to(hidden.device)
        sums = [token_nll(head(hidden[i : i + HEAD_ROWS]), labels[i : i + HEAD_ROWS])[0] for i in range(0, len(hidden), HEAD_ROWS)]
        return torch.cat(sums).unsqueeze(-1)  # a large vocabulary's (T, V) logits of every row at once would not fit

    def _result(self, stats: torch.Tensor, tokens: torch.Tensor) -> EvalResult:
        """The EvalResult of per-example NLL sums (N, 1) and tokens (N,)."""
        nll = stats[:, 0]
        return EvalResult(
            score=float(torch.exp(nll.sum() / max(int(tokens.sum()), 1))),  # corpus perplexity: exp(NLL per predicted token)
            metric=self.metric,
            n=len(nll),
            per_example={"nll": nll.tolist(), "tokens": tokens.tolist()},
            loss=float((nll / tokens.clamp(min=1)).mean()),  # the mean over texts of each text's NLL per token
        )

    def evaluate(self, mask=None, split: str = "eval", batch_size: int | None = None, on_batch=None) -> EvalResult:
        """Corpus perplexity on ``split`` under ``mask``; per_example: each text's NLL sum and tokens; ``on_batch(n)`` after each batch."""
        return self.evaluate_many([mask], split, on_batch=on_batch, batch_size=batch_size)[0]

    @torch.no_grad()
    def evaluate_many(
        self, masks: list, split: str = "eval", on_batch=None, batched: bool = True, batch_size: int | None = None
    ) -> list[EvalResult]:
        """The score of each mask, several masks per forward pass (CausalMaskBatcher, else ``mask_chunk`` masks per repeated batch)."""
        from headprune.engine.ablation_causal import CausalMaskBatcher, batchable

        if not masks:
            return []
        ones = self.gates.ones()
        masks = [{**ones, **(self.gates.normalize_mask(m) if m is not None else {})} for m in masks]  # None = all heads
        engine = CausalMaskBatcher(self.model, self.gates) if batched and len(masks) > 1 and batchable(self.gates, masks) else None
        n = len(self.data.split(split))
        stats = torch.zeros(len(masks), n, self.STAT_COLUMNS, dtype=torch.float64)
        tokens = torch.zeros(n, dtype=torch.long)
        with eval_mode(self.model):
            for batch in self.data.batches(split, batch_size):
                rows = batch["idx"]
                tokens[rows] = (batch["labels"] != -100).sum(1)
                if engine is not None:
                    stats[:, rows] = self._engine_stats(engine, self._inputs(batch, "labels"), masks)
                else:
                    stats[:, rows] = self._repeated_stats(batch, masks)
                if on_batch is not None:
                    on_batch(len(rows))
        return [self._measured(self._result(stats[j], tokens), split) for j in range(len(masks))]

    def _measured(self, result: EvalResult, split: str) -> EvalResult:
        """``result`` with bits per byte and perplexity per byte of the text its tokens cover: comparable across vocabularies."""
        covered = sum(self.data.scored_bytes(split))
        nats_per_byte = sum(result.per_example["nll"]) / max(covered, 1)  # sum of token NLL (nats) over the UTF-8 bytes
        result.measures.update(bits_per_byte=nats_per_byte / math.log(2), perplexity_per_byte=math.exp(nats_per_byte))
        return result

    def _repeated_stats(self, batch: dict, masks: list) -> torch.Tensor:
        """The per-example columns (M, B, STAT_COLUMNS) of a batch: ``mask_chunk`` masks per forward, a mask per repeated row."""
        b, columns = len(batch["labels"]), self.STAT_COLUMNS
        out = torch.zeros(len(masks), b, columns, dtype=torch.float64)
        for start in range(0, len(masks), self.mask_chunk):
            group = masks[start : start + self.mask_chunk]
            k = len(group)
            stacked = {g: torch.stack([m[g] for m in group]).repeat_interleave(b, dim=0) for g in group[0]}  # (k*B, L, H)
            repeated = {key: batch[key].repeat(k, 1) for key in (*DECODER_INPUTS, "labels")}  # row j*B + b: text b, mask j
            with self.gates.masked(stacked):
                out[start : start + k] = self._forward_stats(repeated).cpu().view(k, b, columns)
        return out

    def paired_test(
        self, baseline: EvalResult, systems: list[EvalResult], n_samples: int = 1000, seed: int = 0, alpha: float = 0.01
    ) -> list:
        """Paired bootstrap of corpus perplexity (resampling texts) of each system against the baseline."""
        from headprune.scoring.significance import paired_bootstrap_perplexity

        return paired_bootstrap_perplexity(
            baseline.per_example["nll"],
            baseline.per_example["tokens"],
            [s.per_example["nll"] for s in systems],
            [s.per_example["tokens"] for s in systems],
            n_samples=n_samples,
            seed=seed,
            alpha=alpha,
        )

    def importance_batches(self, batch_size: int | None = None):
        """Batches (inputs + next-token labels, on the model's device) of the importance split (training data)."""
        if not self.split_sizes().get("importance"):
            raise ValueError(self.empty_importance)
        for batch in self.data.batches("importance", batch_size or self.data.batch_size):
            yield self._inputs(batch, "labels")

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """``examples`` training rows drawn with ``seed``, batched in a seeded order (``sort_training``: similar lengths); ``idx``: each row's position."""
        rows = self.data.split("train" if "train" in self.split_sizes() else "importance")
        length = (lambda i: len(rows[i])) if self.sort_training else None
        groups = drawn_groups(len(rows), examples, seed, int(self.data.batch_size), length)
        return [{**self._to_device(self.data.collate_rows([rows[i] for i in group])), "idx": torch.tensor(group)} for group in groups]

    def split_summary(self) -> dict[str, dict[str, int]]:
        """{split: {"examples" (texts), "tokens", "predicted_tokens"}} of every split, as tokenized (BOS included, truncated)."""
        return self.data.split_summary()

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Mean token NLL of each text, shape (B,)."""
        logits = self.model(**self._inputs(batch)).logits
        nll, tokens = token_nll(logits, batch["labels"].to(logits.device))
        return (nll / tokens.clamp(min=1)).to(logits.dtype)

    def token_rows(self, split: str) -> list[list[int]]:
        """Each text's token ids (BOS included, truncated as evaluated)."""
        return self.data.split(split)

    def timing_batches(self, batch_size: int, examples: int, split: str = "eval", seed: int = 0) -> list[dict]:
        """``examples`` texts of ``split`` drawn with ``seed`` (with replacement past the split's size), in batches."""
        rows = self.data.split(split)
        rng = random.Random(f"timing-{seed}")
        chosen = [rows[rng.randrange(len(rows))] for _ in range(int(examples))]
        size = int(batch_size)
        return [self._inputs(self._timed_batch(chosen[at : at + size])) for at in range(0, len(chosen), size)]

    def _timed_batch(self, rows: list) -> dict:
        """One timing batch of split rows (texts, padded)."""
        return self.data.collate_rows(rows)

    @torch.no_grad()
    def timed_call(self, batch: dict) -> None:
        """The prefill forward of generation: the whole prompt, filling the KV cache, logits of the last position only."""
        self.model(**batch, use_cache=True, logits_to_keep=1)

    def _prompt_length(self, batch: dict) -> int:
        """Prompt tokens of a decode call: ``decode_prompt_tokens``, at most the shortest text (no padding in the prompt)."""
        return max(1, min(self.decode_prompt_tokens, int(batch["attention_mask"].sum(1).min())))

    @torch.no_grad()
    def timed_decode(self, batch: dict) -> None:
        """Greedy generation of exactly ``decode_tokens`` new tokens with the KV cache after each text's first tokens."""
        from headprune.engine.timing import budget_cut, seconds_left

        prompt = batch["input_ids"][:, : self._prompt_length(batch)]
        out = self.model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=self.decode_tokens,
            min_new_tokens=self.decode_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=self.data.pad_id,
            max_time=seconds_left(),
        )
        if out.shape[1] - prompt.shape[1] < self.decode_tokens:
            budget_cut()

    def timed_calls(self) -> dict[str, TimedCall]:
        """Prefill (prompt tokens/s, one forward filling the KV cache) and decode (new tokens/s, greedy with the cache)."""

        def decode_span(batch):
            start = self._prompt_length(batch)
            return start, start + self.decode_tokens

        return {
            "prefill": TimedCall(self.timed_call, "tokens", lambda b: int(b["attention_mask"].sum())),  # span: the whole prompt
            "decode": TimedCall(self.timed_decode, "new tokens", lambda b: rows_of(b) * self.decode_tokens, decode_span),
        }

    def memory_measures(self, model) -> dict[str, int]:
        """KV-cache bytes per token of context: as the model holds it, and without the phantom KV heads of emptied layers."""
        from headprune.core.counting import kv_cache_bytes_per_token

        return {
            "kv_cache_bytes_per_token": kv_cache_bytes_per_token(model),
            "kv_cache_bytes_per_token_ideal": kv_cache_bytes_per_token(model, ideal=True),
        }


def load_lm_task(cfg) -> LanguageModelingTask:
    """The texts and LanguageModelingTask of a Hydra config (``model.kind=causal_lm``, ``data=lm_*``)."""
    settings = causal_lm_settings(cfg, "lm", "language-modelling", "data=lm_local (../shared/data), data=lm_synthetic or data=lm_hub")
    if cfg.data.get("document_tokens") is None:
        texts = load_texts(cfg.data)
        model, tokenizer = model_and_tokenizer(cfg, texts["importance"])
    else:  # long documents: joined in the model's tokens, then drawn
        pools = text_pools(cfg.data)
        model, tokenizer = model_and_tokenizer(cfg, [text for _, text in pools["importance"]])
        texts = long_documents(cfg.data, pools, tokenizer)
    return LanguageModelingTask(model, tokenizer, lm_data(cfg, texts, tokenizer), **settings)


def lm_data(cfg, texts: dict[str, list[str]], tokenizer) -> LMData:
    """``texts`` tokenized and batched as ``data.*`` says (lengths, batch sizes, BOS / EOS, ``model.text_start``)."""
    batching = {key: cfg.data[key] for key in ("max_length", "batch_size", "eval_batch_size", "add_bos", "add_eos")}
    return LMData(texts, tokenizer, **batching, bos_id=text_start(cfg, tokenizer))


def causal_lm_settings(cfg, data_kind: str, task: str, data_choices: str) -> dict:
    """``task.*`` (conf/task/lm.yaml) of a causal LM task reading data of ``data_kind``; a ValueError when model or data is another's."""
    if cfg.get("data") is None or cfg.data.get("kind") != data_kind:
        raise ValueError(f"the {task} task needs {data_choices}")
    if cfg.model.get("kind") != "causal_lm":
        raise ValueError(f"the {task} task needs a causal LM (model.kind=causal_lm), got model={cfg.model.get('name')}")
    return checked_settings(cfg, TASK_SETTINGS, task, "conf/task/lm.yaml")


def model_and_tokenizer(cfg, training_texts: list[str]):
    """(causal LM, tokenizer) of ``cfg.model``: its own tokenizer, or for a fresh model a BPE tokenizer trained on ``training_texts``."""
    from headprune.models.build import build_tokenizer
    from headprune.models.tokenizers import special_ids, train_tokenizer
    from headprune.tasks.registry import build_task_model

    if cfg.model.get("tokenizer"):
        return build_task_model(cfg.model, seed=int(cfg.seed)), build_tokenizer(cfg.model)
    if cfg.model.get("pretrained"):
        raise ValueError(f"model.pretrained={cfg.model.pretrained} needs model.tokenizer (usually the same directory)")
    tokenizer = train_tokenizer(training_texts, vocab_size=int(cfg.data.tokenizer.vocab_size))
    ids = {k: v for k, v in special_ids(tokenizer).items() if k in ("pad_token_id", "eos_token_id", "bos_token_id")}
    return build_task_model(cfg.model, vocab_size=len(tokenizer), seed=int(cfg.seed), **ids), tokenizer


def text_start(cfg, tokenizer) -> int | None:
    """The id of ``model.text_start`` (the token the model saw before each document), else the tokenizer's BOS (None: it has none)."""
    token = cfg.model.get("text_start")
    if token is None:
        return tokenizer.bos_token_id
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id and token != tokenizer.unk_token:
        raise ValueError(f"model.text_start={token!r} is not a token of the {cfg.model.get('name')} tokenizer")
    return int(token_id)
