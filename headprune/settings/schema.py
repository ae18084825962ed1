"""What the settings declarations say, gathered: every setting's rule (``SCHEMA``) and the experiments that read it."""

from headprune.settings import DECLARED
from headprune.settings.declare import EVERY, STAGES, Declared, declared

DECLARATIONS: dict[str, Declared] = {d.key: d for group in DECLARED for d in declared(group.settings, group.name)}
SCHEMA = {key: d.rule for key, d in DECLARATIONS.items() if d.rule is not None}


def readers(read_by) -> frozenset[str]:
    """The experiments that read a setting declared ``read_by``: an experiment whose stages read it reads it too."""
    direct = set(read_by)
    return frozenset(direct | {name for name, stages in STAGES.items() if direct & set(stages)})


def read_by(key: str) -> frozenset[str]:
    """Who reads a dotted key: the readers of its declaration or of the setting it lies within (``prune.target.speedup``:
    ``prune.target``), a group's ``passes_on`` for a key it passes on (the top level for a key without a dot), else no one."""
    parts = key.split(".")
    within = [".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in DECLARATIONS]
    if within:
        return readers(DECLARATIONS[within[0]].read_by)
    group = next((g for g in DECLARED if g.name == (parts[0] if "." in key else "")), None)
    return readers(group.passes_on) if group else frozenset()


def is_read(key: str, reader: str) -> bool:
    """Whether ``reader`` (an experiment name, or ``TRAINING``) reads a dotted key."""
    who = read_by(key)
    return reader in who or EVERY in who


def checked_groups() -> list[str]:
    """The groups a run may hold settings of that it does not read (every group but those every experiment reads)."""
    return [g.name for g in DECLARED if any(EVERY not in readers(d.read_by) for d in declared(g.settings, g.name))]


def reads_of(reader: str) -> list[str]:
    """What ``reader`` reads of the checked groups: a group's name when it reads all of it, else its dotted keys."""
    shown = []
    for name in checked_groups():
        group = next(g for g in DECLARED if g.name == name)
        keys = [d.key for d in declared(group.settings, name)]
        read = [key for key in keys if is_read(key, reader)]
        whole = read == keys and (not group.passes_on or reader in readers(group.passes_on))
        shown += [name] if whole else read
    return shown
