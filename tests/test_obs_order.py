"""prune.order=obs: the surgeon's errors equal re-solved least squares, and the order runs on every kind that has columns."""

import pytest
import torch
from experiment_helpers import make_cfg, results

from headprune.core.inputs import model_inputs, valid_token_rows
from headprune.core.projections import linear_weight
from headprune.experiments import prune
from headprune.scoring.importance import per_example_loss
from headprune.scoring.obs import greedy_surgeon, obs_scores, unit_blocks, whole_output_error
from headprune.tasks.registry import load_task


def _resolved_error(x: torch.Tensor, w: torch.Tensor, removed: list[int]) -> float:
    """||X W^T - X_kept W'^T||^2 with W' the least-squares re-solve on the kept columns."""
    kept = [c for c in range(x.shape[1]) if c not in removed]
    y = x @ w.t()
    if not kept:
        return float((y**2).sum())
    solution = torch.linalg.lstsq(x[:, kept], y).solution
    return float(((x[:, kept] @ solution - y) ** 2).sum())


@pytest.mark.parametrize("width", [1, 3])
def test_greedy_errors_add_up_to_the_resolved_error(width):
    """After every greedy removal, the summed errors equal the error of the layer re-solved on the columns left."""
    torch.manual_seed(0)
    units, out = 6, 5
    x = torch.randn(400, units * width, dtype=torch.float64) @ torch.randn(units * width, units * width, dtype=torch.float64)
    w = torch.randn(out, units * width, dtype=torch.float64)
    blocks = [list(range(u * width, (u + 1) * width)) for u in range(units)]
    order = greedy_surgeon(w, x.t() @ x, blocks, damp=1e-12)
    removed, total = [], 0.0
    for unit, cost in order:
        removed += blocks[unit]
        total += cost
        expected = _resolved_error(x, w, removed)
        assert total == pytest.approx(expected, rel=1e-6, abs=1e-8 * float((x @ w.t()).pow(2).sum()))
    # the first pick is the cheapest single removal
    singles = [_resolved_error(x, w, b) for b in blocks]
    assert order[0][1] == pytest.approx(min(singles), rel=1e-6)


@pytest.mark.parametrize("width", [1, 3])
def test_a_bias_is_re_solved_with_the_kept_columns(width):
    """With the bias as a ones column no unit owns, the summed greedy errors equal the error of the layer re-solved with an
    intercept on the columns left; a unit whose inputs have a mean costs far less where the bias can take it."""
    from headprune.scoring.obs import with_intercept

    torch.manual_seed(0)
    units, out = 5, 4
    x = torch.randn(400, units * width, dtype=torch.float64) + 3.0  # a mean the bias can take
    w, b = torch.randn(out, units * width, dtype=torch.float64), torch.randn(out, dtype=torch.float64)
    ones = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    blocks = [list(range(u * width, (u + 1) * width)) for u in range(units)]
    order = greedy_surgeon(*with_intercept(w, b, ones.t() @ ones), blocks, damp=1e-12)
    removed, total, y = [], 0.0, x @ w.t() + b
    for unit, cost in order[:-1]:  # the last unit leaves the bias alone: the intercept's own error
        removed += blocks[unit]
        total += cost
        kept = [c for c in range(units * width + 1) if c not in removed]
        fit = ones[:, kept] @ torch.linalg.lstsq(ones[:, kept], y).solution
        assert total == pytest.approx(float(((fit - y) ** 2).sum()), rel=1e-6, abs=1e-8 * float((y**2).sum()))
    x = torch.randn(400, units * width, dtype=torch.float64)
    x[:, blocks[0]] += 3.0  # only the first unit has a mean: no other column can stand in for it, the bias can
    ones = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    with_bias = greedy_surgeon(*with_intercept(w, b, ones.t() @ ones), blocks[:1], damp=1e-12)[0][1]
    plain = greedy_surgeon(w, x.t() @ x, blocks[:1], damp=1e-12)[0][1]
    assert with_bias < 0.5 * plain


@pytest.mark.parametrize(("width", "free"), [(1, 0), (1, 4), (3, 0), (3, 2)])
def test_each_greedy_pick_is_the_cheapest_re_solved_removal(width, free):
    """Every step removes the unit whose removal, re-solved with those before it, leaves the least error (units on shuffled
    columns, ``free`` columns in no unit), and the greedy path ends with every unit removed once."""
    torch.manual_seed(2)
    units, out = 7, 5
    columns = units * width + free
    x = torch.randn(300, columns, dtype=torch.float64) @ torch.randn(columns, columns, dtype=torch.float64)
    w = torch.randn(out, columns, dtype=torch.float64)
    shuffled = torch.randperm(columns).tolist()
    blocks = [shuffled[u * width : (u + 1) * width] for u in range(units)]
    order = greedy_surgeon(w, x.t() @ x, blocks, damp=1e-12)
    assert sorted(u for u, _ in order) == list(range(units))
    removed = []
    for unit, _ in order:
        left = [u for u in range(units) if u not in removed]
        errors = {u: _resolved_error(x, w, [c for v in removed + [u] for c in blocks[v]]) for u in left}
        assert errors[unit] <= min(errors.values()) * (1 + 1e-6) + 1e-9 * float((x @ w.t()).pow(2).sum())
        removed.append(unit)


@pytest.mark.parametrize(
    ("task_name", "unit", "weighted"),
    [
        ("lm", "[kv_group,ffn]", False),
        ("nli", "[head,ffn]", False),
        ("lm", "[kv_group,ffn]", True),
        ("lm", "[kv_group,ffn,hidden]", True),
        ("nli", "[head,ffn,hidden]", False),
        ("lm", "[ffn,layer]", True),
        ("nli", "block", False),
    ],
)
def test_obs_scores_cover_every_unit_and_grow_in_greedy_order(tmp_path, task_name, unit, weighted):
    """Every unit of every layer gets a score >= 0, and each layer's scores are the running maximum of its greedy path."""
    task = load_task(make_cfg(tmp_path, "prune", task_name, f"prune.unit={unit}", "prune.order=obs", "prune.joint_scale=loss"))
    scores = obs_scores(task.model, task.gates, task.importance_batches(), task.gates.unit, weighted=weighted)
    assert set(scores) == set(task.gates.groups)
    assert all(bool((s >= 0).all()) and bool((s > 0).any()) for s in scores.values())
    blocks = unit_blocks(task.gates, task.gates.unit, task.model)
    assert {(g, layer) for g, layer, *_ in blocks} == {(g, layer) for g, (n, _) in task.gates.groups.items() for layer in range(n)}


def test_the_calibration_pass_shows_a_progress_bar_and_scores_alike(tmp_path, capsys):
    """obs_fisher's forward and backward passes over the calibration batches show a bar with progress=True, same scores."""
    task = load_task(make_cfg(tmp_path, "prune", "lm", "prune.unit=[kv_group,ffn]", "prune.order=obs_fisher", "prune.joint_scale=loss"))
    quiet = obs_scores(task.model, task.gates, task.importance_batches(), task.gates.unit, weighted=True)
    capsys.readouterr()
    shown = obs_scores(task.model, task.gates, task.importance_batches(), task.gates.unit, weighted=True, progress=True)
    assert "obs (calibration batches)" in capsys.readouterr().err
    for group, scores in quiet.items():
        torch.testing.assert_close(shown[group], scores)


def test_weighted_greedy_errors_add_up_to_the_weighted_resolved_error():
    """With each output row weighted (obs_fisher), the summed greedy errors equal sum_o d_o ||dy_o||^2 after the re-solve."""
    torch.manual_seed(1)
    units, out = 5, 4
    x = torch.randn(300, units, dtype=torch.float64) @ torch.randn(units, units, dtype=torch.float64)
    w, d = torch.randn(out, units, dtype=torch.float64), torch.rand(out, dtype=torch.float64) + 0.1
    blocks = [[u] for u in range(units)]
    removed, total = [], 0.0
    for unit, cost in greedy_surgeon(w, x.t() @ x, blocks, damp=1e-12, rows=d):
        removed, total = removed + [unit], total + cost
        kept = [c for c in range(units) if c not in removed]
        y = x @ w.t()
        fit = x[:, kept] @ torch.linalg.lstsq(x[:, kept], y).solution if kept else torch.zeros_like(y)
        expected = float((((fit - y) ** 2).sum(0) * d).sum())
        assert total == pytest.approx(expected, rel=1e-6, abs=1e-8 * float((y**2).sum(0) @ d))


@pytest.mark.parametrize(("task_name", "bias"), [("lm", True), ("nli", True), ("nli", False)])
def test_obs_fisher_weights_each_output_by_its_mean_squared_loss_gradient(tmp_path, task_name, bias):
    """obs_fisher's scores of a layer equal the greedy surgeon's with each output row weighted by the mean over real tokens
    of the squared loss gradient that a full backward hook sees, and the input second moments a forward hook sees (with a
    ones column and the bias beside the weights where the projection has one, unless ``bias`` is off)."""
    task = load_task(make_cfg(tmp_path, "prune", task_name, "prune.unit=ffn", "prune.order=obs_fisher"))
    batches = list(task.importance_batches())
    group, layer, (projection,), ids, columns = unit_blocks(task.gates, task.gates.unit, task.model)[0]
    seen, gram, squares, count = {}, 0.0, 0.0, 0
    hooks = [
        projection.register_forward_hook(lambda m, args, out: seen.__setitem__("x", args[0].detach())),
        projection.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("g", gout[0])),
    ]
    for batch in batches:
        task.model.zero_grad()
        per_example_loss(task.model(**model_inputs(task.model, batch)), batch).sum().backward()
        x, g = valid_token_rows(seen["x"], batch).double(), valid_token_rows(seen["g"], batch).double()
        x = x if projection.bias is None or not bias else torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)  # its ones column
        gram, squares, count = gram + x.t() @ x, squares + (g**2).sum(0), count + g.shape[0]
    for hook in hooks:
        hook.remove()
    task.model.zero_grad()
    assert float(squares.max()) > 0
    expected, running = torch.zeros(len(ids)), 0.0
    weight = linear_weight(projection).detach()
    weight = weight if projection.bias is None or not bias else torch.cat([weight, projection.bias.detach().unsqueeze(1)], 1)  # [W b]
    assert (projection.bias is None) == (task_name == "lm")  # the BERT down projection re-solves its bias, the Llama one has none
    for index, cost in greedy_surgeon(weight, gram, columns, 0.01, squares / count):
        running = max(running, cost)
        expected[index] = running
    got = obs_scores(task.model, task.gates, batches, task.gates.unit, weighted=True, bias=bias)[group][layer, ids]
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6 * float(expected.max()))


@pytest.mark.parametrize("task_name", ["lm", "nli"])
def test_obs_fisher_prunes_and_reconstructs_through_the_experiment(tmp_path, task_name):
    """experiment=prune with prune.order=obs_fisher writes the mask alone and its reconstruction at the target."""
    unit = "[kv_group,ffn,hidden]" if task_name == "lm" else "[head,ffn,hidden]"
    overrides = [f"prune.unit={unit}", "prune.order=obs_fisher", "prune.joint_scale=loss", "prune.target={flops:0.8}"]
    prune.run(make_cfg(tmp_path, "prune", task_name, *overrides, "prune.recover=[none,reconstruct]", "prune.recover_examples=16"))
    points = [p for p in results(tmp_path)["results"]["points"] if p["order"] == "obs_fisher"]
    assert [p["recovery"] for p in points] == ["none", "reconstruct"]
    assert all(abs(p["flops_kept"] - 0.8) < 0.1 for p in points)


def test_greedy_over_projections_reading_the_same_columns_adds_their_re_solved_errors():
    """Projections reading the same columns from different inputs (the residual stream's readers in two layers): each
    greedy removal is the cheapest by the summed re-solved error, and the summed costs equal it after every step."""
    torch.manual_seed(3)
    columns, rows = 6, [(4, 300), (3, 200)]
    xs = [torch.randn(n, columns, dtype=torch.float64) @ torch.randn(columns, columns, dtype=torch.float64) for _, n in rows]
    ws = [torch.randn(out, columns, dtype=torch.float64) for out, _ in rows]
    blocks = [[c] for c in range(columns)]
    order = greedy_surgeon(ws, [x.t() @ x for x in xs], blocks, damp=1e-12)
    scale = sum(float((x @ w.t()).pow(2).sum()) for x, w in zip(xs, ws))
    removed, total = [], 0.0
    for unit, cost in order:
        left = [u for u in range(columns) if u not in removed]
        errors = {u: sum(_resolved_error(x, w, removed + [u]) for x, w in zip(xs, ws)) for u in left}
        assert errors[unit] <= min(errors.values()) * (1 + 1e-6) + 1e-9 * scale
        removed, total = removed + [unit], total + cost
        assert total == pytest.approx(errors[unit], rel=1e-6, abs=1e-8 * scale)


def test_a_whole_unit_costs_what_removing_every_column_one_by_one_adds_up_to():
    """A block's or a layer's price (every input of its projection gone) equals the greedy's summed costs to the last column."""
    torch.manual_seed(4)
    x = torch.randn(200, 5, dtype=torch.float64) @ torch.randn(5, 5, dtype=torch.float64)
    w, d = torch.randn(3, 5, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.1
    summed = sum(cost for _, cost in greedy_surgeon(w, x.t() @ x, [[c] for c in range(5)], damp=1e-12, rows=d))
    assert whole_output_error(w, x.t() @ x, d) == pytest.approx(summed, rel=1e-6)
    assert whole_output_error(w, x.t() @ x, d) == pytest.approx(float(((x @ w.t()) ** 2).sum(0) @ d), rel=1e-9)


def test_readers_of_one_input_share_one_second_moment(tmp_path):
    """The residual stream's q, k and v read one tensor: the obs pass holds one [X 1]^T [X 1] for them, equal to the product
    of that input with its ones column, and the channel scores come from every reader of the stream."""
    from headprune.core.hidden.sites import hidden_group
    from headprune.scoring.obs import _second_moments

    task = load_task(make_cfg(tmp_path, "prune", "lm", "prune.unit=[kv_group,ffn,hidden]", "prune.order=obs", "prune.joint_scale=loss"))
    readers = hidden_group(task.model).readers
    batches = list(task.importance_batches())
    grams, _ = _second_moments(task.model, readers, batches, weighted=False, progress=False)
    seen = {}
    hook = readers[0].register_forward_hook(lambda m, args, out: seen.setdefault("x", []).append(args[0].detach()))
    with torch.no_grad():
        for batch in batches:
            task.model(**model_inputs(task.model, batch))
    hook.remove()
    rows = [valid_token_rows(x, b).double() for x, b in zip(seen["x"], batches)]
    rows = [torch.cat([r, torch.ones(len(r), 1, dtype=r.dtype)], 1) for r in rows]  # [X 1]: a bias's ones column beside
    torch.testing.assert_close(grams[id(readers[0])], sum(r.t() @ r for r in rows))
    assert len({id(g) for g in grams.values()}) < len(readers)  # shared, not one product per reader


def test_surgeon_prices_tool_prints_each_kinds_cheapest_unit_against_the_last_neuron_removed(tmp_path):
    """tools/surgeon_prices.py on a finished run prints, for channels, (cheapest channel's score / a channel's FLOPs) over (the
    n-th cheapest neuron's score / a neuron's FLOPs), n the neurons the run removed: the same ratio computed here directly."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from omegaconf import OmegaConf

    from headprune.core.unit_kinds import KINDS

    overrides = ["prune.unit=[kv_group,ffn,hidden]", "prune.order=obs_fisher", "prune.joint_scale=loss", "prune.target={flops:0.8}"]
    prune.run(make_cfg(tmp_path, "prune", "lm", *overrides))
    payload = results(tmp_path)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "tools" / "surgeon_prices.py"), "--run", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout)
    task = load_task(OmegaConf.create(payload["config"]))
    scores = obs_scores(task.model, task.gates, task.importance_batches(), task.gates.unit, weighted=True)
    removed = payload["results"]["points"][-1]["units_by_kind"]["ffn"]["removed"]
    seq_len = payload["results"]["cost_info"]["seq_len"]
    ffn, hidden = KINDS["ffn"].flops_tables(task.model, seq_len)["dec_ffn"], KINDS["hidden"].flops_tables(task.model, seq_len)["hidden"]
    neuron = float(scores["dec_ffn"].flatten().sort().values[removed - 1]) / float(ffn[0, -1] - ffn[0, -2])
    expected = float(scores["hidden"].min()) / float(hidden[0, -1] - hidden[0, -2]) / neuron
    assert printed["neurons_removed"] == removed
    assert printed["groups"]["hidden"]["per_flop_vs_marginal_neuron"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--importance", "0"], "at least 1"), ([], "no results.json"), (["--importance", "-3"], "at least 1")],
)
def test_surgeon_prices_tool_refuses_bad_input_in_one_line(tmp_path, arguments, message):
    """An empty run directory or a count below 1: exit 2 with one error line, before any model is loaded."""
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[1] / "tools" / "surgeon_prices.py"
    done = subprocess.run([sys.executable, str(tool), "--run", str(tmp_path), *arguments], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert message in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("task_name", ["lm", "nli"])
def test_gradient_token_weights_give_the_weighted_second_moment(tmp_path, task_name):
    """prune.obs_tokens=gradient: q, k and v's shared [X 1]^T diag(a) [X 1] has a_t = the squared loss gradients of all three
    at token t (scaled to mean 1), as reconstruction's token weights compute them for each projection from the teacher."""
    from headprune.scoring.obs import _second_moments
    from headprune.scoring.token_weights import gradient_token_weights

    task = load_task(make_cfg(tmp_path, "prune", task_name, "prune.unit=head", "prune.order=obs"))
    names = {n: m for n, m in task.model.named_modules() if n.endswith(("q_proj", "k_proj", "v_proj", "query", "key", "value"))}
    first_layer = sorted(names)[:3]  # the three readers of one layer's input (names sort by layer, then by projection)
    readers = [names[n] for n in first_layer]
    batches = list(task.importance_batches())
    grams, _ = _second_moments(task.model, readers, batches, weighted=False, progress=False, by_gradient=True)
    per_reader = gradient_token_weights(task.model, dict.fromkeys(first_layer), batches)  # each mean 1: undo, then add
    seen = {}
    hook = readers[0].register_forward_hook(lambda m, args, out: seen.setdefault("x", []).append(args[0].detach()))
    raw = []
    for name in first_layer:  # back to squared norms: the mean of each is the sum of its squares over the token count
        squares = torch.cat(_raw_squares(task.model, task.model.get_submodule(name), batches))
        raw.append(squares)
        torch.testing.assert_close(torch.cat(per_reader[name]), squares / squares.mean(), rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        for batch in batches:
            task.model(**model_inputs(task.model, batch))
    hook.remove()
    a = sum(raw)
    a = a / a.mean()
    rows = torch.cat([valid_token_rows(x, b).double() for x, b in zip(seen["x"], batches)])
    rows = torch.cat([rows, torch.ones(len(rows), 1, dtype=rows.dtype)], 1)
    expected = (rows * a[:, None]).t() @ rows
    torch.testing.assert_close(grams[id(readers[0])], expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))


def _raw_squares(model, module, batches) -> list[torch.Tensor]:
    """Per batch (N,): ||dL/dy_t||^2 at ``module``'s output, real tokens, from a full backward hook."""
    seen, out = {}, []
    hook = module.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("g", gout[0]))
    for batch in batches:
        model.zero_grad()
        per_example_loss(model(**model_inputs(model, batch)), batch).sum().backward()
        out.append(valid_token_rows(seen["g"], batch).double().square().sum(1))
    hook.remove()
    model.zero_grad()
    return out


@pytest.mark.parametrize("bias", [True, False])
def test_a_block_is_priced_by_its_output_about_its_mean_where_its_writer_keeps_a_bias(tmp_path, bias):
    """A removed block's writer keeps its bias, which takes the block's mean output: its price is sum_t ||W (x_t - mean x)||^2
    over the writer's inputs (the same as the greedy removing every column with the bias re-solved), and without the
    bias's re-solve (``bias`` off) sum_t ||W x_t||^2."""
    from headprune.scoring.obs import with_intercept

    task = load_task(make_cfg(tmp_path, "prune", "nli", "prune.unit=block", "prune.order=obs"))
    batches = list(task.importance_batches())
    group, layer, (writer,), ids, columns = unit_blocks(task.gates, task.gates.unit, task.model)[-1]  # an FFN block
    assert columns is None and writer.bias is not None
    seen = []
    hook = writer.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        for batch in batches:
            task.model(**model_inputs(task.model, batch))
    hook.remove()
    x = torch.cat([valid_token_rows(s, b).double() for s, b in zip(seen, batches)])
    w = linear_weight(writer).detach().double()
    got = float(obs_scores(task.model, task.gates, batches, task.gates.unit, bias=bias)[group][layer, ids[0]])
    expected = float(((x - x.mean(0) if bias else x) @ w.t()).square().sum())
    assert got == pytest.approx(expected, rel=1e-4)
    if bias:  # the greedy over every column with the bias as an unowned column adds up to the same
        a = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
        wb, gram = with_intercept(w, writer.bias.detach().double(), a.t() @ a)
        summed = sum(cost for _, cost in greedy_surgeon(wb, gram, [[c] for c in range(w.shape[1])], damp=1e-12))
        assert summed == pytest.approx(expected, rel=1e-4)
