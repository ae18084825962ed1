"""`pip install .` (a wheel, not editable) ships conf/: every experiment composes and the CLI runs from the installed package."""

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_ALL = """
import pathlib, sys, headprune
from hydra import compose, initialize_config_dir
from headprune.conf_dir import config_dir
assert pathlib.Path(headprune.__file__).resolve().is_relative_to(pathlib.Path(sys.prefix).resolve()), headprune.__file__
conf = pathlib.Path(config_dir())
experiments = sorted(p.stem for p in (conf / "experiment").glob("*.yaml"))
with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
    for name in experiments:
        assert compose("config", overrides=[f"experiment={name}"]).run, name
print(" ".join(experiments))
"""


def _source_copy(destination: Path) -> Path:
    """The tracked and untracked (not ignored) files of the repository: what a fresh clone builds from."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    for name in listed.stdout.splitlines():
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return destination


@pytest.mark.slow
def test_wheel_ships_the_config_and_runs_inspect(tmp_path):
    source = _source_copy(tmp_path / "src")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("headprune-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    own_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # the dependencies come from this interpreter's site-packages (a path entry: its .pth files, an editable headprune included, stay inactive)
    Path(own_site, "headprune_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    installed = subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", str(wheel)], env=env, capture_output=True, text=True, timeout=300
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    run_dir = tmp_path / "elsewhere"  # away from the source tree: nothing may be read from it
    run_dir.mkdir()
    composed = subprocess.run([str(python), "-c", COMPOSE_ALL], cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
    assert composed.returncode == 0, composed.stderr[-3000:]
    assert composed.stdout.split() == sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    cli = subprocess.run(
        [str(venv / "bin" / "headprune"), "experiment=inspect", "model=minilm", "logger=none", f"hydra.run.dir={run_dir / 'out'}"],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert "enc_self" in cli.stdout + cli.stderr
    assert json.loads((run_dir / "out" / "results.json").read_text())
