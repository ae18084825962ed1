"""Write the unpruned embedded SmolLM2-135M as a ``deci`` GGUF: the same weights in the graph the pruned files run on.

    python tools/gguf_as_deci.py [--dtype f16] --out <folder>

A pruned file with uneven shapes is written as ``deci`` and the unpruned model as ``llama``; timing the unpruned model
in both graphs beside each other separates what the graph costs from what the pruning saves.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="f16", choices=("f32", "f16"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from clients.cases import load_smollm2
    from headprune.export.gguf_deci import export_gguf_deci

    model, tokenizer, pre = load_smollm2()
    print(export_gguf_deci(model, tokenizer, args.out, args.dtype, "smollm2-deci", pre))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
