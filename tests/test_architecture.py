"""The layering: one folder per layer, imports only downward, no cycle; the core imports no framework; experiments use the task protocol only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "headprune"
# What the experiments compose, above tasks/: each room one job, in import order.
COMPOSING_ROOMS = ("measures", "sources", "settings", "stages", "checks", "experiments")
# One folder per layer; a module imports only its own layer and the layers before it.
LAYERS = (
    "core",
    "results",
    "scoring",
    "engine",
    "selection",
    "viz",
    "models",
    "export",
    "lightning",
    "tasks",
    "conf_dir",
    *COMPOSING_ROOMS,
    "validation",
    "cli",
)
CORE_LAYERS = ("core", "results", "scoring", "engine", "selection")  # torch and transformers only
FORBIDDEN_IN_CORE = ("lightning", "pytorch_lightning", "hydra", "headprune.tasks", "headprune.experiments", "headprune.lightning")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of a headprune module (None for the package's own __init__, the public API)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


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


def headprune_imports(module: str) -> set[str]:
    """The headprune modules (not packages' names alone) that ``module`` imports."""
    return {n for n in imported_modules(MODULES[module]) if n in MODULES and n != module and n != "headprune"}


def _forbidden(names: set[str], prefixes) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def test_every_module_sits_in_a_layer():
    assert [m for m in MODULES if m != "headprune" and layer_of(m) is None] == []


@pytest.mark.parametrize("module", [m for m in MODULES if m != "headprune"])
def test_no_module_imports_a_later_layer(module):
    upward = sorted(d for d in headprune_imports(module) if layer_of(d) is not None and layer_of(d) > layer_of(module))
    assert upward == [], f"{module} imports later layers: {upward} (layer order: {LAYERS})"


@pytest.mark.parametrize("module", [m for m in MODULES if layer_of(m) is not None and LAYERS[layer_of(m)] in CORE_LAYERS])
def test_core_imports_no_framework_task_or_experiment(module):
    assert not _forbidden(imported_modules(MODULES[module]), FORBIDDEN_IN_CORE)


def import_cycles() -> list[list[str]]:
    """Every cycle of the import graph (imports inside functions included), each as a closed path."""
    graph = {m: headprune_imports(m) for m in MODULES}
    state, stack, cycles = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_the_import_graph_has_no_cycle():
    assert import_cycles() == []


def test_no_two_modules_share_a_name_across_layers():
    by_name = {}
    for module in MODULES:
        if layer_of(module) is not None and not module.endswith(("__init__", "headprune")) and module.count(".") >= 2:
            by_name.setdefault(module.rsplit(".", 1)[1], set()).add(module.split(".")[1])
    assert {n: sorted(layers) for n, layers in by_name.items() if len(layers) > 1} == {}


def test_importing_the_public_api_loads_no_framework():
    code = (
        "import sys\nimport headprune\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'hydra') "
        "or m.startswith(('headprune.tasks', 'headprune.experiments', 'headprune.lightning'))))"
    )
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
    bad.write_text(
        'def f(task, cfg):\n    if task.metric == "bleu" or hasattr(task.data, "references") or cfg.model.kind:\n'
        "        return isinstance(task, int)\n"
    )
    assert len(task_branches(bad)) == 5


@pytest.mark.parametrize(
    "path", sorted(p for room in COMPOSING_ROOMS for p in (PACKAGE / room).glob("*.py")), ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_experiments_do_not_branch_on_the_task(path):
    assert not task_branches(path)


# ---- experiments/ holds the entry points only ------------------------------------------------------
EXPERIMENT_MODULES = [m for m in MODULES if m.startswith("headprune.experiments.")]


def entry_points() -> set[str]:
    """The modules that conf/experiment/*.yaml name in ``run:``."""
    conf = PACKAGE.parent / "conf" / "experiment"
    runs = (re.search(r"^run:\s*(\S+)", p.read_text(), re.M) for p in conf.glob("*.yaml"))
    return {r.group(1).rpartition(".")[0] for r in runs if r}


@pytest.mark.parametrize("module", EXPERIMENT_MODULES)
def test_every_module_of_experiments_is_an_experiment(module):
    tree = ast.parse(MODULES[module].read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    assert {"run", "check"} <= defined, (
        f"{module} is not an experiment (no run and check): move it to the room of what it holds (stages, sources, pruning, study, checks)"
    )
    assert module in entry_points(), f"{module} is named by no conf/experiment/*.yaml"


@pytest.mark.parametrize("module", EXPERIMENT_MODULES)
def test_no_experiment_imports_another(module):
    others = sorted(d for d in headprune_imports(module) if d.startswith("headprune.experiments.") and d != module)
    assert others == [], f"{module} imports other experiments {others}: what they share belongs in the room of what it holds"


# ---- a modality lives in its task folder -----------------------------------------------------------
MODALITY_INPUTS = {"pixel_values", "input_features"}  # an image task's and a speech model's inputs


@pytest.mark.parametrize("layer", ["engine", "selection", "export", *COMPOSING_ROOMS])
def test_no_layer_outside_the_tasks_names_a_modality_input(layer):
    named = [
        f"{path.name}:{node.lineno}"
        for path in sorted((PACKAGE / layer).glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in MODALITY_INPUTS
    ]
    assert named == [], f"{layer}/ names a modality's input {named}: read it from the model (main_input_name) or the task"
