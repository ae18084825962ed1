"""Per-layer error of a pruned model's residual stream against the unpruned model's, token by token.

For one recovered point of a finished ``experiment=prune`` run (saved with ``prune.save``) and its mask alone, on the first
``--batches`` importance batches: at every layer's output, each real token's relative squared error
||h - h_teacher||^2 / ||h_teacher||^2 (on the channels the point keeps), as the median over ordinary tokens and the mean over
the tokens carrying massive activations (a stream norm above ``--massive`` x the median norm): whether a recovery that
lowers the stream's error on average leaves the ordinary tokens' worse::

    python tools/stream_error.py --run outputs/smollm2_hidden_75 --point "fisher+reconstruct@flops=0.75" \\
        --out docs/results/llm_reconstruct_75_hidden_stream.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from headprune import load_pruned, prune_unit_mask, unit_gates  # noqa: E402
from headprune.core.inputs import model_inputs  # noqa: E402
from headprune.results.points import kind_counts, point_name, point_step  # noqa: E402
from headprune.results.run_dir import mask_from_json  # noqa: E402
from headprune.tasks import registry  # noqa: E402


def token_errors(hidden, teacher_hidden, keep, valid, massive: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(each real token's relative squared error (N,), whether it is massive (N,)) of one layer's output (B, T, C) against
    the teacher's (B, T, C0), on the kept channels."""
    t = teacher_hidden[..., keep][valid]  # (N, C) at the real tokens
    per = ((hidden[valid] - t) ** 2).sum(-1) / (t**2).sum(-1).clamp_min(1e-30)
    norm = t.norm(dim=-1)
    return per, norm > massive * norm.median()


def summary(per: torch.Tensor, big: torch.Tensor) -> dict:
    """The median error of the ordinary tokens, the mean of the massive ones and how many there are."""
    return {
        "ordinary_median": float(per[~big].median()),
        "massive_mean": float(per[big].mean()) if big.any() else None,
        "massive_tokens": int(big.sum()),
        "tokens": int(per.numel()),
    }


def loss(logits, batch) -> float:
    """Mean next-token cross-entropy at the real tokens."""
    labels = batch["input_ids"].masked_fill(~batch["attention_mask"].bool(), -100)[:, 1:]
    flat = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    return float(torch.nn.functional.cross_entropy(flat, labels.reshape(-1), ignore_index=-100))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a finished experiment=prune run directory")
    parser.add_argument("--point", required=True, help="the recovered point, as the run prints it: name@step")
    parser.add_argument("--batches", type=int, default=1, help="importance batches to read (default 1)")
    parser.add_argument("--massive", type=float, default=10.0, help="a token is massive above this x the median stream norm")
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args(argv)
    run = Path(args.run)
    payload = json.loads((run / "results.json").read_text())
    points = {f"{point_name(p)}@{point_step(p)}": p for p in payload["results"].get("points", [])}
    if args.point not in points or not points[args.point].get("model_dir"):
        saved = [name for name, p in points.items() if p.get("model_dir")]
        raise SystemExit(f"{args.point!r} is not a saved point of {run}: give one of {saved}")
    point = points[args.point]
    unit = payload["config"]["prune"]["unit"]
    other = [kind for kind, (removed, _) in kind_counts(point["mask"], unit).items() if removed and kind in ("layer", "vocab")]
    if other:  # removed layers leave no stream to compare; a cut vocabulary's saved model reads other ids
        raise SystemExit(f"{args.point!r} removes {other[0]} units: compare the stream of points that keep every layer and token")
    task = registry.load_task(OmegaConf.create(payload["config"]))
    teacher = task.model.eval()
    masked = copy.deepcopy(teacher)
    gates = unit_gates(masked, payload["config"]["prune"]["unit"])
    mask = gates.normalize_mask(mask_from_json(point["mask"]), hard=True)
    prune_unit_mask(gates, mask)
    recovered = load_pruned(run / point["model_dir"]).eval()
    keep = mask["hidden"].reshape(-1).bool() if "hidden" in mask else slice(None)
    batches = [b for _, b in zip(range(args.batches), task.importance_batches())]
    names = ("mask alone", args.point)
    errors: dict = {}  # (layer, name): [(per-token errors, massive flags)] over the batches
    losses = {"unpruned": 0.0, "mask alone": 0.0, args.point: 0.0}
    with torch.no_grad():
        for batch in batches:
            models = (("unpruned", teacher), ("mask alone", masked), (args.point, recovered))
            outs = {name: m(**model_inputs(m, batch), output_hidden_states=True) for name, m in models}
            valid = batch["attention_mask"].bool()
            for name, out in outs.items():
                losses[name] += loss(out.logits, batch) / len(batches)
            for layer, t in enumerate(outs["unpruned"].hidden_states):
                for name in names:
                    errors.setdefault((layer, name), []).append(token_errors(outs[name].hidden_states[layer], t, keep, valid, args.massive))
    layers = len(outs["unpruned"].hidden_states)
    rows = [
        {"layer": layer, **{n: summary(*(torch.cat(part) for part in zip(*errors[layer, n]))) for n in names}} for layer in range(layers)
    ]
    result = {"run": str(run), "point": args.point, "batches": len(batches), "massive": args.massive, "loss": losses, "layers": rows}
    for row in rows:
        print(
            row["layer"],
            *(
                f"{n}: ordinary {row[n]['ordinary_median']:.3f} massive {row[n]['massive_mean'] or 0:.4f} ({row[n]['massive_tokens']})"
                for n in ("mask alone", args.point)
            ),
            sep=" | ",
        )
    print("loss:", {k: round(v, 3) for k, v in losses.items()})
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
