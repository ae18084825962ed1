"""tools/llm_pareto.py: the perplexity / generation-speed table and figure of llamacpp_numbers.py outputs."""

import json

import pytest


def numbers(files: dict[str, tuple[float, float, float]], speed: bool) -> dict:
    """A llamacpp_numbers.py output: {name: (perplexity, pp median, tg median)}."""
    out = {"files": {name: {"perplexity": {"perplexity": ppl}} for name, (ppl, _, _) in files.items()}}
    if speed:
        rows = {name: {"pp": {"median": pp}, "tg": {"median": tg}} for name, (_, pp, tg) in files.items()}
        out = {"files": {name: {} for name in files}, "speed": {"files": rows, "gen": 128, "threads": 2, "flash_attn": True}}
    return out


FILES = {
    "unpruned f16": (89.0, 500.0, 100.0),
    "kv f16": (74.5, 600.0, 106.0),
    "kv+ffn@0.8 f16": (80.0, 620.0, 125.0),
    "kv+ffn@0.7 f16": (79.0, 640.0, 124.0),  # better and nearly as fast: the 0.8 point is not dominated (it is faster)
    "unpruned q8_0": (89.2, 700.0, 160.0),
    "kv+ffn@0.8 q8_0": (95.0, 650.0, 150.0),  # worse and slower than its unpruned file: off the front
}


def test_table_gains_and_front(tmp_path):
    import llm_pareto

    speed, ppl = tmp_path / "speed.json", tmp_path / "ppl.json"
    speed.write_text(json.dumps(numbers(FILES, speed=True)))
    ppl.write_text(json.dumps(numbers(FILES, speed=False)))
    rows = llm_pareto.rows_of(json.loads(speed.read_text()), llm_pareto.perplexities([speed, ppl]))
    by_name = {row["name"]: row for row in rows}
    for name, (perplexity, pp, tg) in FILES.items():
        base = FILES[f"unpruned {name.rpartition(' ')[2]}"]
        assert by_name[name]["perplexity"] == pytest.approx(perplexity)
        assert by_name[name]["tg_gain"] == pytest.approx(tg / base[2] - 1, rel=1e-9)
        assert by_name[name]["pp_gain"] == pytest.approx(pp / base[1] - 1, rel=1e-9)
    front = dict(zip(by_name, llm_pareto.on_front(rows)))
    assert front == {
        "unpruned f16": False,  # kv f16 is better and faster
        "kv f16": True,
        "kv+ffn@0.8 f16": True,
        "kv+ffn@0.7 f16": True,
        "unpruned q8_0": True,
        "kv+ffn@0.8 q8_0": False,
    }
    figure = tmp_path / "pareto.png"
    assert llm_pareto.main(["--speed", str(speed), "--perplexity", str(ppl), "--out", str(figure), "--reference", "control=69.1"]) == 0
    assert figure.stat().st_size > 1000


def test_missing_perplexity_is_named(tmp_path):
    import llm_pareto

    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps(numbers(FILES, speed=True)))
    with pytest.raises(SystemExit, match="no perplexity for"):
        llm_pareto.main(["--speed", str(speed), "--out", str(tmp_path / "f.png")])


def test_a_perplexity_measured_elsewhere_completes_the_table(tmp_path, capsys):
    """--perplexity-value gives a timed file the perplexity of another file of its architecture; a bad name is refused."""
    import llm_pareto

    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps(numbers(FILES, speed=True)))
    values = [arg for name, (ppl, _, _) in FILES.items() for arg in ("--perplexity-value", f"{name}={ppl}")]
    assert llm_pareto.main(["--speed", str(speed), "--out", str(tmp_path / "f.png"), *values]) == 0
    assert "| kv | f16 | 74.50 | 600.0 | +20.0% | 106.0 | +6.0% | yes |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="is not '<model> <format>'"):
        llm_pareto.main(["--speed", str(speed), "--out", str(tmp_path / "f.png"), "--perplexity-value", "kv=74.5"])
