"""Structured optimal brain surgeon scores (ZipLM, SlimGPT): what a unit costs after the kept weights are re-solved.

A unit (a head, a KV group, an FFN neuron) is a block S of input columns of the projection that reads it (the attention
output projection, the FFN down projection). With H = X^T X over calibration tokens, removing S and re-solving the kept
columns optimally leaves the output error

    dE(S) = tr(W_S [(H^-1)_SS]^-1 W_S^T),          W: (out, K), W_S: its columns S,

and the optimal update is W <- W - W_S [(H^-1)_SS]^-1 (H^-1)_S:, H^-1 <- H^-1 - (H^-1)_:S [(H^-1)_SS]^-1 (H^-1)_S:.
A projection with a bias re-solves it with the kept columns (H over [X 1], the ones column never removed), as
reconstruction does: a removed unit's mean contribution folds into the bias (FLAP) and only the rest is priced.
A residual channel is one input column of every projection that reads the stream (q, k, v, gate, up, the head): one
greedy for the whole stream, each removal's error summed over those readers, each updated. A block or a layer is all
inputs of the projections it writes the stream with: nothing is left to re-solve, so its error is their whole output,
less its mean where the writer keeps running on a bias that takes it (a block: w^T (X^T X - s s^T / N) w, s = X^T 1).
Greedy with updates: each layer removes its cheapest unit, updates, and again; a unit's score is the running maximum
of the errors of the removals up to it, so scores grow in the order the layer would lose its units and are sums of
squared output errors (one unit for every kind: ``prune.joint_scale=loss``). ``obs_fisher`` weights each output
feature o's error by d_o, the mean over real tokens of (dL/dy_o)^2 (the Gauss-Newton diagonal), so that
dL ~ sum_o d_o ||dy_o||^2 / 2 compares units of different layers on the loss scale. ``tokens="gradient"`` weighs
each calibration token in H by a_t = ||dL/dy_t||^2 (summed over the projections that read one input, scaled to mean 1),
H = X^T diag(a) X: with d_o, the rank-one (token x output) approximation of the Gauss-Newton diagonal g_to^2 ~ a_t d_o.
"""

import torch
from torch import nn

from headprune.core.inputs import eval_mode, hooks_removed, model_inputs, valid_token_rows
from headprune.core.kinds import kinds_of
from headprune.core.projections import linear_weight
from headprune.scoring.importance import per_example_loss
from headprune.scoring.token_weights import TOKEN_WEIGHTS


def unit_blocks(gates, unit, model) -> list[tuple[str, int, list[nn.Module], list[int], list[list[int]] | None]]:
    """(group, layer, projections, unit ids, each unit's columns in all of them; None: one unit, all inputs) of ``unit``'s kinds."""
    return [block for kind in kinds_of(unit) for block in kind.surgeon_blocks(model, gates)]


def greedy_surgeon(weights, grams, blocks: list[list[int]], damp: float, rows=None) -> list[tuple[int, float]]:
    """(unit, output error of its removal; row o's weighted by ``rows[o]``) in greedy order, each followed by the optimal update;
    ``weights``, ``grams``, ``rows`` may be lists, one per projection reading the columns: errors summed, each updated."""
    if isinstance(weights, torch.Tensor):  # one projection
        weights, grams, rows = [weights], [grams], [rows]
    rows = rows or [None] * len(weights)
    ws = [w.double().clone() for w in weights]  # (out, K) each; its first n columns are those still in, their units in ``owner[:n]``
    ds = [torch.as_tensor(1.0 if r is None else r, dtype=torch.float64).expand(w.shape[0]) for w, r in zip(ws, rows)]  # row weights
    owner = torch.full((ws[0].shape[1],), -1, dtype=torch.long)  # a column of no unit (a bias's ones column) is never removed
    for u, b in enumerate(blocks):
        owner[b] = u
    eye = torch.eye(ws[0].shape[1], dtype=torch.float64)  # H + damp * mean(diag H over the units' columns) * I, inverted
    scale = [float(g.diagonal()[owner >= 0].double().mean().clamp_min(1e-12)) for g in grams]
    hinvs = [torch.linalg.inv(g.double() + damp * c * eye) for g, c in zip(grams, scale)]  # leading (n, n): the columns still in
    n, order, single = ws[0].shape[1], [], all(len(b) == 1 for b in blocks)
    for _ in blocks:
        if single:
            costs = sum((d @ w[:, :n].square()) / h.diagonal()[:n] for w, h, d in zip(ws, hinvs, ds))  # sum_o d_o w_oc^2 / (H^-1)_cc
            p = int(costs.masked_fill(owner[:n] < 0, float("inf")).argmin())
            u, cost = int(owner[p]), float(costs[p])
        else:
            left = set(owner[:n].tolist()) - {-1}
            u, cost = min((sum(_block_cost(*t, (owner[:n] == u).nonzero().flatten()) for t in zip(ws, hinvs, ds)), u) for u in left)[::-1]
        c = (owner[:n] == u).nonzero().flatten()
        holes, tail = [p for p in c.tolist() if p < n - len(c)], [q for q in range(n - len(c), n) if int(owner[q]) != u]
        for w, hinv in zip(ws, hinvs):
            m = torch.linalg.inv(hinv[c][:, c])  # [(H^-1)_SS]^-1
            w[:, :n].addmm_(w[:, c] @ m, hinv[c, :n], alpha=-1.0)  # the optimal update of every column (S goes to zero)
            hinv[:n, :n].addmm_(hinv[:n, c] @ m, hinv[c, :n], alpha=-1.0)
            w[:, holes], hinv[holes, :n] = w[:, tail], hinv[tail, :n]  # the last columns still in fill S's places
            hinv[:n, holes] = hinv[:n, tail]
        owner[holes], n = owner[tail], n - len(c)
        order.append((u, max(cost, 0.0)))
    return order


def whole_output_error(weight: torch.Tensor, gram: torch.Tensor, rows=None) -> float:
    """sum_o d_o w_o^T H w_o: the output error of removing every input of a projection (a block, a layer), nothing to re-solve."""
    d = torch.as_tensor(1.0 if rows is None else rows, dtype=torch.float64).expand(weight.shape[0])
    return float(torch.einsum("oi,ij,oj,o->", weight.double(), gram.double(), weight.double(), d))


def _ones_rows(x: torch.Tensor, batch: dict) -> torch.Tensor:
    """[X 1] (N, K + 1) in float64 on the CPU: the input's real-token rows and the bias's ones column beside them."""
    rows = valid_token_rows(x.detach(), batch).double().cpu()
    return torch.cat([rows, rows.new_ones(rows.shape[0], 1)], 1)


def centered(gram: torch.Tensor) -> torch.Tensor:
    """X^T X - s s^T / N (K, K) from [X 1]^T [X 1] (K + 1, K + 1), s = X^T 1: the second moment about the inputs' mean."""
    n, s = gram[-1, -1], gram[:-1, -1]
    return gram[:-1, :-1] - torch.outer(s, s) / n if n > 0 else gram[:-1, :-1]


def _block_cost(w: torch.Tensor, hinv: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> float:
    """tr(W_S [(H^-1)_SS]^-1 W_S^T) with row o weighted by d_o, S the columns at positions ``c``."""
    return float(torch.einsum("oi,ij,oj,o->", w[:, c], torch.linalg.inv(hinv[c][:, c]), w[:, c], d))


@torch.no_grad()
def obs_scores(
    model,
    gates,
    batches,
    unit,
    damp: float = 0.01,
    progress: bool = False,
    weighted: bool = False,
    bias: bool = True,
    tokens: str = "uniform",
) -> dict[str, torch.Tensor]:
    """{group: [layers, units]}: each unit's output error after the optimal update of the rest, lower first (``weighted``:
    obs_fisher; ``bias``: a projection's bias is updated with the kept columns, else it stays; ``tokens``: "uniform" or
    "gradient", how calibration tokens weigh in the second moments)."""
    if tokens not in TOKEN_WEIGHTS:
        raise ValueError(f"prune.obs_tokens must be one of {list(TOKEN_WEIGHTS)}, got {tokens!r}")
    from tqdm.auto import tqdm

    batches = list(batches)
    if not batches:
        raise ValueError("the obs order needs calibration batches, and the task's importance subset is empty")
    blocks = unit_blocks(gates, unit, model)
    folded = {b[:2] for kind in kinds_of(unit) if kind.writer_keeps_bias for b in kind.surgeon_blocks(model, gates)} if bias else set()
    projections = list({id(p): p for _, _, found, _, _ in blocks for p in found}.values())
    moments, row_weights = _second_moments(model, projections, batches, weighted, progress, tokens == "gradient")
    scores = {g: torch.zeros(layers, units) for g, (layers, units) in gates.groups.items()}
    for group, layer, found, ids, columns in tqdm(blocks, desc="obs", disable=not progress, leave=False):
        stats = _stacked([(linear_weight(p).detach().cpu(), _bias(p), moments[id(p)], row_weights[id(p)]) for p in found])
        if columns is None:  # one unit: every input of its projections goes
            grams = [centered(g) if (group, layer) in folded and b is not None else g[:-1, :-1] for _, b, g, _ in stats]
            scores[group][layer, ids[0]] = sum(whole_output_error(w, g, d) for (w, _, _, d), g in zip(stats, grams))
            continue
        running = 0.0
        biased = bias and any(b is not None for _, b, _, _ in stats)  # else the plain K columns: no ones column to carry
        weights, grams, rows = map(list, zip(*[(*with_intercept(w, b, g), d) if biased else (w, g[:-1, :-1], d) for w, b, g, d in stats]))
        for index, cost in greedy_surgeon(weights, grams, columns, damp, rows):
            running = max(running, cost)
            scores[group][layer, ids[index]] = running
    return scores


def _bias(projection: nn.Module) -> torch.Tensor | None:
    """The projection's bias (out,) on the CPU, or None."""
    bias = getattr(projection, "bias", None)
    return None if bias is None else bias.detach().cpu()


def with_intercept(weight: torch.Tensor, bias: torch.Tensor | None, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([W b] (out, K + 1), the gram over [X 1]) for the greedy: a bias is re-solved with the kept columns; without one the
    ones column is decoupled (its weight 0 stays 0) so that every reader of a tensor keeps K + 1 columns."""
    if bias is not None:
        return torch.cat([weight, bias.to(weight.dtype).unsqueeze(1)], 1), gram
    decoupled = gram.clone()
    decoupled[-1, :-1], decoupled[:-1, -1], decoupled[-1, -1] = 0.0, 0.0, 1.0
    return torch.cat([weight, weight.new_zeros(weight.shape[0], 1)], 1), decoupled


def _stacked(stats: list[tuple]) -> list[tuple]:
    """(weight, bias, gram, row weights) of projections reading one input (q, k and v) with a bias alike as one: rows stacked."""
    by_input: dict[tuple, list[tuple]] = {}
    for stat in stats:
        by_input.setdefault((id(stat[2]), stat[1] is None), []).append(stat)
    cat = lambda parts: None if parts[0] is None else torch.cat(parts)  # noqa: E731
    return [
        (torch.cat([s[0] for s in same]), cat([s[1] for s in same]), same[0][2], cat([s[3] for s in same])) for same in by_input.values()
    ]


def _second_moments(
    model, projections: list, batches: list, weighted: bool, progress: bool, by_gradient: bool = False
) -> tuple[dict, dict]:
    """({id: [X 1]^T [X 1] (K + 1, K + 1)} of each projection's input over the real tokens, {id: d (out,) or None}), d_o the
    mean over real tokens of (dL/dy_o)^2 (``weighted``); projections reading the same tensor (q, k, v) share one product,
    each token's row weighted by a_t (``by_gradient``: the squared gradients at their outputs, summed, mean 1)."""
    from tqdm.auto import tqdm

    grams: dict[int, torch.Tensor] = {}
    mass: dict[int, float] = {}  # by_gradient: {first index: sum of a_t over its tokens}
    squares, tokens = [0.0] * len(projections), [0] * len(projections)  # sum over real tokens of (dL/dy)^2 (out,), their count
    now: dict = {}  # the batch being run, the inputs seen in it ({id(x): (x, first index)}), each projection's output

    def hook(module, args, output, index):
        x = args[0]
        first = now["inputs"].setdefault(id(x), (x, index))[1]  # the tensor is held, so its id stays its own in this batch
        now["shares"][index] = first
        if first == index:
            now["count"][index] = int(valid_token_rows(x[..., :1], now["batch"]).shape[0])
            if by_gradient:
                now["rows"][index] = x.detach()  # its rows join the gram once the token weights are known
            else:
                rows = _ones_rows(x, now["batch"])
                grams[index] = rows.t() @ rows if index not in grams else grams[index] + rows.t() @ rows
        now[index] = output

    hooks = [p.register_forward_hook(lambda m, a, o, i=i: hook(m, a, o, i)) for i, p in enumerate(projections)]
    backward = weighted or by_gradient
    with hooks_removed(hooks), eval_mode(model), torch.set_grad_enabled(backward):  # a forward per batch (and a backward)
        for batch in tqdm(batches, desc="obs (calibration batches)", unit="batch", disable=not progress, leave=False):
            now.update(batch=batch, inputs={}, shares={}, count={}, rows={})
            outputs = model(**model_inputs(model, batch))
            tokens = [t + now["count"].get(now["shares"].get(i, i), 0) for i, t in enumerate(tokens)]
            norms = {}  # by_gradient: {index: ||dL/dy_t||^2 at the real tokens (N,)}
            if backward:
                ran = [i for i in range(len(projections)) if i in now["shares"]]
                raw = dict(zip(ran, torch.autograd.grad(per_example_loss(outputs, batch).sum(), [now[i] for i in ran], allow_unused=True)))
                for i in ran:  # one projection's gradient in float64 at a time
                    g = raw.pop(i)
                    if g is None:  # the loss does not reach it
                        continue
                    g = valid_token_rows(g, batch).double().cpu()  # (N, out)
                    if weighted:
                        squares[i] = squares[i] + g.square().sum(0)
                    if by_gradient:
                        norms[i] = g.square().sum(1)
            for first, x in now["rows"].items():  # by_gradient: a_t, the squared gradients of every reader of this input
                rows = _ones_rows(x, batch)
                a = sum((norms[i] for i, f in now["shares"].items() if f == first and i in norms), rows.new_zeros(rows.shape[0]))
                mass[first] = mass.get(first, 0.0) + float(a.sum())
                weighted_rows = rows * a[:, None]
                grams[first] = weighted_rows.t() @ rows if first not in grams else grams[first] + weighted_rows.t() @ rows
            now["rows"].clear()
    for first, total in mass.items():  # the weights scaled to mean 1 over every token (``tokens``: the count)
        if not total > 0:
            raise ValueError(
                "prune.obs_tokens=gradient: the task loss has no gradient at a priced projection; use prune.obs_tokens=uniform"
            )
        grams[first] = grams[first] * (tokens[first] / total)
    shares = now.get("shares", {})
    width = [linear_weight(p).shape[1] for p in projections]  # a projection no batch ran: a zero second moment
    zero = lambda k: torch.zeros(k + 1, k + 1, dtype=torch.float64)  # noqa: E731
    out = {id(p): grams.get(shares.get(i, i), zero(k)) for i, (p, k) in enumerate(zip(projections, width))}
    return out, {id(p): (s / max(n, 1) if weighted else None) for p, s, n in zip(projections, squares, tokens)}
