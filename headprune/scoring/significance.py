"""Paired significance tests between a baseline and masked systems (bootstrap, Koehn 2004), and correlations."""

import logging
import os
from dataclasses import dataclass
from unittest.mock import patch

import numpy as np


@dataclass
class PairedResult:
    """The observed difference system - baseline, its p-value and a 95% bootstrap interval of the difference."""

    score: float
    baseline: float
    delta: float
    p_value: float
    significant: bool
    ci_low: float
    ci_high: float


def _bootstrap_results(base_score, scores, base_resampled, resampled, alpha: float) -> list[PairedResult]:
    """Each system's PairedResult from its score, the resampled scores (R,) and (R, S), and the 95% interval of the difference."""
    out = []
    for s, score in enumerate(scores):
        delta = float(score) - float(base_score)
        diffs = resampled[:, s] - base_resampled
        centred = np.abs(diffs) - np.abs(diffs).mean()  # Moses/sacrebleu p-value: centred absolute resample differences vs |delta|
        # no observed difference is never significant (the centred count alone would say p = 1/(R+1))
        p = 1.0 if delta == 0.0 else float((np.sum(centred > abs(delta)) + 1) / (len(diffs) + 1))
        lo, hi = np.percentile(diffs, [2.5, 97.5])
        out.append(PairedResult(float(score), float(base_score), delta, p, bool(p < alpha), float(lo), float(hi)))
    return out


def _resample_counts(n: int, n_samples: int, seed: int) -> np.ndarray:
    """(R, N) how often each example is drawn in each of R resamples with replacement (shared by every system)."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_samples, n))  # (R, N)
    # sums over resampled examples via counts: (R, N) counts @ (N,) is exact and cheaper than fancy indexing; resample r's
    # draw of example j counts in cell r * N + j of the flat counts
    return np.bincount((np.arange(n_samples)[:, None] * n + idx).ravel(), minlength=n_samples * n).reshape(n_samples, n).astype(np.float64)


def paired_bootstrap_accuracy(
    baseline_correct, systems_correct, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01
) -> list[PairedResult]:
    """Paired bootstrap on per-example correctness (0/1): one result per system, accuracy in percent."""
    return paired_bootstrap_mean(baseline_correct, systems_correct, n_samples, seed, alpha, scale=100.0)


def paired_bootstrap_mean(
    baseline_values, systems_values, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01, scale: float = 1.0
) -> list[PairedResult]:
    """Paired bootstrap of the mean of per-example values (times ``scale``): one result per system."""
    base = np.asarray(baseline_values, dtype=np.float64)
    systems = np.asarray(systems_values, dtype=np.float64).reshape(-1, base.shape[0])  # (S, N)
    if base.size == 0:
        raise ValueError("paired bootstrap needs at least one evaluated example")
    counts = _resample_counts(base.shape[0], n_samples, seed)
    base_scores = scale * counts @ base / base.shape[0]  # (R,)
    sys_scores = scale * counts @ systems.T / base.shape[0]  # (R, S)
    return _bootstrap_results(scale * base.mean(), scale * systems.mean(1), base_scores, sys_scores, alpha)


def paired_bootstrap_perplexity(
    baseline_nll, baseline_tokens, systems_nll, systems_tokens, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01
) -> list[PairedResult]:
    """Paired bootstrap on per-text (NLL sum, token count): corpus perplexity exp(sum NLL / sum tokens) of each resample."""
    base_nll, base_tok = np.asarray(baseline_nll, dtype=np.float64), np.asarray(baseline_tokens, dtype=np.float64)
    if base_nll.size == 0:
        raise ValueError("paired bootstrap needs at least one evaluated text")
    sys_nll = np.asarray(systems_nll, dtype=np.float64).reshape(-1, base_nll.shape[0])  # (S, N)
    sys_tok = np.asarray(systems_tokens, dtype=np.float64).reshape(-1, base_nll.shape[0])
    counts = _resample_counts(base_nll.shape[0], n_samples, seed)
    base_scores = np.exp(counts @ base_nll / (counts @ base_tok))  # (R,)
    sys_scores = np.exp(counts @ sys_nll.T / (counts @ sys_tok.T))  # (R, S)
    scores = np.exp(sys_nll.sum(1) / sys_tok.sum(1))
    return _bootstrap_results(np.exp(base_nll.sum() / base_tok.sum()), scores, base_scores, sys_scores, alpha)


def paired_bootstrap_bleu(
    baseline_hyps, systems_hyps, references, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01, tokenize: str | None = None
) -> list[PairedResult]:
    """sacrebleu's paired bootstrap (``PairedTest(test_type='bs')``) of each system against the baseline."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not references:
        raise ValueError("paired bootstrap needs at least one evaluated sentence")
    seed = seed if seed else 12345  # sacrebleu treats seed 0 as "unseeded"
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # one INFO line per system otherwise
    named = [("baseline", list(baseline_hyps))] + [(f"sys{i}", list(h)) for i, h in enumerate(systems_hyps)]
    metric = BLEU(tokenize=tokenize) if tokenize else BLEU()
    with patch.dict(os.environ, {"SACREBLEU_SEED": str(seed)}):  # restored after, set or not
        test = PairedTest(named, {"BLEU": metric}, [list(references)], test_type="bs", n_samples=n_samples)
        _, scores = test()
    results = scores["BLEU"]
    base = results[0].score
    out = []
    for res in results[1:]:
        delta = res.score - base
        p = 1.0 if delta == 0.0 else float(res.p_value)
        low, high = float(delta - res.ci), float(delta + res.ci)  # sacrebleu's 95% half-width is of the system score; around delta
        out.append(PairedResult(float(res.score), float(base), float(delta), p, bool(p < alpha), low, high))
    return out


def correlation(first: dict, second: dict) -> dict:
    """Pearson r between the per-head differences of two ablation results (paper section 3.4)."""
    a = np.concatenate([np.asarray(first["delta"][g], dtype=float).ravel() for g in first["delta"]])
    b = np.concatenate([np.asarray(second["delta"][g], dtype=float).ravel() for g in first["delta"]])
    if a.std() == 0 or b.std() == 0:
        return {"pearson_r": float("nan"), "p_value": float("nan"), "splits": [first["split"], second["split"]]}
    from scipy.stats import pearsonr

    r, p = pearsonr(a, b)
    return {"pearson_r": float(r), "p_value": float(p), "splits": [first["split"], second["split"]]}
