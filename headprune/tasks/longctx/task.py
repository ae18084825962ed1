"""PasskeyTask: long-context retrieval (a key hidden in a haystack) by a decoder-only LLM under head gates."""

import torch

from headprune.engine.ablation_causal import output_logits, row_label_stats
from headprune.results.writer import texts_fingerprint
from headprune.tasks.base import EvalResult
from headprune.tasks.lm.data import collate as collate_prompts
from headprune.tasks.lm.task import LanguageModelingTask, causal_lm_settings, model_and_tokenizer, text_start
from headprune.tasks.longctx.config import PasskeyConfig
from headprune.tasks.longctx.data import PasskeyData
from headprune.tasks.longctx.examples import generate
from headprune.tasks.longctx.haystack import haystack_pools

METRICS = {"accuracy": "correct", "key_log_likelihood": "loglik"}  # data.metric -> the per-example values it averages


class PasskeyTask(LanguageModelingTask):
    """A causal LM under head gates and its passkey examples: the task protocol of headprune.tasks.base."""

    name = "passkey"
    higher_is_better = True
    sort_training = False  # training batches in the drawn order
    empty_importance = "the importance split holds no passkey example: set data.sizes.importance to a number of examples"
    split_by = None  # an answer's labels sit at token positions: its examples are not split again by another tokenizer

    def __init__(self, model, tokenizer, data: PasskeyData, metric: str, **settings):
        super().__init__(model, tokenizer, data, **settings)
        if metric not in METRICS:
            raise ValueError(f"data.metric must be one of {sorted(METRICS)}, got {metric!r}")
        self.metric = metric
        self.paired_test_name = f"paired bootstrap of mean {METRICS[metric]} over examples (Koehn 2004)"

    def data_fingerprint(self, split: str) -> str:
        """A hash of the token ids of ``split``'s examples."""
        return texts_fingerprint(self.data.fingerprint_texts(split))

    STAT_COLUMNS = 2  # per-example columns evaluate_many collects: the answer's NLL sum, its tokens the argmax misses

    def _engine_stats(self, engine, inputs: dict, masks: list) -> torch.Tensor:
        """(NLL sum, misses) (M, B, 2) of a batch under every mask, from the batched engine."""
        return engine.label_stats(inputs, masks)

    def _forward_stats(self, batch: dict) -> torch.Tensor:
        """(NLL sum, answer tokens missed by the argmax) per row (B, 2), the vocabulary projected at answer positions only."""
        hidden = self.model.base_model(**self._inputs(batch)).last_hidden_state  # (B, T, D)
        return row_label_stats(hidden, batch["labels"].to(hidden.device), output_logits(self.model))

    def needed_token_ids(self) -> list[int]:
        """The ids every split's prompts and answers use outside the filler (intro, needles, question, answer): a vocabulary floor."""
        ids = set()
        for examples in self.data.rows.values():
            for example in examples:
                start, end = example.haystack
                ids.update(example.ids[:start], example.ids[end:])
                for needle_start, needle_end in example.needles:
                    ids.update(example.ids[needle_start:needle_end])
        return sorted(ids)

    def _measured(self, result: EvalResult, split: str) -> EvalResult:
        """The result as it is: an answer's log-likelihood has no text of its own to count bytes of."""
        return result

    def _result(self, stats: torch.Tensor, tokens: torch.Tensor) -> EvalResult:
        """The EvalResult of (NLL sum, misses) per example (N, 2) and answer tokens (N,)."""
        loglik = -stats[:, 0] / tokens.clamp(min=1)
        correct = (stats[:, 1] == 0).long()
        values = {"correct": correct.tolist(), "loglik": loglik.tolist()}
        mean = torch.tensor(values[METRICS[self.metric]], dtype=torch.float64).mean()
        return EvalResult(
            score=float(100.0 * mean if self.metric == "accuracy" else mean),
            metric=self.metric,
            n=len(tokens),
            per_example=values,
            loss=float(-loglik.mean()),
        )

    def paired_test(
        self, baseline: EvalResult, systems: list[EvalResult], n_samples: int = 1000, seed: int = 0, alpha: float = 0.01
    ) -> list:
        """Paired bootstrap (resampling examples) of the metric of each system against the baseline."""
        from headprune.scoring.significance import paired_bootstrap_mean

        key = METRICS[self.metric]
        return paired_bootstrap_mean(
            baseline.per_example[key],
            [s.per_example[key] for s in systems],
            n_samples=n_samples,
            seed=seed,
            alpha=alpha,
            scale=100.0 if self.metric == "accuracy" else 1.0,
        )

    def retrieval_batches(self, split: str = "importance", batch_size: int | None = None) -> list[dict]:
        """Batches with each answer token's needle span, on the model's device: what ``retrieval_heads.retrieval_scores`` reads."""
        return [self._to_device(batch) for batch in self.data.batches(split, batch_size or self.data.batch_size, copies=True)]

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Mean NLL of each example's answer tokens, shape (B,) (the vocabulary projected at answer positions only)."""
        hidden = self.model.base_model(**self._inputs(batch)).last_hidden_state  # (B, T, D)
        labels = batch["labels"].to(hidden.device)
        keep = labels != -100
        logits = output_logits(self.model)(hidden[keep]).float()  # (N, V)
        nll = torch.nn.functional.cross_entropy(logits, labels[keep], reduction="none")
        sums = torch.zeros(len(labels), dtype=nll.dtype, device=nll.device).index_add(0, keep.nonzero()[:, 0], nll)
        return (sums / keep.sum(1).clamp(min=1)).to(hidden.dtype)

    def _timed_batch(self, rows: list) -> dict:
        """One timing batch of examples: their prompts (the answers left out)."""
        return collate_prompts([list(e.ids[: e.answer_start]) for e in rows], self.data.pad_id)


def load_passkey_task(cfg) -> PasskeyTask:
    """The passkey examples and PasskeyTask of a Hydra config (``model.kind=causal_lm``, ``data=passkey_*``)."""
    choices = "data=passkey_synthetic, data=passkey_local (../shared/data) or data=passkey_hub"
    settings = causal_lm_settings(cfg, "passkey", "passkey", choices)
    config = PasskeyConfig.from_cfg(cfg.data)
    pools = haystack_pools(config)
    model, tokenizer = model_and_tokenizer(cfg, tokenizer_texts(config, pools))
    examples = generate(config, tokenizer, text_start(cfg, tokenizer), pools)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    data = PasskeyData(examples, pad_id, config.batch_size, config.eval_batch_size)
    return PasskeyTask(model, tokenizer, data, config.metric, **settings)


def tokenizer_texts(config: PasskeyConfig, pools: dict[str, list[str]]) -> list[str]:
    """What a fresh model's tokenizer is trained on: the training haystack and the template words with every digit."""
    haystack = pools.get("importance") or next(iter(pools.values()))
    words = [str(v) for v in vars(config.template).values()] + list(config.names) + ["0123456789"]
    return list(haystack) + words
