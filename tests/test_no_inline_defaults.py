"""Each default lives once, in conf/: no setting is read in Python with an inline default, and no function in
experiments/ grows past a screen."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "headprune"
MAX_LINES = 60  # of one function in headprune/experiments/
# .get(key, literal) calls on objects that are not configs but share a key with one (checkpoints, results payloads)
NOT_SCANNED = {"validation.py"}  # checks the raw config before the settings exist; moving into each experiment's check
NOT_CONFIG = {
    "stage_of",
    "asked",  # a client request (headprune.export.onnx_client), not a config
    "checkpoint",
    "payload",
    "result",
    "results",
    "report",
    "job",
    "rope",
    "batch",
    "texts",
    "row",
    "stage",
    "point",
    "p",
    "fields",  # a model's config.json fields
    "read_json_file",  # a file's JSON (an image processor's config)
}


def conf_keys(sections_only: bool = False) -> set[str]:
    """Every key set in a conf/ YAML file (at any depth); ``sections_only``: the keys that hold a mapping (a group)."""
    keys: set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            for key, inner in value.items():
                if not sections_only or isinstance(inner, dict):
                    keys.add(str(key))
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    for path in (ROOT / "conf").rglob("*.yaml"):
        walk(yaml.safe_load(path.read_text()))
    if sections_only:  # a config group (conf/<group>/) holds a mapping too
        keys.update(p.name for p in (ROOT / "conf").iterdir() if p.is_dir())
    return keys - {"defaults", "_target_", "_partial_"}


def is_literal(node: ast.AST) -> bool:
    """A constant, or a list / tuple / dict / set of constants."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(is_literal(e) for e in [*node.keys, *node.values] if e is not None)
    if isinstance(node, ast.UnaryOp):
        return is_literal(node.operand)
    return False


def receiver(node: ast.AST) -> str:
    """The name of what ``.get`` is called on: ``cfg.prune`` -> prune, ``(payload.get("results") or {})`` -> payload."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BoolOp):
        return receiver(node.values[0])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return receiver(node.func.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node, ast.Subscript):
        return receiver(node.value)
    return ""


def is_empty_container(node: ast.AST) -> bool:
    return isinstance(node, (ast.List, ast.Dict, ast.Tuple)) and not (node.keys if isinstance(node, ast.Dict) else node.elts)


def setting_read(node: ast.AST, keys: set[str]) -> str | None:
    """The setting a ``x.get("key")`` call or an ``x.key`` attribute reads, when ``key`` is set in conf/."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        key = node.args[0]
        if isinstance(key, ast.Constant) and key.value in keys and receiver(node.func.value) not in NOT_CONFIG:
            return key.value
    if isinstance(node, ast.Attribute) and node.attr in keys and isinstance(node.ctx, ast.Load):
        return node.attr
    return None


def inline_defaults(path: Path, keys: set[str], sections: set[str]) -> list[str]:
    """``file:line what`` of each setting read with a default written in Python (a missing group read as empty is no default)."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(ROOT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2:
            key = setting_read(node, keys)
            if key and is_literal(node.args[1]) and not (key in sections and is_empty_container(node.args[1])):
                found.append(f"{where}:{node.lineno} .get({key!r}, {ast.unparse(node.args[1])})")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and is_literal(node.values[-1]):
            read = [k for k in (setting_read(v, keys) for v in node.values[:-1]) if k]
            if read and not (read[0] in sections and is_empty_container(node.values[-1])):
                found.append(f"{where}:{node.lineno} {read[0]} or {ast.unparse(node.values[-1])}")
    return found


def stage_keyword_defaults(path: Path, keys: set[str]) -> list[str]:
    """``file:line function(name=literal)`` of each keyword default of an experiments/ function named like a setting."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg in keys and is_literal(default) and not (isinstance(default, ast.Constant) and default.value is None):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg}={ast.unparse(default)})")
    return found


def test_no_setting_is_read_with_an_inline_default():
    keys, sections = conf_keys(), conf_keys(sections_only=True)
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name not in NOT_SCANNED]
    found = [hit for path in paths for hit in inline_defaults(path, keys, sections)]
    assert not found, "settings read with a default written in Python (the default belongs in conf/):\n" + "\n".join(found)


def test_no_stage_function_restates_a_conf_default():
    keys = conf_keys()
    found = [hit for path in sorted((PACKAGE / "experiments").rglob("*.py")) for hit in stage_keyword_defaults(path, keys)]
    assert not found, "experiment functions with a keyword default that restates a conf/ value:\n" + "\n".join(found)


def test_no_experiment_function_is_longer_than_a_screen():
    long = []
    for path in sorted((PACKAGE / "experiments").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, f"functions in headprune/experiments/ over {MAX_LINES} lines:\n" + "\n".join(long)
