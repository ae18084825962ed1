"""A deployer's numbers of GGUF exports in llama.cpp: perplexity on headprune's texts, KV cache bytes per token, speed.

    python tools/llamacpp_numbers.py --gguf unpruned=<f.gguf> --gguf global=<f.gguf> ... [--model smollm2 --data lm_local]
        [--split eval] [--cache f16] [--repeats 5] [--threads 2] [--out numbers.json]

The texts are the token ids of ``--split`` of the LM task headprune builds from ``--model`` / ``--data`` (BOS first, as
headprune scores them), so llama.cpp's corpus perplexity stands beside the ``results.json`` of the prune or export
runs. The measures run in the clients venv of ``make test-clients`` (``.clients/``, built on first use): llama.cpp
through llama-cpp-python, without headprune. The first ``--gguf`` is the reference of the speed ratios; the KV cache
is read from llama.cpp's log with flash attention off and on (without it llama.cpp pads the V cache of uneven layers
to the widest layer). Speed: llama-bench's pp512 / tg128 through the bindings, the files taking turns repeat by repeat;
each generation gain stands beside its bandwidth-ideal (tools/decode_ideal.py: the weight bytes of the GGUF's tensors and
the KV cache at the mean context, read per token, the first file's over this one's), flagged where it exceeds the ideal
beyond its interval. The threads and the machine's load are recorded; timing is refused while other processes leave
fewer free cores than ``--threads`` (``--time-busy`` times anyway and calls every gain inconclusive).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from shown_paths import shown  # noqa: E402


def dump_texts(model: str, data: str, split: str, out: Path) -> dict:
    """The split's token ids (``ids<i>``, BOS first) as the LM task builds them; its size."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headprune.tasks.lm.task import load_lm_task

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", f"data={data}", "logger=none"])
    with open_dict(cfg):
        cfg.paths.data_dir = os.environ.get("HEADPRUNE_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    ids = load_lm_task(cfg).data.split(split)  # the texts as the task scores them: its tokenizer, text start and length
    np.savez(out, **{f"ids{i}": np.asarray(text, dtype=np.int64) for i, text in enumerate(ids)})
    return {"model": model, "data": data, "split": split, "texts": len(ids), "tokens_predicted": sum(len(t) - 1 for t in ids)}


def client(python: Path, *args: str) -> dict:
    """One measure in the clients venv: its JSON line."""
    done = subprocess.run([str(python), "-I", str(ROOT / "clients" / "client_llamacpp.py"), *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"client_llamacpp.py {' '.join(args[:2])} failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def speed_gains(speed: dict, busy: bool = False) -> None:
    """Each file's pp and tg gain over the first file: paired by repeat, with headprune's 95% interval and verdict
    (inconclusive, whatever the interval, when the machine was busy)."""
    from headprune.engine.verdict import gain_summary, verdict

    files = speed["files"]
    first = files[next(iter(files))]
    for row in files.values():
        for kind in ("pp", "tg"):
            tokens = speed["prompt"] if kind == "pp" else speed["gen"]
            seconds = [[tokens / rate for rate in got[kind]["rates"]] for got in (first, row)]
            summary = gain_summary(*seconds)
            row[kind]["gain"] = {**summary, "verdict": "inconclusive" if busy else verdict(summary)}


def decode_ideals(speed: dict, kv: dict[str, dict]) -> None:
    """Each file's generation gain beside its bandwidth-ideal over the first file (``tg.ideal``), and whether the gain
    exceeds it beyond its interval (``tg.above_ideal``); ``kv``: {name: llama.cpp's KV record with the speed's flash}."""
    from decode_ideal import decode_context, decode_ideal, gguf_bytes

    from headprune.engine.verdict import beyond_ideal

    reads = {name: {**gguf_bytes(row["path"]), "kv_per_token": kv[name]["bytes_per_token"]} for name, row in speed["files"].items()}
    first = reads[next(iter(reads))]
    context = decode_context(0, speed["gen"])  # tg: one token at a time from an empty cache
    for name, row in speed["files"].items():
        ideal = decode_ideal(first, reads[name], context)
        row["bytes"] = reads[name]
        row["tg"]["ideal"] = {"gain": ideal, "context": context}
        row["tg"]["above_ideal"] = beyond_ideal(row["tg"]["gain"], ideal)


def timed_speed(python: Path, files: dict, args, flash: list[str], result: dict) -> bool:
    """Time the files (``result["speed"]``) unless the machine is busy; the threads and load before and after are recorded."""
    from headprune.engine.machine_load import busy_text, machine_record

    before = machine_record(args.threads)
    if before["busy"] and not args.time_busy:
        result["speed"] = {"refused": busy_text(before), "machine": before}
        print(f"not timed: {busy_text(before)}; time on an idle machine, or pass --time-busy for inconclusive numbers", flush=True)
        return False
    threads = ["--threads", str(args.threads), "--repeats", str(args.repeats), "--cache", args.cache, *flash]
    speed = client(python, "speed", *[f"{name}={path}" for name, path in files.items()], *threads)
    after = machine_record(args.threads)
    speed["machine"] = {"before": before, "after": after}
    speed_gains(speed, busy=before["busy"] or after["busy"])
    decode_ideals(speed, {name: row["kv"]["flash" if args.flash else "no_flash"] for name, row in result["files"].items()})
    for row in speed["files"].values():
        row["path"] = shown(row["path"])
    result["speed"] = speed
    return True


def print_table(result: dict) -> None:
    """A markdown table: perplexity, KV bytes per token (flash off / on), pp and tg tokens/s with the gain and its verdict."""
    from decode_ideal import ideal_text

    from headprune.engine.verdict import gain_text

    print("| file | perplexity | KV bytes/token (no flash / flash) | prompt tok/s | gain | generation tok/s | gain | bandwidth-ideal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    speed = result.get("speed", {}).get("files", {})
    for name, row in result["files"].items():
        cells = [name, f"{row['perplexity']['perplexity']:.2f}" if "perplexity" in row else ""]
        cells.append(" / ".join(f"{row['kv'][k]['bytes_per_token']:,.0f}" for k in ("no_flash", "flash")))
        for kind in ("pp", "tg"):
            got = speed.get(name, {}).get(kind)
            first = name == next(iter(speed), None)
            cells += [f"{got['median']:.1f}", "reference" if first else gain_text(got["gain"])] if got else ["", ""]
        ideal = speed.get(name, {}).get("tg", {}).get("ideal")
        cells.append("" if ideal is None or name == next(iter(speed)) else ideal_text(speed[name]["tg"]["gain"], ideal["gain"]))
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    from clients.env import ensure_env, python_of

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", action="append", required=True, help="name=path of a GGUF file (the first: the speed reference)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="lm_local")
    parser.add_argument("--split", default="eval")
    parser.add_argument("--cache", choices=["f16", "f32"], default="f16", help="llama.cpp's KV cache type (its default: f16)")
    parser.add_argument("--flash", action="store_true", help="flash attention for perplexity and speed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--time-busy", action="store_true", help="time on a busy machine too: every gain inconclusive")
    parser.add_argument("--no-perplexity", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--clients", type=Path, default=ROOT / ".clients")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bad = [item for item in args.gguf if "=" not in item or not item.split("=", 1)[0]]
    names = [item.split("=", 1)[0] for item in args.gguf]
    if bad or len(set(names)) < len(names):
        parser.error(f"--gguf takes name=path, each name once: got {bad or names}")
    files = dict(item.split("=", 1) for item in args.gguf)
    missing = [path for path in files.values() if not Path(path).is_file()]
    if missing:
        parser.error(f"no such GGUF file: {missing[0]}")
    ensure_env(args.clients, with_lm_eval=False)
    python = python_of(args.clients)
    flash = ["--flash"] if args.flash else []
    result = {"settings": {k: str(v) for k, v in vars(args).items() if k not in ("gguf", "clients", "out")}, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        texts = Path(tmp) / "texts.npz"
        if not args.no_perplexity:
            result["texts"] = dump_texts(args.model, args.data, args.split, texts)
        for name, path in files.items():
            row = result["files"][name] = {"path": shown(path)}
            row["kv"] = {
                key: client(python, "kv", path, "--cache", args.cache, *f) for key, f in (("no_flash", []), ("flash", ["--flash"]))
            }
            if not args.no_perplexity:
                measured = client(python, "perplexity", str(texts), path, "--cache", args.cache, "--threads", str(args.threads), *flash)
                row["perplexity"] = {k: v for k, v in measured.items() if k not in ("nll", "file")}
                print(f"{name}: perplexity {measured['perplexity']:.4f} in {measured['seconds']:.0f} s", flush=True)
    if not args.no_speed:
        timed_speed(python, files, args, flash, result)
    print_table(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
