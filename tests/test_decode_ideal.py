"""The bandwidth-ideal of a decode gain: tensor bytes counted from widths against a GGUF file written and read back."""

import numpy as np
import pytest
from decode_ideal import (
    SMOLLM2_135M,
    LlamaShape,
    beyond_ideal,
    decode_ideal,
    file_bytes,
    gguf_bytes,
    kv_bytes_per_token,
    layer_widths,
    read_per_token,
    tensor_shapes,
)

TINY = LlamaShape(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=100, tied=True)


def _write_gguf(path, widths, fmt: str, shape: LlamaShape) -> None:
    """A llama-shaped GGUF of random tensors in llama.cpp's storage for ``fmt`` (matrices f16 or Q8_0, 1-D f32)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    for name, dims in tensor_shapes(widths, shape):
        values = rng.standard_normal(dims[::-1]).astype(np.float32)  # numpy (ne1, ne0)
        if len(dims) == 1:
            writer.add_tensor(name, values)
        elif fmt == "q8_0" and dims[0] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("fmt", ["f16", "q8_0"])
@pytest.mark.parametrize("tied", [True, False])
def test_counted_bytes_equal_the_tensors_of_a_written_gguf(tmp_path, fmt, tied):
    """Widths with an uneven FFN (40: its ffn_down stays f16 in Q8_0) and one KV group: the count from the widths equals
    what the gguf package reads back from a file holding those tensors."""
    shape = LlamaShape(**{**TINY.__dict__, "tied": tied})
    widths = [(2, 96), (1, 40)]
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, widths, fmt, shape)
    assert gguf_bytes(path) == file_bytes(widths, fmt, shape)


def test_an_untied_embedding_is_read_one_row_per_token():
    sizes = {"token_embd.weight": (100 * 64, 2 * 100 * 64), "output.weight": (100 * 64, 2 * 100 * 64), "output_norm.weight": (64, 256)}
    assert read_per_token(sizes) == 2 * 64 + 2 * 100 * 64 + 256
    tied = {k: v for k, v in sizes.items() if k != "output.weight"}
    assert read_per_token(tied) == 2 * 100 * 64 + 256


def test_smollm2_weight_count_equals_the_transformers_model():
    """SmolLM2-135M's unpruned widths count as many weights as transformers' LlamaForCausalLM of its config (tied)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SMOLLM2_135M
    config = LlamaConfig(
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate_size=s.ffn,
        vocab_size=s.vocab,
        tie_word_embeddings=s.tied,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    counted = sum(p.numel() for p in model.parameters())  # tied: the embedding is one parameter
    assert file_bytes(layer_widths(None), "f16")["weights"] == counted


def test_a_mask_keeps_its_widths_and_the_kv_cache_follows_the_kv_groups():
    mask = {"dec_self": [[1, 0, 1]] + [[1, 1, 1]] * 29, "dec_ffn": [[1] * 1000 + [0] * 536] + [[1] * 1536] * 29}
    widths = layer_widths(mask)
    assert widths[0] == (2, 1000) and widths[1] == (3, 1536)
    assert kv_bytes_per_token(layer_widths(None)) == 23040  # llama.cpp's log for the unpruned f16 cache: 90 MiB / 4096 cells
    assert kv_bytes_per_token(widths) == 23040 - 2 * 64 * 2
    with pytest.raises(ValueError, match="30 layers x 3 KV groups"):
        layer_widths({"dec_self": [[1, 1]] * 30})


def test_decode_ideal_and_the_verdict_above_it():
    reference, pruned = {"read_per_token": 200.0, "kv_per_token": 2.0}, {"read_per_token": 100.0, "kv_per_token": 1.0}
    assert decode_ideal(reference, pruned, context=50) == pytest.approx((200 + 100) / (100 + 50) - 1)
    assert decode_ideal(reference, pruned, context=0) == pytest.approx(1.0)
    assert beyond_ideal({"gain": 0.16, "gain_interval": [0.12, 0.20]}, 0.075)
    assert not beyond_ideal({"gain": 0.16, "gain_interval": [0.05, 0.27]}, 0.075)
    assert not beyond_ideal({"gain": 0.16, "gain_interval": None}, 0.075)


def _speed_args(**kw):
    from argparse import Namespace

    return Namespace(**{"threads": 1, "repeats": 4, "cache": "f16", "flash": False, "time_busy": False, **kw})


def test_llamacpp_numbers_refuses_to_time_on_a_busy_machine(monkeypatch):
    import llamacpp_numbers

    from headprune.engine import machine_load

    record = {"threads": 1, "cpu_count": 2, "load_average": [5.0, 5.0, 5.0], "busy_cores": 1.9, "free_cores": 0, "busy": True}
    monkeypatch.setattr(machine_load, "machine_record", lambda threads, seconds=0.5: record)
    monkeypatch.setattr(llamacpp_numbers, "client", lambda *a: pytest.fail("timed on a busy machine"))
    result = {"files": {}}
    assert not llamacpp_numbers.timed_speed(None, {"a": "a.gguf"}, _speed_args(), [], result)
    assert result["speed"]["machine"] == record and "0 free core(s) of 2" in result["speed"]["refused"]


@pytest.mark.parametrize("busy", [False, True])
def test_llamacpp_numbers_puts_each_generation_gain_beside_its_ideal(tmp_path, monkeypatch, busy):
    """Two files of known tensors: the ideal is the counted bytes' ratio; a gain far above it is flagged; on a busy
    machine (with --time-busy) every gain is inconclusive and the load is recorded."""
    import llamacpp_numbers

    from headprune.engine import machine_load

    widths = {"big": [(2, 96), (2, 96)], "small": [(1, 32), (1, 32)]}
    for name, w in widths.items():
        _write_gguf(tmp_path / f"{name}.gguf", w, "f16", TINY)
    record = {"threads": 1, "cpu_count": 2, "load_average": [0.1] * 3, "busy_cores": 1.2 if busy else 0.1}
    record |= {"free_cores": 1 if busy else 2, "busy": busy}
    monkeypatch.setattr(machine_load, "machine_record", lambda threads, seconds=0.5: {**record, "threads": threads})
    rates = {"big": [100.0, 101.0, 99.0, 100.0], "small": [400.0, 404.0, 397.0, 401.0]}
    speed = {
        "prompt": 8,
        "gen": 16,
        "files": {n: {"path": str(tmp_path / f"{n}.gguf"), "pp": {"rates": r}, "tg": {"rates": r}} for n, r in rates.items()},
    }
    monkeypatch.setattr(llamacpp_numbers, "client", lambda *a: speed)
    kv = {n: {"kv": {"no_flash": {"bytes_per_token": kv_bytes_per_token(w, shape=TINY)}}} for n, w in widths.items()}
    result = {"files": kv}
    assert llamacpp_numbers.timed_speed(None, {n: "unused" for n in widths}, _speed_args(time_busy=busy), [], result)
    reads = {n: {**file_bytes(w, "f16", TINY), "kv_per_token": kv_bytes_per_token(w, shape=TINY)} for n, w in widths.items()}
    small = result["speed"]["files"]["small"]["tg"]
    assert small["ideal"]["gain"] == pytest.approx(decode_ideal(reads["big"], reads["small"], context=7.5), rel=1e-12)
    assert small["above_ideal"] and small["gain"]["verdict"] == ("inconclusive" if busy else "confident")
    assert result["speed"]["machine"]["before"]["busy"] is busy


def test_the_docs_table_puts_each_gain_beside_the_ideal_of_its_mask(tmp_path):
    """A file of one KV group fewer per layer: its ideal from the counted bytes, a gain far above it flagged, a gain
    below it kept, and each gain taken over the unpruned file of its own format."""
    import json

    from decode_ideal_table import ideal_table, name_parts

    mask = {"dec_self": [[1, 1, 0]] * 30}
    points = [{"order": "fisher", "recovery": "finetune", "step": "33%", "mask": mask}]
    (tmp_path / "lm_recovery_global.json").write_text(json.dumps({"results": {"points": points}}))
    rates = {"unpruned f16": 100.0, "global f16": 130.0, "unpruned q8_0": 150.0, "global q8_0": 151.0}
    files = {n: {"tg": {"rates": [r * (1 + 0.002 * (i % 2)) for i in range(6)]}} for n, r in rates.items()}
    rows = ideal_table(tmp_path, {"run": {"gen": 128, "files": files}}).splitlines()[2:]
    widths = layer_widths(mask)
    ideal = decode_ideal(
        {**file_bytes(layer_widths(None), "f16"), "kv_per_token": kv_bytes_per_token(layer_widths(None))},
        {**file_bytes(widths, "f16"), "kv_per_token": kv_bytes_per_token(widths)},
        context=63.5,
    )
    assert rows[0].startswith("| run | global f16 | 125.7M |") and f"| {100 * ideal:+.1f}% | above its ideal" in rows[0]
    assert rows[1].startswith("| run | global q8_0 |") and "+0.7% [" in rows[1] and rows[1].endswith("at or below its ideal |")
    assert name_parts("kv+ffn@0.8 q8_0") == ("kv+ffn@0.8", "q8_0") and name_parts("uniform") == ("uniform", "f16")


def test_a_file_is_also_measured_over_the_unpruned_model_in_its_own_graph(tmp_path):
    """With the unpruned model timed as llama and as deci, the pruned file's gain is given over each, and the deci
    file's over the llama file once (ideal 0): the graph's share and the pruning's apart."""
    import json

    from decode_ideal_table import ideal_rows

    mask = {"dec_self": [[1, 1, 0]] * 30}
    points = [{"order": "fisher", "recovery": "finetune", "step": "33%", "mask": mask}]
    (tmp_path / "lm_recovery_global.json").write_text(json.dumps({"results": {"points": points}}))
    rates = {"unpruned f16": 100.0, "unpruned-deci f16": 105.0, "global f16": 115.5}
    files = {n: {"tg": {"rates": [r * (1 + 0.002 * (i % 2)) for i in range(6)]}} for n, r in rates.items()}
    rows = {(row["file"], row["reference"]): row for row in ideal_rows(tmp_path, {"gen": 128, "files": files})}
    assert set(rows) == {("unpruned-deci f16", "unpruned f16"), ("global f16", "unpruned f16"), ("global f16", "unpruned-deci f16")}
    assert rows["unpruned-deci f16", "unpruned f16"]["ideal"] == pytest.approx(0.0, abs=1e-12)
    assert rows["global f16", "unpruned-deci f16"]["gain"]["gain"] == pytest.approx(0.1, rel=1e-2)
    assert rows["global f16", "unpruned f16"]["gain"]["gain"] == pytest.approx(0.155, rel=1e-2)


def _llama(shape: LlamaShape, kv_heads: int, ffn: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=kv_heads * shape.heads // shape.kv_heads,
        num_key_value_heads=kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=ffn,
        vocab_size=shape.vocab,
        tie_word_embeddings=shape.tied,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tied", [True, False])
def test_pytorch_bytes_per_token_equal_the_gguf_count_of_an_f32_file(tied):
    """The speed experiment's decode ideal (PyTorch parameters) and the GGUF count of the same widths agree."""
    from headprune.measures.speed_stage import decode_bandwidth_ideal, weight_bytes_per_token

    shape = LlamaShape(**{**TINY.__dict__, "tied": tied})
    full, small = _llama(shape, 2, 96), _llama(shape, 1, 32)
    assert weight_bytes_per_token(full) == file_bytes([(2, 96)] * 2, "f32", shape)["read_per_token"]
    assert weight_bytes_per_token(small) == file_bytes([(1, 32)] * 2, "f32", shape)["read_per_token"]
    reads = {
        n: {**file_bytes([w] * 2, "f32", shape), "kv_per_token": kv_bytes_per_token([w] * 2, cache_bytes=4, shape=shape)}
        for n, w in (("full", (2, 96)), ("small", (1, 32)))
    }
    expected = decode_ideal(reads["full"], reads["small"], context=(16 + 48 + 1) / 2)
    assert decode_bandwidth_ideal(full, small, 16, 48) == pytest.approx(expected, rel=1e-12)
    assert decode_bandwidth_ideal(full, full, 16, 48) == 0.0
