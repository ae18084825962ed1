"""Layer-wise reconstruction after pruning: re-solve every projection that lost input units, in one sequential pass.

For each projection whose input width shrank (attention's output projection after heads or KV groups go, the FFN's down
projection after neurons go, every reader of the stream after channels go, and then its writers on their kept rows), in
forward order: its inputs X (N, K) come from the pruned model whose lower layers are already reconstructed (SparseGPT,
SlimGPT); its target Y (N, out) is the unpruned model's output of the same projection. The new weight solves

    W' = argmin ||D^1/2 ([X 1] [W' b']^T - Y)||^2 + lam ||W' - W||^2,   lam = ridge * mean(diag(X^T D X)),

on the kept input columns only (full matrices, not per-unit scales), pulled towards the kept weights W. Where the
projection has a bias, the ones column folds the removed units' mean contribution into it (FLAP's bias compensation).
D weighs the tokens: all alike (``tokens="uniform"``), or by the loss's gradient at the projection's output (``"gradient"``,
see ``token_weights``).
"""

from collections.abc import Iterable
from functools import partial
from itertools import takewhile

import torch
from torch import nn

from headprune.core.inputs import eval_mode, hooks_removed, model_inputs, valid_token_rows
from headprune.core.kinds import KINDS
from headprune.core.projections import in_features, is_projection, linear_weight, out_features
from headprune.scoring.token_weights import TOKEN_WEIGHTS, gradient_token_weights
from headprune.selection.layer_replay import (
    captured_pass,
    hidden_input,
    kept_layer_paths,
    layer_calls,
    layer_of,
    renamed,
    replay,
    replay_caught,
    stacks_of,
    with_input,
)

TARGETS = ("auto", "inputs", "teacher")  # what a re-solved projection matches (see reconstruct)


def shrunk_projections(model: nn.Module, teacher: nn.Module) -> dict[str, list[int] | None]:
    """{name: original ids of its kept output rows (None: all)} of the projections of ``model`` that read fewer inputs than
    the teacher's of the same name, or whose rows a kind re-solves (the residual stream's writers); one whose outputs shrank
    is listed where a kind says which rows it kept, and one whose weight is an embedding's (a tied head) never. Names are
    the teacher's (a removed layer's are left out)."""
    ours, paths = dict(model.named_modules()), kept_layer_paths(model, teacher)
    rows = {key: ids for kind in KINDS.values() for key, ids in kind.kept_rows(model).items()}  # {id(projection): kept row ids}
    by_rows = {key for kind in KINDS.values() if kind.resolves_kept_rows for key in kind.kept_rows(model)}  # re-solved on rows alone
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    names: dict[str, list[int] | None] = {}
    for name, module in teacher.named_modules():
        mine = ours.get(renamed(name, paths) or "")
        if not (is_projection(module) and mine is not None and is_projection(mine)) or id(mine.weight) in tied:
            continue
        if in_features(mine) < in_features(module) or id(mine) in by_rows:
            if out_features(mine) == out_features(module):
                names[name] = None
            elif len(rows.get(id(mine), ())) == out_features(mine):
                names[name] = rows[id(mine)]
    return names


@torch.no_grad()
def teacher_targets(teacher: nn.Module, names: list[str], batches: list[dict]) -> tuple[list[str], list[dict[str, torch.Tensor]]]:
    """(the names in forward order, per batch {name: the teacher's output at the real tokens (N, out)}), one pass per batch."""
    targets, order = [], None
    with eval_mode(teacher):
        for batch in batches:
            modules = dict(teacher.named_modules())
            outputs = captured_pass(teacher, {name: modules[name] for name in names}, batch, outputs=True)
            order = order or [n for n in outputs if n in names]
            targets.append({name: valid_token_rows(y, batch).float().cpu() for name, y in outputs.items()})
    return order or [], targets


def solve_projection(gram: torch.Tensor, cross: torch.Tensor, weight: torch.Tensor, with_bias: bool, ridge: float) -> torch.Tensor:
    """[W' b'] (out, K [+1]) from the augmented G = A^T A (K' x K'), A^T Y (K' x out) and the kept weight W (out, K)."""
    k = weight.shape[1]
    live = gram.diagonal()[:k][gram.diagonal()[:k] > 0]  # inputs a gate holds at zero neither count nor move
    scale = float(live.mean()) if live.numel() else 0.0
    lam = ridge * scale if scale > 0 else 1.0  # inputs that are all zero (an emptied layer's phantom unit): keep W
    penalty = torch.zeros_like(gram)
    penalty.diagonal()[:k] = lam  # the bias column is not pulled anywhere
    prior = torch.zeros_like(cross)
    prior[:k] = lam * weight.t().double()  # towards the kept weights: lam (W' - W)
    if not (with_bias or k):
        return cross[:0].t()
    try:
        solution = torch.linalg.solve(gram + penalty, cross + prior)
    except RuntimeError as error:  # torch's LinAlgError: a singular system
        raise ValueError(
            f"prune.recover=reconstruct met a singular system ({k} kept inputs): raise prune.reconstruct.ridge above {ridge}"
        ) from error
    return solution.t()  # (out, K [+1])


@torch.no_grad()
def fit_projection(
    module: nn.Module, inputs, batches: list[dict], targets: list, rows: list[int] | None, ridge: float, weights: list | None = None
) -> tuple[float, float]:
    """Re-solve a projection from its inputs (B, T, K) and targets (N, out) at its kept ``rows``, real tokens, each token's
    row weighted by ``weights`` (per batch (N,); None: alike); (error before, after), both weighted."""
    with_bias = getattr(module, "bias", None) is not None
    k = in_features(module)
    gram = torch.zeros(k + with_bias, k + with_bias, dtype=torch.float64)
    cross = torch.zeros(k + with_bias, out_features(module), dtype=torch.float64)
    weight = linear_weight(module).detach().double().cpu()
    bias = module.bias.detach().double().cpu() if with_bias else 0
    weight32, bias32 = weight.float(), bias.float() if with_bias else 0.0
    error, norm = 0.0, 0.0
    for b, (batch, x, y) in enumerate(zip(batches, inputs, targets)):
        # x (N, K), y (N, out): float32 products, summed over batches in float64
        x, y = valid_token_rows(x, batch).float().cpu(), (y if rows is None else y[:, rows]).float().cpu()  # at the kept rows
        d = None if weights is None else weights[b].float()[:, None]  # (N, 1): each token's weight
        residual, energy = (x @ weight32.t() + bias32 - y) ** 2, y**2
        error += float((residual if d is None else d * residual).double().sum())
        norm += float((energy if d is None else d * energy).double().sum())
        a = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1) if with_bias else x  # (N, K [+1])
        weighted = a if d is None else a * d  # D A: the uniform fit multiplies nothing
        gram += (weighted.t() @ a).double()
        cross += (weighted.t() @ y).double()
    solution = solve_projection(gram, cross, weight, with_bias, ridge)
    linear_weight(module).copy_(solution[:, :k].to(module.weight.device, module.weight.dtype))  # either orientation
    if with_bias:
        module.bias.copy_(solution[:, k].to(module.bias.device, module.bias.dtype))
    s = solution.t()  # (K [+1], out); the error left, from the normal equations: s^T G s - 2 s^T A^T Y + ||Y||^2
    residual = float((s * (gram @ s)).sum() - 2 * (s * cross).sum()) + norm
    return error / max(norm, 1e-30), max(residual, 0.0) / max(norm, 1e-30)


def residual_writer(teacher: nn.Module, layer: str, call: tuple[tuple, dict]) -> str | None:
    """The last projection run in the teacher's ``layer`` when its output reaches the layer's output unchanged (a pre-norm
    residual: out = h + ... + W x), checked by adding a perturbation to it; None where a norm or gate follows it."""
    modules = dict(teacher.named_modules())
    inside = {n: m for n, m in modules.items() if layer_of(n, [layer]) and is_projection(m)}
    out, got = replay_caught(modules[layer], call, inside)
    if not got:
        return None
    last = list(got)[-1]
    generator = torch.Generator().manual_seed(0)
    delta = torch.randn(got[last].shape, generator=generator).to(got[last]) * (float(got[last].std()) + 1e-6)
    with hooks_removed([inside[last].register_forward_hook(lambda module, args, output: output + delta)]):
        moved = replay(modules[layer], call)
    scale = float(delta.abs().max())
    return last if float((moved - out - delta).abs().max()) <= 1e-3 * scale else None


def _by_layers(
    model, teacher, names, batches, ridge, bar, paths: dict, target: str = "teacher", folds: dict | None = None, weights: dict | None = None
) -> dict | None:
    """Each projection fitted on inputs from replaying its layer on the reconstructed layers' outputs; None: no layer holds one.

    ``target``: "teacher", the unpruned model's outputs on its own stream; "inputs", the unpruned layer's on the pruned
    model's inputs (the layer's own function, SparseGPT's objective: no correction of the error that reaches it).
    Removed layers: their residual update (teacher's layers after a kept one, on that kept layer's target stream) is added
    to the target of the kept layer's residual writer, which is then re-solved too; ``folds`` records
    {removed layer: the projection it went into, or None where none could take it}; ``weights``: {name: per batch (N,)}
    token weights (a name without: alike)."""
    stacks = [s for s in stacks_of(teacher) if any(layer_of(n, s) for n in names) or any(paths[layer] is None for layer in s)]
    if not stacks or any(not [layer for layer in s if paths[layer]] for s in stacks):
        return None
    ours, theirs, errors = dict(model.named_modules()), dict(teacher.named_modules()), {}
    folds, weights = {} if folds is None else folds, weights or {}
    for stack in stacks:
        mine = [paths[layer] for layer in stack if paths[layer]]
        t_calls = [layer_calls(teacher, stack, b) for b in batches]  # the teacher's own stream
        p_calls = [layer_calls(model, mine, b) for b in batches]  # the pruned stream, lower stacks reconstructed
        t_hidden = [hidden_input(c[stack[0]]) for c in t_calls]
        p_hidden = [hidden_input(c[mine[0]]) for c in p_calls]
        for i, layer in enumerate(stack):
            if paths[layer] is None:
                folds.setdefault(layer, None)  # first in its stack: no kept layer below to take its update
                continue
            gone = list(takewhile(lambda after: paths[after] is None, stack[i + 1 :]))  # the removed layers right above it
            here = {n: r for n, r in names.items() if layer_of(n, [layer])}
            if target == "inputs":
                t_hidden = p_hidden
            writer = residual_writer(teacher, layer, with_input(t_calls[0][layer], t_hidden[0])) if gone else None
            if writer is not None and writer not in here and out_features(ours[renamed(writer, paths)]) != out_features(theirs[writer]):
                writer = None  # its rows shrank with the stream and no kind says which it kept
            folds.update(dict.fromkeys(gone, writer))
            fits = {**here, **({writer: names.get(writer)} if writer else {})}
            t_out, targets = [], []
            for b, calls in enumerate(t_calls):
                out, got = replay_caught(theirs[layer], with_input(calls[layer], t_hidden[b]), {n: theirs[n] for n in fits})
                if gone:  # the removed layers run on, in the teacher, from this layer's output
                    after = out
                    for removed in gone:
                        after = replay(theirs[removed], with_input(calls[removed], after))
                    if writer is not None:
                        got[writer] = got[writer] + (after - out)  # their residual update, written by this layer instead
                    out = after
                t_out.append(out)
                targets.append({n: valid_token_rows(y, batches[b]) for n, y in got.items()})
            own, own_calls = ours[paths[layer]], [with_input(c[paths[layer]], p_hidden[b]) for b, c in enumerate(p_calls)]
            for name in [n for n in targets[0] if n in fits] if targets else []:  # in the order they ran
                module = ours[renamed(name, paths)]
                inputs = (replay_caught(own, call, {0: module}, outputs=False, stop=True)[1][0] for call in own_calls)  # up to it
                ys = [target[name] for target in targets]
                errors[name] = fit_projection(module, inputs, batches, ys, fits[name], ridge, weights.get(name))
                bar.update(1)
            p_hidden = [replay(own, call) for call in own_calls]
            t_hidden = t_out
    return errors


@torch.no_grad()
def reconstruct(
    model: nn.Module,
    teacher: nn.Module,
    batches: Iterable[dict],
    ridge: float = 1.0,
    progress: bool = False,
    projections: list[str] | None = None,
    by_layers: bool = True,
    target: str = "auto",
    token_weights: str = "uniform",
) -> dict:
    """Re-solve each shrunk projection of the physically pruned ``model`` towards ``teacher``, sequentially; returns a record.

    ``projections`` names the projections to re-solve instead (a masked model's, whose widths did not shrink);
    ``by_layers`` replays one layer at a time where every projection sits in a layer (else whole passes up to each);
    ``target``: the outputs matched, "teacher" (the unpruned model's on its own stream), "inputs" (the unpruned layer's
    on the pruned model's inputs, layers only) or "auto" (inputs where the residual stream kept its width, else teacher);
    ``token_weights``: how the calibration tokens weigh in each fit, "uniform" or "gradient" (by the unpruned model's loss gradient
    at the projection's output; a removed layer's update folded into a writer not otherwise re-solved weighs alike).
    """
    if token_weights not in TOKEN_WEIGHTS:
        raise ValueError(f"prune.reconstruct.tokens must be one of {list(TOKEN_WEIGHTS)}, got {token_weights!r}")
    if target not in TARGETS:
        raise ValueError(f"prune.reconstruct.target must be one of {list(TARGETS)}, got {target!r}")
    narrower = getattr(model.config, "hidden_size", None) != getattr(teacher.config, "hidden_size", None)
    chosen, target = target == "auto", ("teacher" if narrower else "inputs") if target == "auto" else target
    if target == "inputs" and narrower:
        raise ValueError(
            "prune.reconstruct.target=inputs replays the unpruned layers on the pruned model's inputs, and its residual "
            "stream is narrower: use prune.reconstruct.target=teacher"
        )
    from tqdm.auto import tqdm

    batches = list(batches)
    if not batches:
        raise ValueError("reconstruct got no batches: give a few training batches (model inputs)")
    names = shrunk_projections(model, teacher) if projections is None else dict.fromkeys(projections)
    paths = kept_layer_paths(model, teacher)  # {teacher layer: the model's, None where removed}
    removed = [layer for layer, mine in paths.items() if mine is None]
    if not names and not removed:
        nothing = {"projections": 0, "tokens": 0, "bias_folded": 0, "error_before": {}, "error_after": {}, "engine": None}
        return {**nothing, "target": target, "token_weights": token_weights}
    tokens = _calibration_tokens(teacher, batches, next(iter(names), None))  # names are the teacher's
    modules, folds = dict(model.named_modules()), {}
    weights = gradient_token_weights(teacher, names, batches) if token_weights == "gradient" else {}
    with (
        eval_mode(model),
        eval_mode(teacher),
        tqdm(total=len(names), desc="reconstruct", unit="projection", disable=not progress, leave=False) as bar,
    ):
        inside = {n: r for n, r in names.items() if layer_of(n, [p for s in stacks_of(teacher) for p in s])}
        # a head reading one vector per example leans on the ridge
        widest = max((in_features(modules[renamed(n, paths)]) for n in inside), default=0)
        if tokens <= widest:
            raise ValueError(
                f"prune.recover=reconstruct has {tokens} calibration tokens for a projection with {widest} kept inputs: "
                "give more examples (prune.recover_examples) so the tokens outnumber the widest layer's inputs"
            )
        layered = (by_layers or target == "inputs" or removed) and (inside or removed)
        errors = _by_layers(model, teacher, inside, batches, ridge, bar, paths, target, folds, weights) if layered else None
        if errors is None and removed:
            raise ValueError(f"prune.recover=reconstruct could not replay this model's layers, and it has removed layers {removed}")
        if errors is None and target == "inputs" and chosen:  # auto: layers that cannot be replayed match the teacher's stream
            target = "teacher"
        elif errors is None and target == "inputs":
            raise ValueError(
                "prune.reconstruct.target=inputs replays the unpruned layers on the pruned model's inputs, and this model's layers could not be replayed: use target=teacher"
            )
        engine = "layers" if errors is not None else "passes"
        rest = {n: r for n, r in names.items() if errors is None or n not in errors}  # after the layers: the heads that read them
        errors = errors or {}
        order, targets = teacher_targets(teacher, rest, batches) if rest else ([], [])
        for name in order:  # each fitted on inputs from a pass of the whole model up to it (any model; one pass per projection)
            module = modules[renamed(name, paths)]
            inputs = (captured_pass(model, {0: module}, batch, stop=True)[0] for batch in batches)  # a pass up to it each
            ys = [per_batch[name] for per_batch in targets]
            errors[name] = fit_projection(module, inputs, batches, ys, rest[name], ridge, weights.get(name))
            bar.update(1)
    return {
        "projections": len(errors),
        "tokens": tokens,
        "bias_folded": sum(getattr(modules[renamed(n, paths)], "bias", None) is not None for n in errors),
        "layers_folded": {layer: into for layer, into in folds.items()},  # removed layer: the projection its update went into
        "error_before": {n: e[0] for n, e in errors.items()},
        "error_after": {n: e[1] for n, e in errors.items()},
        "engine": engine,
        "target": target,
        "token_weights": token_weights,
    }


def _calibration_tokens(teacher: nn.Module, batches: list[dict], probe: str | None) -> int:
    """The real tokens of the encoder's ids; without ids (images, audio), the rows the ``probe`` projection (else the first
    layer) reads in one pass."""
    if all("input_ids" in b for b in batches):
        return sum(int(valid_token_rows(b["input_ids"].unsqueeze(-1), b).shape[0]) for b in batches)
    count, now = 0, {}
    module = teacher.get_submodule(probe or stacks_of(teacher)[0][0])

    def seen(module, args, kwargs, out) -> None:  # returns None: the module's output is left as it is
        now.setdefault("x", args[0] if args else kwargs["hidden_states"])

    with (
        hooks_removed([module.register_forward_hook(seen, with_kwargs=True)]),
        torch.no_grad(),
        eval_mode(teacher),
    ):
        for batch in batches:
            now.clear()
            teacher(**model_inputs(teacher, batch))
            count += int(valid_token_rows(now["x"], batch).shape[0])
    return count


def reconstructor(ridge: float, target: str = "auto", progress: bool = False, token_weights: str = "uniform"):
    """A ``recover(model, teacher, batches)`` step (as ``unit_lsq_recoverer``'s) that reconstructs and returns the record."""
    return partial(reconstruct, ridge=ridge, progress=progress, target=target, token_weights=token_weights)
