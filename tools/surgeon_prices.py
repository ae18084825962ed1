"""Each kind's cheapest unit, priced by the obs orders, in loss per FLOP against the last FFN neuron a finished cut removed.

For an ``experiment=prune`` run whose unit holds FFN neurons beside channels, layers, heads or KV groups: the order's
scores of every unit on the run's importance split (``--importance`` texts: fewer than the run's, for speed), each unit's
FLOPs from its kind's own table (the saving of a layer's last unit, per example of the run's ``seq_len`` tokens), and
the ratio (cheapest unit's score / its FLOPs) / (the n-th cheapest neuron's / a neuron's), n the neurons the run's last
point removed. Above 1, the kind's cheapest unit loses more per FLOP saved than the neurons the search took instead::

    python tools/surgeon_prices.py --run outputs/smollm2_obsf_imp4000_hidden --importance 500
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf, open_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from headprune.core.unit_kinds import kinds_of  # noqa: E402
from headprune.scoring.obs import obs_scores  # noqa: E402
from headprune.sources.orders import SURGEON_ORDERS  # noqa: E402
from headprune.tasks import registry  # noqa: E402


def unit_flops(tables: dict) -> dict[str, float]:
    """{group: the FLOPs its last kept unit costs, the mean over layers}: the step from all units but one to all of them."""
    return {group: float((table[:, -1] - table[:, -2]).mean()) for group, table in tables.items()}


def prices(scores: dict, flops: dict, neurons_removed: int) -> dict[str, dict]:
    """{group: its cheapest unit's score, FLOPs and loss per FLOP over the marginal neuron's}, the FFN group as the yardstick."""
    ffn = next(g for g in scores if g.endswith("ffn"))
    neuron = float(scores[ffn].flatten().sort().values[neurons_removed - 1]) / flops[ffn]
    out = {}
    for group, values in scores.items():
        cheapest = float(values.flatten().min())
        out[group] = {"cheapest": cheapest, "flops": flops[group], "per_flop_vs_marginal_neuron": cheapest / flops[group] / neuron}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="an experiment=prune run directory (its results.json)")
    parser.add_argument("--importance", type=int, default=None, help="importance texts or examples to score on (default: the run's)")
    args = parser.parse_args()
    if args.importance is not None and args.importance < 1:
        parser.error(f"--importance {args.importance}: give at least 1 text or example to score on")
    if not (args.run / "results.json").is_file():
        parser.error(f"--run {args.run}: no results.json there; give the directory of a finished experiment=prune run")
    payload = json.loads((args.run / "results.json").read_text())
    cfg = OmegaConf.create(payload["config"])
    order, kinds = str(cfg.get("prune", {}).get("order")), payload["results"].get("points", [{}])[-1].get("units_by_kind") or {}
    if order not in SURGEON_ORDERS or "ffn" not in kinds:
        parser.error(
            f"--run {args.run}: its order is {order} and its units {sorted(kinds)}; give a run of prune.order=obs or obs_fisher with ffn in prune.unit"
        )
    if args.importance is not None:
        with open_dict(cfg):
            if cfg.data.get("limits") is not None:  # the LM data configs
                cfg.data.limits.importance = args.importance
            else:
                cfg.data.importance_size = args.importance
    task = registry.load_task(cfg)
    results = payload["results"]
    removed = kinds["ffn"]["removed"]
    bias = bool(cfg.prune.get("obs_bias", False))  # a run made before prune.obs_bias existed priced units with each bias fixed
    scores = obs_scores(
        task.model, task.gates, task.importance_batches(), task.gates.unit, weighted=order == "obs_fisher", progress=True, bias=bias
    )
    seq_len = int(results["cost_info"]["seq_len"])
    tables = {g: t for kind in kinds_of(task.gates.unit) for g, t in kind.flops_tables(task.model, seq_len).items()}  # each kind whole
    print(json.dumps({"order": order, "neurons_removed": removed, "groups": prices(scores, unit_flops(tables), removed)}, indent=1))


if __name__ == "__main__":
    main()
