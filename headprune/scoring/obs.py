"""Structured optimal brain surgeon scores (ZipLM, SlimGPT): what a unit costs after the kept weights are re-solved.

A unit (a head, a KV group, an FFN neuron) is a block S of input columns of the projection that reads it (the attention
output projection, the FFN down projection). With H = X^T X over calibration tokens, removing S and re-solving the kept
columns optimally leaves the output error

    dE(S) = tr(W_S [(H^-1)_SS]^-1 W_S^T),          W: (out, K), W_S: its columns S,

and the optimal update is W <- W - W_S [(H^-1)_SS]^-1 (H^-1)_S:, H^-1 <- H^-1 - (H^-1)_:S [(H^-1)_SS]^-1 (H^-1)_S:.
Greedy with updates: each layer removes its cheapest unit, updates, and again; a unit's score is the running maximum
of the errors of the removals up to it, so scores grow in the order the layer would lose its units and are sums of
squared output errors (one unit for every kind: ``prune.joint_scale=loss``). ``obs_fisher`` weights each output
feature o's error by d_o, the mean over real tokens of (dL/dy_o)^2 (the Gauss-Newton diagonal), so that
dL ~ sum_o d_o ||dy_o||^2 / 2 compares units of different layers on the loss scale.
"""

import torch
from torch import nn

from headprune.core.inputs import eval_mode, hooks_removed, model_inputs, valid_token_rows
from headprune.core.kinds import kinds_of
from headprune.core.projections import linear_weight
from headprune.scoring.importance import per_example_loss


def unit_blocks(gates, unit) -> list[tuple[str, int, nn.Module, list[int], list[list[int]]]]:
    """(group, layer, projection, unit ids, each unit's columns) of every site of ``gates`` that holds units of ``unit``."""
    found = [(site, next((c for kind in kinds_of(unit) if (c := kind.unit_columns(site)) is not None), None)) for site in gates.sites]
    return [(site.group, site.layer, *columns) for site, columns in found if columns is not None]


def greedy_surgeon(weight: torch.Tensor, gram: torch.Tensor, blocks: list[list[int]], damp: float, rows=None) -> list[tuple[int, float]]:
    """(unit, output error of its removal; row o's weighted by ``rows[o]``) in greedy order, each followed by the optimal update."""
    w = weight.double().clone()  # (out, K); its first n columns are those still in, their units in ``owner[:n]``
    d = torch.as_tensor(1.0 if rows is None else rows, dtype=torch.float64).expand(w.shape[0])  # (out,): each row's weight
    h = gram.double() + damp * float(gram.diagonal().mean().clamp_min(1e-12)) * torch.eye(gram.shape[0], dtype=torch.float64)
    hinv = torch.linalg.inv(h)  # its leading (n, n) block: the inverse on the columns still in (a Schur complement)
    owner = torch.full((w.shape[1],), -1, dtype=torch.long)
    for u, b in enumerate(blocks):
        owner[b] = u
    n, order, single = w.shape[1], [], all(len(b) == 1 for b in blocks)
    for _ in blocks:
        if single:
            costs = (d @ w[:, :n].square()) / hinv.diagonal()[:n]  # sum_o d_o w_oc^2 / (H^-1)_cc
            p = int(costs.masked_fill(owner[:n] < 0, float("inf")).argmin())
            u, cost = int(owner[p]), float(costs[p])
        else:
            u, cost = min((_block_cost(w, hinv, d, (owner[:n] == u).nonzero().flatten()), u) for u in set(owner[:n].tolist()) - {-1})[::-1]
        c = (owner[:n] == u).nonzero().flatten()
        m = torch.linalg.inv(hinv[c][:, c])  # [(H^-1)_SS]^-1
        w[:, :n].addmm_(w[:, c] @ m, hinv[c, :n], alpha=-1.0)  # the optimal update of every column (S goes to zero)
        hinv[:n, :n].addmm_(hinv[:n, c] @ m, hinv[c, :n], alpha=-1.0)
        holes, tail = [p for p in c.tolist() if p < n - len(c)], [q for q in range(n - len(c), n) if int(owner[q]) != u]
        w[:, holes], owner[holes], hinv[holes, :n] = w[:, tail], owner[tail], hinv[tail, :n]  # the last columns still in fill S's places
        hinv[:n, holes], n = hinv[:n, tail], n - len(c)
        order.append((u, max(cost, 0.0)))
    return order


def _block_cost(w: torch.Tensor, hinv: torch.Tensor, d: torch.Tensor, c: torch.Tensor) -> float:
    """tr(W_S [(H^-1)_SS]^-1 W_S^T) with row o weighted by d_o, S the columns at positions ``c``."""
    return float(torch.einsum("oi,ij,oj,o->", w[:, c], torch.linalg.inv(hinv[c][:, c]), w[:, c], d))


@torch.no_grad()
def obs_scores(model, gates, batches, unit, damp: float = 0.01, progress: bool = False, weighted: bool = False) -> dict[str, torch.Tensor]:
    """{group: [layers, units]}: each unit's output error after the optimal update of the rest, lower first (``weighted``: obs_fisher)."""
    from tqdm.auto import tqdm

    batches = list(batches)
    if not batches:
        raise ValueError("the obs order needs calibration batches, and the task's importance subset is empty")
    blocks = unit_blocks(gates, unit)
    scores = {g: torch.zeros(layers, units) for g, (layers, units) in gates.groups.items()}
    grams: list[torch.Tensor | None] = [None] * len(blocks)  # X^T X (K, K) of each projection's input over the real tokens
    squares, tokens = [0.0] * len(blocks), [0] * len(blocks)  # obs_fisher: sum over real tokens of (dL/dy)^2 (out,), their count
    now: dict = {}  # the batch being run, for the hooks' token mask, and each projection's output

    def hook(module, args, output, index):
        rows = valid_token_rows(args[0].detach(), now["batch"]).double().cpu()
        grams[index] = rows.t() @ rows if grams[index] is None else grams[index] + rows.t() @ rows
        now[index], tokens[index] = output, tokens[index] + rows.shape[0]

    hooks = [block[2].register_forward_hook(lambda m, a, o, i=i: hook(m, a, o, i)) for i, block in enumerate(blocks)]
    with hooks_removed(hooks), eval_mode(model), torch.set_grad_enabled(weighted):  # a forward per batch (obs_fisher: and a backward)
        for batch in tqdm(batches, desc="obs (calibration batches)", unit="batch", disable=not progress, leave=False):
            now["batch"] = batch
            outputs = model(**model_inputs(model, batch))
            if weighted:
                grads = torch.autograd.grad(per_example_loss(outputs, batch).sum(), [now[i] for i in range(len(blocks))], allow_unused=True)
                squares = [s if g is None else s + (valid_token_rows(g, batch).double().cpu() ** 2).sum(0) for s, g in zip(squares, grads)]
    weights = [s / max(n, 1) if weighted else None for s, n in zip(squares, tokens)]  # d_o: the mean over real tokens
    bar = tqdm(blocks, desc="obs", disable=not progress, leave=False)
    for (group, layer, projection, ids, columns), gram, rows in zip(bar, grams, weights):
        gram = gram if gram is not None else torch.zeros(1, 1, dtype=torch.float64)
        running = 0.0
        for index, cost in greedy_surgeon(linear_weight(projection).detach().cpu(), gram, columns, damp, rows):
            running = max(running, cost)
            scores[group][layer, ids[index]] = running
    return scores
