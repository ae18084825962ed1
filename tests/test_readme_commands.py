"""Every `headprune ...` command the README shows composes, and those without placeholders pass the check before work."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from headprune.validation import validate

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
README = ROOT / "README.md"
PLACEHOLDER = re.compile(r"<[^>]*>")


def readme_commands(text: str) -> list[str]:
    """The `headprune` command lines of the README's bash blocks and tables (continuations joined, comments dropped)."""
    commands, in_bash, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash" and not in_bash
            continue
        if in_bash:
            line = pending + line.split("  #")[0].strip()
            pending = line[:-1] + " " if line.endswith("\\") else ""
            if not pending and line.startswith("headprune "):
                commands.append(line)
        elif line.startswith("| `headprune "):
            commands.append(line.split("`")[1])
    return commands


def first_of_sweeps(overrides: list[str]) -> list[str]:
    """A multirun's overrides with each unbracketed comma list cut to its first value."""
    out = []
    for item in overrides:
        key, _, value = item.partition("=")
        if "," in value and not value.startswith(("[", "{", "'", '"')):
            value = value.split(",")[0]
        out.append(f"{key}={value}")
    return out


def overrides_of(command: str) -> list[str]:
    """The Hydra overrides of a README command line: placeholders filled, sweeps cut to their first value."""
    words = [w for w in shlex.split(PLACEHOLDER.sub("placeholder", command))[1:] if w != "-m"]
    return first_of_sweeps([w for w in words if not w.startswith(("hydra.", "hydra/"))])


COMMANDS = readme_commands(README.read_text())


def test_the_readme_shows_commands():
    assert len(COMMANDS) >= 15
    assert "headprune experiment=study" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_composes_and_passes_its_check(command, tmp_path):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=overrides_of(command))
    assert cfg.get("run"), f"{command}: no experiment"
    if PLACEHOLDER.search(command):
        return  # its inputs are the user's files: composing proves the settings exist
    validate(cfg)
