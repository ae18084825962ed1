"""The layering: the core imports no framework, tasks or experiments; experiments use the task protocol only."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "headprune"
CORE = ("heads", "families", "masks", "pruning", "saving", "importance", "counting",
        "costs", "latency", "mask_search", "rearrange", "recovery", "schedule", "ordering", "significance", "speed", "embedded")
FORBIDDEN_IN_CORE = ("lightning", "pytorch_lightning", "hydra", "headprune.tasks", "headprune.experiments")


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` statement of a file names (at any depth, lazy imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _forbidden(names: set[str], prefixes) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("module", CORE)
def test_core_imports_no_framework_task_or_experiment(module):
    assert not _forbidden(imported_modules(PACKAGE / f"{module}.py"), FORBIDDEN_IN_CORE)


def test_ablation_engine_imports_no_task():
    assert not _forbidden(imported_modules(PACKAGE / "ablation.py"), FORBIDDEN_IN_CORE)


def test_importing_the_core_loads_no_framework():
    code = ("import sys\n" + "".join(f"import headprune.{m}\n" for m in (*CORE, "ablation"))
            + f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'hydra') "
              "or m.startswith(('headprune.tasks', 'headprune.experiments'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ---- experiments branch on nothing task-specific ---------------------------------------------------
TASK_WORDS = {"nli", "mt", "lm", "bleu", "accuracy", "perplexity", "classifier", "seq2seq", "translation", "correct", "hypotheses"}
TASK_PATTERNS = [
    (re.compile(r"hasattr\(\s*task"), "hasattr on a task"),
    (re.compile(r"\btask\.data\b"), "the task's data object (use the protocol)"),
    (re.compile(r"\bmodel\.kind\b|\.get\(\s*[\"']kind[\"']\s*\)|task_kind"), "the model kind"),
    (re.compile(r"headprune\.tasks\.(nli|mt|lm)\b|NLIModule|TranslationModule"), "a concrete task class or module"),
    (re.compile(r"\bper_example\[\s*[\"']"), "a task's per-example record by name"),
]


def task_branches(path: Path) -> list[str]:
    """Places where an experiment file tells tasks apart: patterns, and comparisons or lookups with a task's words."""
    text = path.read_text()
    found = [f"{path.name}: {why}" for pattern, why in TASK_PATTERNS for _ in pattern.finditer(text)]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            constants = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
            found += [f"{path.name}:{node.lineno}: compares with {c.value!r}" for c in constants if c.value in TASK_WORDS]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and "task" in ast.unparse(node.args[0]):
            found.append(f"{path.name}:{node.lineno}: isinstance on a task")
    return found


def test_task_branch_finder_finds_branches(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(task, cfg):\n    if task.metric == "bleu" or hasattr(task.data, "references") or cfg.model.kind:\n'
                   '        return isinstance(task, int)\n')
    assert len(task_branches(bad)) == 5


@pytest.mark.parametrize("path", sorted((PACKAGE / "experiments").glob("*.py")), ids=lambda p: p.name)
def test_experiments_do_not_branch_on_the_task(path):
    assert not task_branches(path)
