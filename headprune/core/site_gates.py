"""The ``Site`` every kind's sites derive from, and what every gates object over such sites shares: groups, masks, probes."""

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from headprune.core.masks import normalize_mask


@dataclass(eq=False)
class Site:
    """Where one kind's gate acts: its module path, group and layer, the original ids of its units present, its gate and probes."""

    path: str  # the gated module's path
    group: str  # its mask group
    layer: int  # its original layer id in the group
    units_orig: int  # its units in the original model
    unit_ids: list[int]  # original ids of the units still present, in weight order
    gate: torch.Tensor | None = field(default=None, kw_only=True)  # (U,) or (B, U) over the present units; None = no gating
    probes: list[torch.Tensor] = field(default_factory=list, kw_only=True)  # per-token gate probes (..., U)
    recording: bool = field(default=False, kw_only=True)  # add a probe per forward while gate gradients are recorded
    stack_layers: int = field(default=0, kw_only=True)  # layers of its stack in the original model (0: as many as the sites say)

    @property
    def has_units(self) -> bool:
        """Whether any unit is left (an emptied site computes only its zero phantom, which is not scored)."""
        return bool(self.unit_ids)

    @property
    def num_units(self) -> int:
        """Units present (0 for an emptied site)."""
        return len(self.unit_ids)

    @property
    def computed_units(self) -> int:
        """Units the site computes: the present ones, or the one zero phantom of an emptied site."""
        return max(len(self.unit_ids), 1)

    def keep(self, positions: list[int]) -> None:
        """Keep only the units at these weight positions, and their gate entries (none kept: the zero phantom's one)."""
        if self.gate is not None:
            self.gate = self.gate[..., positions] if positions else self.gate[..., :1] * 0
        self.unit_ids = [self.unit_ids[pos] for pos in positions]


def broadcast_unit_gate(gate: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Reshape a gate (U,) or (B, U) to multiply units on the last axis of (B', ..., U) or (B' * T, U) (example-major rows)."""
    gate = gate.to(dtype=hidden.dtype, device=hidden.device)
    if gate.dim() == 1:
        return gate
    gate = example_rows(gate, hidden.shape[0])
    return gate.view(gate.shape[0], *[1] * (hidden.dim() - 2), gate.shape[-1])


def example_rows(gate: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-example gates (B, ...) for ``rows`` = k x B rows, each example's k in a row (beams, OPT's flattened (B * T, W) tokens)."""
    if rows % gate.shape[0]:
        raise ValueError(f"per-example mask has {gate.shape[0]} rows but the gated input has {rows}")
    return gate.repeat_interleave(rows // gate.shape[0], dim=0)


def gate_and_probe(site, hidden: torch.Tensor, probe_shape=None) -> torch.Tensor | None:
    """What multiplies ``hidden``: the site's gate (``broadcast_unit_gate``) times a fresh probe of ``probe_shape`` (default:
    ``hidden``'s) while gate gradients are recorded; None: neither. d loss / d probe = g * d loss / d g at this use."""
    scale = None if site.gate is None else broadcast_unit_gate(site.gate, hidden)
    if site.recording and torch.is_grad_enabled():
        shape = hidden.shape if probe_shape is None else probe_shape
        probe = torch.ones(shape, dtype=hidden.dtype, device=hidden.device, requires_grad=True)
        site.probes.append(probe)
        scale = probe if scale is None else scale * probe
    return scale


def alias(name: str) -> property:
    """Attribute ``name`` of a site under a kind's own word (``head_ids`` for ``unit_ids``), read and written."""
    return property(lambda site: getattr(site, name), lambda site, value: setattr(site, name, value))


def kept_on(module, attr: str, make):
    """What is kept on ``module`` under ``attr`` (a site, a hook's handle), else ``make()``'s, kept there from now on."""
    if getattr(module, attr, None) is None:
        setattr(module, attr, make())
    return getattr(module, attr)


def ordered_sites(sites: list, groups: tuple[str, ...], missing: str) -> list:
    """``sites`` by group (in the order of ``groups``) then layer; a ValueError saying ``missing`` where there are none."""
    if not sites:
        raise ValueError(missing)
    return sorted(sites, key=lambda s: (groups.index(s.group), s.layer))


def removed_record(sites: list) -> dict[str, dict[str, list[int]]]:
    """{group: {layer (str): [removed original unit ids]}} of a list of sites ({} when nothing is removed)."""
    record: dict[str, dict[str, list[int]]] = {}
    for site in sites:
        removed = sorted(set(range(site.units_orig)) - set(site.unit_ids))
        if removed:
            record.setdefault(site.group, {})[str(site.layer)] = removed
    return record


def unit_groups(sites: list, units=lambda site: site.units_orig) -> dict[str, tuple[int, int]]:
    """{group: (layers, units per layer in the original model)} of a list of sites (``units``: a site's, in the original model)."""
    shape = {}
    for site in sites:
        layers, most = shape.get(site.group, (0, 0))
        shape[site.group] = (max(layers, site.layer + 1, site.stack_layers), max(most, units(site)))
    return shape


class SiteGateMethods:
    """``ones``, ``num_heads``, ``normalize_mask``, ``masked`` and ``probing`` for gates with ``groups``, ``sites`` and ``set_mask``."""

    noun = "unit"  # one unit, in messages

    def ones(self) -> dict[str, torch.Tensor]:
        """A mask that keeps every unit."""
        return {g: torch.ones(layers, units) for g, (layers, units) in self.groups.items()}

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """Check a mask against the model: {group: [L, U] or [B, L, U]} (``hard``: 0/1 only)."""
        return normalize_mask(mask, self.groups, hard=hard, unit=self.noun)

    @property
    def num_heads(self) -> int:
        """Units of the original model, all groups (heads, KV groups, neurons, blocks, or their sum)."""
        return sum(layers * units for layers, units in self.groups.values())

    @contextmanager
    def masked(self, mask):
        """Run a block with ``mask`` set, restoring the previous gates afterwards."""
        previous = [site.gate for site in self.sites]
        self.set_mask(mask)
        try:
            yield self
        finally:
            for site, gate in zip(self.sites, previous):
                site.gate = gate

    @contextmanager
    def probing(self):
        """Record per-token gate probes on every forward, to read gate gradients after backward."""
        for site in self.sites:
            site.recording, site.probes = True, []
        try:
            yield self
        finally:
            for site in self.sites:
                site.recording, site.probes = False, []


class SharedGates(SiteGateMethods):
    """Gates made of other kinds' gates (``shared``: {kind name: the gates that act}): their sites, removal and summary."""

    @property
    def sites(self) -> list:
        """Every site of the gates that act, each once."""
        return list({id(site): site for part in self.shared.values() for site in part.sites}.values())

    def set_mask(self, mask) -> None:
        """Set each of the gates that act to what ``mask`` sets on them (``None``, or a kind the mask leaves out: no gates)."""
        base = {} if mask is None else self.base_masks(mask)
        for kind, part in self.shared.items():
            part.set_mask(base.get(kind))

    def remove(self) -> None:
        for part in [*self.shared.values()][::-1]:
            part.remove()

    def describe(self) -> str:
        return "\n".join(part.describe() for part in self.shared.values())


class SiteGates(SiteGateMethods):
    """Gates on the units of a list of sites, by original id: masks {group: [layers, units]} or [batch, layers, units]."""

    unit = "unit"  # the kind's name
    find = None  # the kind's sites of a model, found once (a staticmethod: model -> [Site])
    attach = staticmethod(lambda site: None)  # hook a site's gate onto its module, once

    def __init__(self, model):
        self.model = model
        self.sites = self.find(model)
        for site in self.sites:
            self.attach(site)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, units per layer in the original model)}."""
        return unit_groups(self.sites)

    def site(self, group: str, layer: int):
        """The site of one group and layer."""
        for site in self.sites:
            if site.group == group and site.layer == layer:
                return site
        raise IndexError(f"no {self.noun}s in group {group!r} layer {layer}: groups are {self.groups}")

    def present(self) -> dict[str, torch.Tensor]:
        """{group: bool [layers, units]}: True where a unit is still in the weights."""
        out = {g: torch.zeros(layers, units, dtype=torch.bool) for g, (layers, units) in self.groups.items()}
        for site in self.sites:
            out[site.group][site.layer, site.unit_ids] = True
        return out

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{this kind: the checked mask}: what the mask gates, by the kind of gates that act."""
        return {self.unit: self.normalize_mask(mask, hard=hard)}

    def set_mask(self, mask) -> None:
        """Gate every unit by ``mask``; ``None`` removes all gates, and groups left out are not gated."""
        mask = {} if mask is None else self.normalize_mask(mask)
        for site in self.sites:
            value = mask.get(site.group)
            if value is None:
                site.gate = None
                continue
            ids = torch.tensor(site.unit_ids or [0], dtype=torch.long, device=value.device)
            gate = value[..., site.layer, :].index_select(-1, ids)
            site.gate = gate if site.unit_ids else gate * 0  # an emptied site's phantom unit stays zero

    def remove(self) -> None:
        """Clear every gate (the hooks stay, and do nothing without a gate)."""
        self.set_mask(None)

    def describe(self) -> str:
        """A one-line-per-group summary: the units per layer of the original model, and those present in each layer."""
        present = self.present()
        return "\n".join(
            f"{group:9s} layers={layers} {self.noun}s/layer={units} present={present[group].sum(-1).tolist()}"
            for group, (layers, units) in self.groups.items()
        )


class ModelWideGates(SiteGates):
    """Gates of a kind with one group for the whole model (``refusal``: why a model has none), its sites found afresh on each read: another kind's pruning may have replaced the modules they hook."""

    refusal = staticmethod(lambda model: None)  # model -> why it has no such units to gate (None: it has)

    def __init__(self, model):
        reason = self.refusal(model)
        if reason:
            raise ValueError(reason)
        self.model = model
        self.find(model)  # hooks the sites

    @property
    def sites(self) -> list:
        return self.find(self.model)
