"""Mask files: a prune, speed or export results.json, or a mask JSON; each says its unit, layout and candidates."""

import json
from dataclasses import dataclass, field
from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import KINDS, mask_kinds, unit_kinds, unit_name
from headprune.results.points import point_name, removed_fraction
from headprune.results.readers import check_binary_mask
from headprune.results.stream_points import REMOVE

ACTION_WORDS = {
    "remove": "the unit is removed from the weights",
    "stream": "the unit keeps its weights and attends to a sink and a recent window only",
}


@dataclass
class Candidate:
    """One mask a file holds: its method (order, or a Pareto point's method), fraction asked and step."""

    method: str | None
    fraction: float | None
    step: str | None
    mask: dict
    removed: int
    point: dict | None = None

    def describe(self, setting: str) -> str:
        """How to pick it: ``fisher at 33% (3 of 9 units): export.mask_order=fisher export.fraction=0.333334``."""
        picks = [f"{setting}.mask_order={self.method}"] if self.method else []
        if self.point is not None:
            picks.append(f"{setting}.mask_step={self.step}")
        elif self.fraction is not None:
            picks.append(f"{setting}.fraction={self.fraction:g}")
        what = self.method or "the mask"
        at = f" at {self.step}" if self.point is not None else (f" at fraction {self.fraction:g}" if self.fraction is not None else "")
        return f"{what}{at} ({self.removed} {'unit' if self.removed == 1 else 'units'} removed): {' '.join(picks) or 'no setting needed'}"


@dataclass
class MaskFile:
    """A mask file read: the unit and layout it records (None when it does not say), its candidates, the model it was made for."""

    path: Path
    unit: str | None
    layout: str | None
    model_fingerprint: str | None
    candidates: list[Candidate] = field(default_factory=list)
    single_mask: bool = False  # a mask JSON, or a speed or export run's results.json: its one mask, whatever the settings
    controls: list[dict] = field(default_factory=list)  # a prune run's control points (the unpruned model given the fine-tune)
    experiment: str | None = None  # the experiment whose results.json it is (None: a mask JSON or another file)
    action: str | None = None  # what its masks' zeros do: remove (None: files that do not say) or stream (prune.action=stream)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The unit kinds its masks hold: the recorded unit's, else those its masks' group names say (() when it holds none)."""
        if self.unit is not None:
            return unit_kinds(self.unit)
        return mask_kinds({g for c in self.candidates for g in c.mask})  # mask_file_of checked that a kind owns each


FORMS = (
    "a mask file is the results.json of a prune run (or of a study, a speed or an export run) or a mask JSON "
    '{"mask": {group: [[1 or 0 per head] per layer]}} (group: enc_self, enc_dec or dec_self; 0 removes the head)'
)


def read_mask_payload(path: Path, setting: str) -> dict:
    """The JSON object of a mask file; a missing, empty, unreadable or non-object one is a ConfigError naming the setting."""
    where = f"{setting}.mask_file={path}"
    if path.is_dir():
        inside = f" (did you mean {path / 'results.json'}?)" if (path / "results.json").is_file() else ""
        raise ConfigError(f"{where} is a directory{inside}: {FORMS}")
    if not path.is_file():
        raise ConfigError(f"{where} does not exist ({path.resolve()}): {FORMS}")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        what = "empty (an interrupted write or copy?)" if not text.strip() else f"not valid JSON ({err}; a damaged copy, or another file?)"
        raise ConfigError(f"{where} is {what}: no mask can be read from it; {FORMS}") from None
    if not isinstance(payload, dict):
        raise ConfigError(f"{where} holds a JSON {type(payload).__name__}, not an object: {FORMS}")
    return payload


def _units(mask: dict) -> int:
    return sum(1 for rows in mask.values() for row in rows for value in row if value == 0)


def read_mask_file(path, setting: str = "speed", action: str = "remove") -> MaskFile:
    """Every mask of a mask file with its method, fraction and step, checked binary and of the reader's ``action`` (else a ConfigError)."""
    path = Path(str(path))
    found = mask_file_of(read_mask_payload(path, setting), path, setting)
    if (REMOVE if found.action is None else found.action) != action:  # a file that names no action removes
        raise ConfigError(
            f"{setting}.mask_file={path} holds the patterns of a prune.action={found.action} run (0 = {ACTION_WORDS.get(found.action, found.action)}), "
            f"and {setting} takes masks whose 0 means {ACTION_WORDS.get(action, action)}: give the results.json of a run with "
            f"prune.action={action}"
        )
    return found


def mask_file_of(payload: dict, path: Path, setting: str = "speed") -> MaskFile:
    """The masks of a mask file's JSON ``payload`` (see ``read_mask_file``)."""
    lists_of_rows = all(isinstance(rows, list) and all(isinstance(row, list) for row in rows) for rows in payload.values())
    if payload and "mask" not in payload and lists_of_rows:  # a mask's {group: rows} without its {"mask": ...} wrapper
        raise ConfigError(
            f"{setting}.mask_file={path} holds a bare mask {{group: rows}} (groups {list(payload)}) without its wrapper: "
            f'a mask JSON puts it under "mask", as {{"mask": {{"{next(iter(payload))}": [[1, 0, ...], ...]}}}}; '
            "write the file's object there"
        )
    results = payload.get("results") if isinstance(payload.get("results"), dict) else {}
    sections = [results, results.get("prune") or {}, results.get("pareto") or {}]  # a prune run; a study's prune and pareto stages
    recorded = next((s["unit"] for s in sections if s.get("unit") is not None), None)
    try:  # the canonical unit ("head+ffn" for ["ffn", "head"] too), None when it records none
        unit = None if recorded is None else unit_name(recorded)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{setting}.mask_file={path} records prune.unit={recorded!r}, which is no registered unit kind ({', '.join(KINDS)}): "
            "register the kind that wrote it (register_kind) before reading the file"
        ) from None
    layout = next((s["layout"] for s in sections if s.get("layout")), None)
    made_for = (payload.get("fingerprints") or {}).get("model") or payload.get("model_fingerprint")
    action = next((s["action"] for s in sections if isinstance(s.get("action"), str)), None)
    found = MaskFile(path, unit, layout, made_for, experiment=payload.get("experiment"), action=action)
    read_candidates(found, payload, sections, setting)
    try:
        mask_kinds({g for c in found.candidates for g in c.mask}, unit)
    except ValueError as err:
        raise ConfigError(f"{setting}.mask_file={path}: {err}") from None
    return found


def read_candidates(found: MaskFile, payload: dict, sections: list[dict], setting: str) -> None:
    """Every mask of a mask file's ``payload`` into ``found.candidates``: its one mask, or its points and orders' steps."""
    path, results = found.path, payload.get("results") if isinstance(payload.get("results"), dict) else {}
    if "mask" in payload or isinstance(results.get("mask"), dict):
        mask = payload["mask"] if "mask" in payload else results["mask"]
        check_binary_mask(mask, f"{setting}.mask_file={path}")
        origin = (payload.get("inputs") or {}) if "mask" not in payload else {}
        found.candidates.append(Candidate(origin.get("mask_order"), None, None, mask, _units(mask)))
        found.single_mask = True
        return
    for section in sections:
        for point in section.get("points") or []:
            if point.get("control"):  # no mask: the unpruned model, fine-tuned like the pruned ones
                found.controls.append(point)
            elif "mask" in point:  # the unpruned point has none
                where = f"{path} (Pareto point {point_name(point)} {point.get('step')})"
                check_binary_mask(point["mask"], where)
                found.candidates.append(
                    Candidate(point_name(point), point.get("fraction"), point["step"], point["mask"], _units(point["mask"]), point)
                )
        for order, result in (section.get("orders") or {}).items():
            for step in result.get("steps", []):
                check_binary_mask(step.get("mask") or {}, f"{path} (order {order}, fraction {step.get('fraction')})")
                found.candidates.append(Candidate(order, float(step["fraction"]), None, step["mask"], _units(step["mask"]), None))
        if found.candidates:
            break


def choose_candidate(found: MaskFile, order: str | None, fraction: float | None, step: str | None, setting: str) -> Candidate:
    """The one candidate the settings pick (None: not given); none or several left is a ConfigError listing them and how to pick each."""
    if not found.candidates:
        of = f" (it is the results.json of experiment={found.experiment})" if found.experiment else ""
        raise ConfigError(f"{setting}.mask_file={found.path} holds no mask{of}: {FORMS}")
    if found.single_mask:
        return found.candidates[0]
    usable = [c for c in found.candidates if c.removed > 0]
    pool = [c for c in usable if (order is None or c.method == order) and (step is None or c.step == step)]
    if fraction is not None and step is None and not (len(pool) == 1 and pool[0].point is not None):
        pool = [c for c in pool if _same_fraction(c, fraction)]
    if len(pool) == 1:
        return pool[0]
    listed = "; ".join(c.describe(setting) for c in usable) or "none removes any unit"
    given = (("mask_order", order), ("fraction", fraction), ("mask_step", step))
    asked = ", ".join(f"{setting}.{name}={value}" for name, value in given if value is not None)
    methods = sorted({str(c.method) for c in usable})
    if order is not None and order not in methods:
        what = "Pareto points of" if any(c.point is not None for c in usable) else "order"
        raise ConfigError(f"{setting}.mask_file={found.path} has no {what} {order!r}; it has {methods}. It holds: {listed}")
    empty = [c for c in found.candidates if c.removed == 0 and (order is None or c.method == order)]
    if not pool and fraction is not None and any(_same_fraction(c, fraction) for c in empty):
        raise ConfigError(
            f"{setting}.mask_file={found.path}: the chosen mask removes no head: the pruned model would be the unpruned one; "
            f"it holds: {listed}"
        )
    if not pool and fraction is not None and step is None:
        raise ConfigError(f"{setting}.mask_file={found.path} has no step at fraction {fraction} for order {order!r}; it holds: {listed}")
    if not pool:
        raise ConfigError(
            f"{setting}.mask_file={found.path} has no mask {('for ' + asked) if asked else 'that removes any unit'}; it holds: {listed}"
        )
    raise ConfigError(f"{setting}.mask_file={found.path} holds {len(pool)} masks{(' for ' + asked) if asked else ''}: pick one: {listed}")


def _same_fraction(candidate: Candidate, fraction: float) -> bool:
    """A plain step at the fraction asked, or a Pareto point of that fraction (asked, or removed)."""
    if candidate.fraction is not None and round(candidate.fraction, 6) == round(fraction, 6):
        return True
    point = candidate.point
    return point is not None and round(removed_fraction(point), 6) == round(fraction, 6)


def mask_for_model(found: MaskFile, chosen: Candidate, gates, model, setting: str) -> dict:
    """The chosen mask as tensors in ``gates``' unit, checked against ``model`` (the fingerprint it was made for, its shape)."""
    from headprune.results.run_dir import mask_from_json
    from headprune.results.writer import model_fingerprint

    if found.model_fingerprint and found.model_fingerprint != model_fingerprint(model):
        raise ConfigError(
            f"{setting}.mask_file={found.path} was made for another model (fingerprint {found.model_fingerprint}, "
            f"this model is {model_fingerprint(model)}): use the same model.pretrained"
        )
    try:
        return gates.normalize_mask(mask_from_json(chosen.mask), hard=True)
    except ValueError as err:
        raise ConfigError(f"{setting}.mask_file={found.path} does not fit this model: {err}") from None
