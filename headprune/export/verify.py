"""Check an export in a fresh interpreter that cannot import headprune: its outputs against the masked model's (the reference)."""

import copy
import json
import os
import site
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from headprune.core.units import model_gates, prune_unit_mask, unit_gates
from headprune.export import FORMATS
from headprune.export.checker import FAILURES
from headprune.export.gguf import rounded_like_gguf

CHECKER = Path(__file__).with_name("checker.py")
TOLERANCE = 1e-5  # f32: largest |export - reference| over the logits' scale (at least 1): the floor of the tolerance
# |export - reference| <= |export - exact| + |reference - exact|: another f32 implementation (the numpy reader of deci
# files, llama.cpp) rounds up to a few times as much as PyTorch (2x on SmolLM2's recovered point: 2.0e-3 against 1.1e-3),
# so the tolerance is this many times the largest f32 round-off of PyTorch measured against float64.
ROUNDOFF_MULTIPLE = 8.0


def site_packages() -> list[str]:
    """The interpreter's site-packages directories (where torch, transformers, onnxruntime and gguf live)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return list(dict.fromkeys(p for p in paths if Path(p).is_dir()))


def is_decoder_lm(model: nn.Module) -> bool:
    """A decoder-only model that generates (its greedy tokens are checked too)."""
    return model.can_generate() and not getattr(model.config, "is_encoder_decoder", False)


@torch.no_grad()
def reference_logits(model: nn.Module, batches: list[dict]) -> list[np.ndarray]:
    """The model's logits (float32) on each batch, moved to its device: call it under the mask (``gates.masked``) for the masked reference."""
    model.eval()
    device = next(model.parameters()).device
    return [model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu().numpy() for batch in batches]


@torch.no_grad()
def exact_logits(model: nn.Module, batches: list[dict]) -> list[np.ndarray]:
    """The logits of a float64 CPU copy of ``model`` on each batch (floating inputs in float64 too): what f32 rounds."""
    exact = copy.deepcopy(model).to("cpu", torch.float64).eval()
    out = []
    for batch in batches:
        inputs = {k: v.cpu().double() if v.is_floating_point() else v.cpu() for k, v in batch.items()}
        by_rows = is_decoder_lm(model) and right_padded(inputs.get("attention_mask"))
        out.append(unpadded_logits(exact, inputs) if by_rows else exact(**inputs).logits.numpy())
    del exact
    return out


def right_padded(mask: torch.Tensor | None) -> bool:
    """Whether an attention mask (B, T) pads some row, every row on the right (its ones, then its zeros)."""
    if mask is None or bool(mask.all()):
        return False
    return bool(mask.eq(torch.arange(mask.shape[1]) < mask.sum(1, keepdim=True)).all())


def unpadded_logits(exact: nn.Module, inputs: dict) -> np.ndarray:
    """A decoder-only LM's logits (B, T, V) on right-padded rows, each row run alone without its padding (NaN there).

    Run padded, a float64 Gemma 2 gives NaN: its eager attention takes the softmax in float32, where the float64 mask's
    minimum is -inf, so a padded query whose sliding window holds only padding has no finite score, and the next layer's
    0 x NaN carries that NaN to every position of its row. A causal row's real positions never read its right padding.
    """
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    out = None
    for row, length in enumerate(mask.sum(1).tolist()):
        if length == 0:
            continue
        logits = exact(input_ids=ids[row : row + 1, :length], attention_mask=mask[row : row + 1, :length]).logits[0]  # (T', V)
        if out is None:
            out = np.full((*ids.shape, logits.shape[-1]), np.nan)
        out[row, :length] = logits.numpy()
    return out


def f32_roundoff(computed: list[list[np.ndarray]], exact: list[np.ndarray]) -> float:
    """The largest |f32 logits - float64 logits| over every f32 computation in ``computed`` (each a list of batches).

    Positions the float64 logits leave NaN (a row's right padding, see ``unpadded_logits``) are left out.
    """
    roundoff = max(float(np.nanmax(np.abs(c.astype(np.float64) - e))) for logits in computed for c, e in zip(logits, exact))
    if not np.isfinite(roundoff):
        raise ValueError(f"the f32 round-off of the export check is {roundoff}: the float64 or f32 logits of the reference are not finite")
    return roundoff


def greedy_prompt(batches: list[dict], rows: int = 4, length: int = 8) -> torch.Tensor:
    """Unpadded prompts (B, T) for the greedy check: the first tokens of the first texts, cut to the shortest."""
    batch = batches[0]
    ids, mask = batch["input_ids"][:rows], batch.get("attention_mask", torch.ones_like(batch["input_ids"]))[:rows]
    keep = max(1, min(length, int(mask.sum(1).min())))
    return ids[:, :keep].cpu()


def eos_and_pad(model: nn.Module) -> tuple[list[int], int]:
    """The EOS ids (a list) and the pad id greedy generation stops with and fills in."""
    config = model.generation_config
    eos = config.eos_token_id if config.eos_token_id is not None else model.config.eos_token_id
    eos = [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    pad = config.pad_token_id if config.pad_token_id is not None else model.config.pad_token_id
    return eos, int(pad if pad is not None else (eos[0] if eos else 0))


@torch.no_grad()
def greedy_tokens(model: nn.Module, prompt: torch.Tensor, new_tokens: int, suppress: list[int] | None = None) -> np.ndarray:
    """The new tokens of plain greedy generation (stopping at EOS, padding finished rows, never a ``suppress`` id): call it under the mask."""
    from transformers import GenerationConfig

    eos, pad = eos_and_pad(model)
    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad)
    if suppress:  # removed token ids: the masked model gives them logit 0, the export no logit at all
        config.suppress_tokens = list(suppress)
    device = next(model.parameters()).device
    ids = prompt.to(device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[:, prompt.shape[1] :].cpu().numpy()


def sample_texts(tokenizer, batches: list[dict], rows: int = 4) -> dict:
    """Texts decoded from the first check rows and the model's own tokenizer's ids of them: the exported tokenizer must agree."""
    if tokenizer is None or not hasattr(tokenizer, "batch_decode"):  # no text: an image model's processor
        return {}
    texts = tokenizer.batch_decode(batches[0]["input_ids"][:rows].tolist(), skip_special_tokens=True)
    return {"texts": texts, "text_ids": [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]}


def check_export(
    job: dict,
    batches: list[dict],
    reference: list[np.ndarray],
    greedy: tuple | None = None,
    tolerance: float = TOLERANCE,
    timeout: float = 600.0,
) -> dict:
    """Run the checker on ``job`` (format, files or dir, auto_class, texts) in a fresh interpreter; its report (``passed``)."""
    return check_exports([(job, batches, reference, greedy)], tolerance, timeout)[0]


def check_exports(items: list[tuple], tolerance: float = TOLERANCE, timeout: float = 600.0) -> list[dict]:
    """``check_export`` of several (job, batches, reference, greedy) in one fresh interpreter; one report each."""
    with tempfile.TemporaryDirectory(prefix="headprune-check-") as folder:
        folder = Path(folder)
        jobs = []
        for i, (job, batches, reference, greedy) in enumerate(items):
            arrays = {f"reference{b}": r for b, r in enumerate(reference)}
            for b, batch in enumerate(batches):
                arrays.update({f"batch{b}.{k}": v.detach().cpu().numpy() for k, v in batch.items()})
            if greedy is not None:
                arrays.update(greedy_prompt=greedy[0].numpy(), greedy_tokens=greedy[1])
            np.savez(folder / f"arrays{i}.npz", **arrays)
            extra = {} if greedy is None else {"eos": greedy[2], "pad": greedy[3], "new_tokens": greedy[4]}
            jobs.append(
                {
                    **job,
                    **extra,
                    "arrays": str(folder / f"arrays{i}.npz"),
                    "batches": len(batches),
                    "tolerance": tolerance,
                    "input_names": sorted({k for batch in batches for k in batch}),
                    "site_packages": site_packages(),
                }
            )
        (folder / "jobs.json").write_text(json.dumps(jobs, default=str))
        command = [sys.executable, "-I", "-S", str(CHECKER), str(folder / "jobs.json")]
        offline = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HOME": os.environ.get("HOME", str(folder)),
            "HF_MODULES_CACHE": str(folder / "modules"),  # a checkpoint's own config class (DeciLM) is copied here, not to HOME
        }
        reports = run_fresh(command, folder, "the export check in its fresh interpreter", timeout, **offline)
    for report in reports:
        report["interpreter"] = f"{Path(sys.executable).name} -I -S (no headprune, cwd outside the project)"
    return reports


def check_line(report: dict) -> str:
    """The printed line of a check: the difference beside its tolerance and where the tolerance comes from, then the rest."""
    line = f"[export] check: max |export - masked| = {report['max_abs_diff']:.2e}, tolerance {report['tolerance']:.2e}"
    if report.get("f32_roundoff") is not None:
        multiple = report["tolerance_from_roundoff"] / report["f32_roundoff"] if report["f32_roundoff"] else 0.0
        line += (
            f" = max(floor {report['tolerance_floor']:.1e}, {multiple:g} x the f32 round-off {report['f32_roundoff']:.1e} "
            "measured on this model against float64)"
        )
    if "perplexity" in report:
        line += f"; perplexity {report['perplexity']:.6g} against {report['reference_perplexity']:.6g} (relative {report['perplexity_rel_diff']:.1e})"
    if "greedy_equal" in report:
        line += f"; greedy tokens equal: {report['greedy_equal']}"
    if "tokenizer_pre" in report:
        line += f"; pre-tokenizer {report['tokenizer_pre']} (expected {report['tokenizer_pre_expected']})"
    return line


def refusal_message(fmt: str, report: dict, staging: Path) -> str:
    """Why an export is refused, where its files are, and that the previous export and results.json are untouched."""
    failed = "; ".join(why for key, why in FAILURES.items() if report.get(key) is False)
    return (
        f"the {fmt} export does not reproduce the masked model: {failed} (max |export - masked| {report['max_abs_diff']:.2e}, "
        f"tolerance {report['tolerance']:.2e}; pre-tokenizer {report.get('tokenizer_pre')}, expected {report.get('tokenizer_pre_expected')}). "
        f"The refused files and the check's report (check.json) are in {staging}; the export/ directory and results.json are unchanged"
    )


def run_fresh(command: list[str], folder: Path, what: str, timeout: float, **env) -> object:
    """Run ``command`` in ``folder`` with only PATH, one thread and ``env``; its last stdout line as JSON, else a RuntimeError."""
    clean = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "HOME": str(folder), **env}
    done = subprocess.run(command, cwd=folder, env=clean, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Reference:
    """The model the export must reproduce, its logits and greedy tokens, and the f32 round-off measured on it."""

    model: nn.Module
    logits: list[np.ndarray]
    greedy: tuple | None  # (prompt, tokens, eos, pad, new tokens) for a decoder-only LM
    roundoff: float  # largest |f32 - float64| logits of the reference and of the pruned copy
    masked_logits: list[np.ndarray] | None = None  # f16 GGUF: the masked f32 model's, beside the rounded reference


def pruned_copy(task, mask):
    """A CPU copy of the task's model with ``mask``'s heads removed (None: as it is), running its own attention."""
    pruned = copy.deepcopy(task.model).cpu()
    if mask is not None:
        prune_unit_mask(unit_gates(pruned, task.gates.unit), mask)
    model_gates(pruned).remove()  # the model's own attention (the wrapper stays only where uneven KV groups need it)
    return pruned


def reference_outputs(task, pruned: nn.Module, mask, batches: list[dict], settings, suppress: list[int] | None = None) -> Reference:
    """The masked task model's logits and greedy tokens on ``batches`` (never a ``suppress`` id), and the f32 round-off against float64."""
    rounded = FORMATS[str(settings.format)].rounds_weights and str(settings.gguf_dtype) == "f16"
    model = rounded_like_gguf(pruned, "f16") if rounded else task.model  # the weights as the file stores them, or under the mask
    with task.gates.masked(None if rounded else mask):
        logits = reference_logits(model, batches)
        greedy = None
        if is_decoder_lm(pruned):
            prompt, eos_pad, new = greedy_prompt(batches), eos_and_pad(pruned), int(settings.new_tokens)
            greedy = (prompt, greedy_tokens(model, prompt, new, suppress), *eos_pad, new)
        masked = None
        if rounded:  # how far the rounded weights move the logits from the masked f32 model
            with task.gates.masked(mask):
                masked = reference_logits(task.model, batches)
    source = model if rounded else pruned  # the same function as the reference, in float64
    computed = [logits] if rounded else [logits, reference_logits(pruned, batches)]
    return Reference(model, logits, greedy, f32_roundoff(computed, exact_logits(source, batches)), masked)


def check_fields(pruned: nn.Module, reference: Reference, pre: dict | None) -> dict:
    """What the checker needs beside the export: the f32 round-off and its multiple, whether to score perplexity, the GGUF pre-tokenizer."""
    fields = {"f32_roundoff": reference.roundoff, "roundoff_multiple": ROUNDOFF_MULTIPLE, "causal": is_decoder_lm(pruned)}
    return fields if pre is None else {**fields, "tokenizer_pre": pre["name"]}
