"""How a setting is declared: one dataclass field carrying its rule and its readers; the schema and docs/settings.md derive from it."""

from dataclasses import Field, dataclass, field, fields

from headprune.core.checks import Rule, integer, number, optional, rule, string_list, text

EVERY = "every experiment"  # read by every run (the top-level keys, the logger)
TRAINING = "training"  # a task's trainer (the experiments whose module says TRAINS: nli_finetune, mt_train, vit_finetune) and the study's train stage
# An experiment reads what its stages read (the study's ablate and keep_one stages read study.* and prune.unit).
STAGES = {"study": ("prune", "speed", TRAINING)}

COUNT = rule(integer, low=1)  # the rules many settings share
POSITIVE = rule(number, low=0.0, closed="()")
FRACTION = rule(number, low=0.0, high=1.0)
PROBABILITY = rule(number, low=0.0, high=1.0, closed="()")
NAME = rule(text)
MAYBE_NAME = optional(rule(text))
NAMES = rule(string_list)


def setting(check: Rule | None = None, read_by: tuple[str, ...] = (), accepts: str | None = None, added: bool = False) -> Field:
    """A setting's declaration: its rule (None: checked elsewhere), what it ``accepts``, its readers; ``added``: set only by ``+key=``."""
    return field(metadata={"rule": check, "read_by": tuple(read_by), "accepts": accepts, "added": added})


def section(cls) -> Field:
    """A field holding a nested settings group (e.g. ``prune.finetune``); its fields declare its settings."""
    return field(metadata={"section": cls})


@dataclass(frozen=True)
class Declared:
    """One declared setting: its dotted key, rule, readers and what it accepts in words."""

    key: str
    rule: Rule | None
    read_by: tuple[str, ...]
    accepts: str
    added: bool  # not in conf/: given with +key=value only


@dataclass(frozen=True)
class Group:
    """A settings group: its key ("" for the top level), its dataclass, and ``passes_on``: who reads the keys it passes on undeclared."""

    name: str
    settings: type
    passes_on: tuple[str, ...] = ()


def declared(cls, prefix: str = "") -> list[Declared]:
    """Every setting a settings dataclass declares (nested sections too), keyed under ``prefix``."""
    found = []
    for f in fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if "section" in f.metadata:
            found += declared(f.metadata["section"], key)
        else:
            check = f.metadata["rule"]
            accepts = str(check) if check else f.metadata["accepts"] or str(f.type)
            found.append(Declared(key, check, f.metadata["read_by"], accepts, f.metadata["added"]))
    return found
