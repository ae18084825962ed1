"""Copy a run's results.json into docs/results/<name>.json with the machine's paths made relative to the project root.

``python tools/publish_run.py outputs/mt_control_schedule mt_control_schedule`` writes docs/results/mt_control_schedule.json;
``python tools/publish_run.py --fix`` rewrites the committed files in place. Paths under the checkout the run came from
(``<checkout>/outputs/...``, ``<checkout>/../shared/data``) become ``outputs/...`` and ``../shared/data``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
CHECKOUT = re.compile(r'"(/[^"]*?)/(outputs|\.\./shared)(/[^"]*)?"')  # "<absolute checkout>/outputs/..." or "/../shared/..."


def relative_paths(text: str) -> str:
    """The JSON text with every absolute path into a checkout's outputs/ or its ../shared made relative to the checkout."""
    return CHECKOUT.sub(lambda m: json.dumps(m.group(2) + (m.group(3) or "")), text)


def absolute_paths(text: str) -> list[str]:
    """The absolute paths a JSON text still names (what publishing must not leave)."""
    return re.findall(r'"(/(?:work|home|tmp|root|Users|mnt|scratch)/[^"]*)"', text)


def publish(run_dir: Path, name: str) -> Path:
    """docs/results/<name>.json from ``run_dir``/results.json, paths relative."""
    source = Path(run_dir) / "results.json"
    if not source.exists():
        raise SystemExit(f"{source} does not exist: pass the run directory of a finished run")
    target = RESULTS / f"{name}.json"
    target.write_text(relative_paths(source.read_text()))
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", type=Path)
    parser.add_argument("name", nargs="?")
    parser.add_argument("--fix", action="store_true", help="make the paths of the committed docs/results/*.json relative")
    args = parser.parse_args(argv)
    if args.fix:
        for path in sorted(RESULTS.glob("*.json")):
            text = path.read_text()
            fixed = relative_paths(text)
            if fixed != text:
                path.write_text(fixed)
                print(f"rewrote {path.relative_to(ROOT)}")
        return
    if args.run_dir is None or args.name is None:
        parser.error("give RUN_DIR NAME, or --fix")
    print(f"wrote {publish(args.run_dir, args.name).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
