"""Each setting is declared once, beside its field: no field twice, no rule or READS tuple elsewhere, every YAML key of
a settings group declared and every declaration with its YAML key, and docs/settings.md rendered from them."""

from __future__ import annotations

import ast
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from headprune.settings import DECLARED
from headprune.settings.declare import EVERY, STAGES, TRAINING, declared
from headprune.settings.schema import DECLARATIONS, SCHEMA, checked_groups, is_read, reads_of

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "headprune"
CONF = ROOT / "conf"
SETTINGS_DIR = PACKAGE / "settings"
CHECKS = {"integer", "number", "boolean", "choice", "text", "choices", "fractions", "positive_ints", "boolean_or", "rule", "optional"}
EXPERIMENTS = {p.stem for p in (CONF / "experiment").glob("*.yaml")}
GROUP_NAMES = {g.name for g in DECLARED if g.name}


def load(path: Path) -> dict:
    values = yaml.safe_load(path.read_text()) or {}
    values.pop("defaults", None)
    return values


def yaml_keys(values: dict, cls, prefix: str) -> set[str]:
    """The dotted keys of a YAML mapping, read as the dataclass ``cls`` nests its sections."""
    sections = {f.name: f.metadata["section"] for f in fields(cls) if "section" in f.metadata}
    keys = set()
    for key, value in values.items():
        if key in sections and isinstance(value, dict):
            keys |= yaml_keys(value, sections[key], f"{prefix}.{key}")
        else:
            keys.add(f"{prefix}.{key}")
    return keys


def group_yaml_keys(group) -> set[str]:
    """Every key the conf/ files set in a group: each of its config choices (conf/<group>/*.yaml) and the experiment files."""
    files = [load(p) for p in sorted((CONF / group.name).glob("*.yaml"))]
    files += [load(p).get(group.name) or {} for p in sorted((CONF / "experiment").glob("*.yaml"))]
    return set().union(*(yaml_keys(values, group.settings, group.name) for values in files))


def settings_classes():
    """Every dataclass a declared group holds, nested sections included."""
    found, todo = [], [g.settings for g in DECLARED]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += [f.metadata["section"] for f in fields(cls) if "section" in f.metadata]
    return found


def test_no_settings_class_declares_a_field_twice():
    """A repeated annotation in a dataclass body silently keeps one field (export.int8_batch_sizes was declared twice)."""
    twice = []
    for path in sorted(SETTINGS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                twice += [f"{path.name}:{node.name}.{n}" for n in set(names) if names.count(n) > 1]
    assert not twice, twice


@pytest.mark.parametrize("cls", settings_classes(), ids=lambda c: c.__name__)
def test_every_field_is_one_declaration_without_a_default(cls):
    for f in fields(cls):
        assert "section" in f.metadata or "read_by" in f.metadata, f"{cls.__name__}.{f.name} is no setting(...) declaration"
        assert f.default is MISSING and f.default_factory is MISSING, f"{cls.__name__}.{f.name} has a default: it belongs in conf/"
        if "read_by" in f.metadata:
            assert f.metadata["read_by"], f"{cls.__name__}.{f.name} names no experiment that reads it"


def test_readers_are_experiment_files():
    named = {name for d in DECLARATIONS.values() for name in d.read_by} | {n for g in DECLARED for n in g.passes_on}
    named |= set(STAGES) | {n for stages in STAGES.values() for n in stages}
    assert named - EXPERIMENTS <= {TRAINING, EVERY}, named - EXPERIMENTS - {TRAINING, EVERY}


@pytest.mark.parametrize("group", [g for g in DECLARED if g.name], ids=lambda g: g.name)
def test_the_yaml_keys_of_each_group_are_its_declarations(group):
    """Each key of the group's YAML is declared, and each declaration has its YAML key (the default lives in conf/) but
    for the Lightning arguments a group passes on that conf/ leaves to Lightning's default (``added``)."""
    found = declared(group.settings, group.name)
    assert group.passes_on or not any(d.added for d in found), "only a group that passes keys on has added ones"
    in_yaml, declared_keys = group_yaml_keys(group), {d.key for d in found if not d.added}
    assert not {d.key for d in found if d.added} & in_yaml, "an added key is set in conf/: drop added=True"
    assert not in_yaml - declared_keys, f"YAML keys of {group.name} with no declaration: {sorted(in_yaml - declared_keys)}"
    assert not declared_keys - in_yaml, f"declarations with no YAML key (the default lives in conf/): {sorted(declared_keys - in_yaml)}"


def test_the_top_level_declarations_are_keys_of_config_yaml():
    top = [d.key for d in DECLARATIONS.values() if "." not in d.key]
    assert top and set(top) <= set(load(CONF / "config.yaml"))


def test_the_schema_is_the_declarations_rules():
    assert SCHEMA and all(SCHEMA[key] is DECLARATIONS[key].rule for key in SCHEMA)
    assert {key for key, d in DECLARATIONS.items() if d.rule is not None} == set(SCHEMA)


def declared_name(node: ast.AST) -> str | None:
    """The setting a literal names (``"export.tolerance"``, ``f"export.{name}"``) when it is in a declared group."""
    head = node.value if isinstance(node, ast.Constant) else None
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = node.values[0].value
    return head if isinstance(head, str) and head.split(".")[0] in GROUP_NAMES and "." in head else None


def test_no_rule_of_a_declared_setting_lives_outside_the_declarations():
    """Type, range and choice checks of a declared setting are its rule; a check function called on its name elsewhere
    restates it (task settings, task.* and data.*, have their own schemas in tasks/<task>/config_check.py)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if SETTINGS_DIR in path.parents or path.name == "config_check.py" or path == PACKAGE / "core" / "checks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CHECKS:
                if node.func.id in ("rule", "optional"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(...)")
                elif len(node.args) > 1 and declared_name(node.args[1]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(..., {declared_name(node.args[1])!r})")
    assert not found, "rules outside the declarations in headprune/settings/:\n" + "\n".join(found)


def test_no_experiment_lists_what_it_reads():
    """What an experiment reads is each setting's read_by: no READS tuple beside the experiments."""
    found = []
    for path in sorted((PACKAGE / "experiments").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [f"{path.name}:{node.lineno}" for t in targets if isinstance(t, ast.Name) and t.id == "READS"]
    assert not found, found


def test_the_study_reads_what_its_stages_read():
    for key in DECLARATIONS:
        if any(is_read(key, stage) for stage in STAGES["study"]):
            assert is_read(key, "study"), key
    assert is_read("study.alpha", "study") and not is_read("study.alpha", "prune")
    assert is_read("trainer.max_time", TRAINING) and not is_read("trainer.max_time", "ablate")  # a Trainer argument passed on
    assert not is_read("prune.nope", "prune")  # a key no declaration names is read by no one
    assert "prune.unit" in reads_of("ablate") and "prune" not in reads_of("ablate") and "speed" in reads_of("speed")
    assert "" not in checked_groups() and "logger" not in checked_groups() and "trainer" in checked_groups()


def test_docs_settings_md_is_up_to_date():
    from settings_table import render

    doc = ROOT / "docs" / "settings.md"
    assert doc.exists() and doc.read_text() == render(), "docs/settings.md is out of date: run python tools/settings_table.py"
