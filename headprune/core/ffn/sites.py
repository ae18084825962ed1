"""FFN sites: a model's feed-forward blocks, found by the family's MLP layout, and the neuron gate on their down projection."""

from dataclasses import dataclass

from torch import nn

from headprune.core.attention.tensors import gate_input_of
from headprune.core.families import FFN_GROUPS, MLPLayout, family_for, family_of_type, match_site
from headprune.core.projections import in_features
from headprune.core.site_gates import Site, alias, kept_on, ordered_sites

SITE_ATTR = "_headprune_ffn_site"  # the site, on its MLP module (a deep copy gets its own)


@dataclass(eq=False)
class FFNSite(Site):
    """One feed-forward block: its projections, and its intermediate neurons as its units (``neuron_ids``)."""

    module: nn.Module  # the module the layout's paths start from
    layout: MLPLayout
    config_field: str  # the model config field holding this block's width
    gate_at, unit_width = "output", 1  # gated at the down projection's input, one column per neuron (``gate_input_of``)

    neuron_ids = alias("unit_ids")  # original ids of the neurons still present, in weight order
    width_orig = alias("units_orig")
    width = alias("num_units")  # neurons present (0 for an emptied block)
    computed_width = alias("computed_units")  # the present neurons, or the one zero phantom of an emptied block

    def up_paths(self) -> list[str]:
        """The layout's up projections this block has (T5: ``wi``, or ``wi_0`` and ``wi_1``)."""
        paths = dict(self.module.named_modules())
        return [p for p in self.layout.up if p in paths]

    def projection(self, path: str) -> nn.Module:
        return self.module.get_submodule(path)

    def down(self) -> nn.Module:
        return self.projection(self.layout.down)

    def set_projection(self, path: str, module: nn.Module) -> None:
        self.module.set_submodule(path, module)


def mlp_layout_of(model: nn.Module):
    """The model's MLP layout, or a ValueError naming the model type whose family row declares none."""
    family = family_for(model)
    if family.mlp is None:
        raise ValueError(
            f"model type {model.config.model_type!r} ({family.name} family) has no MLP layout in headprune's family table, "
            "so its FFN neurons cannot be gated or pruned: add mlp=MLPLayout(...) to its row in headprune/core/families.py"
        )
    return family.mlp


def mlp_layout_refusal(fields: dict, settings=None) -> str | None:
    """Why a model with these config fields (any ``settings``) has no feed-forward blocks to gate: its family declares no MLP layout."""
    family = family_of_type(fields.get("model_type"))
    if family is None or family.mlp is not None:
        return None
    return (
        f"its units live in feed-forward blocks, and the {family.name} family declares no MLP layout: use prune.unit=head, "
        "or add its mlp=... to the family's row in headprune/core/families.py"
    )


def find_ffn_sites(model: nn.Module) -> list[FFNSite]:
    """All feed-forward blocks of a model, ordered by group then layer (a ValueError where the family has no MLP layout)."""
    layout = mlp_layout_of(model)
    sites = [
        kept_on(module, SITE_ATTR, lambda: _new_site(path, module, layout, matched))
        for path, module in model.named_modules()
        if (matched := match_site(layout.sites, path)) is not None
    ]
    return ordered_sites(sites, FFN_GROUPS, f"found no feed-forward blocks in {type(model).__name__} for the MLP layout {layout.sites}")


def _new_site(path: str, module: nn.Module, layout: MLPLayout, matched: tuple[str, int, str]) -> FFNSite:
    """A feed-forward block's site with every neuron present."""
    group, layer, config_field = matched
    width = in_features(module.get_submodule(layout.down))
    site = FFNSite(path, group, layer, width, list(range(width)), module, layout, config_field)
    if not site.up_paths():
        raise ValueError(f"{path} has none of the up projections {layout.up} its family's MLP layout names")
    return site


def ffn_sites_if_any(model: nn.Module) -> list[FFNSite]:
    """The model's feed-forward blocks, or [] where its family declares no MLP layout or none of its modules matches."""
    if family_for(model).mlp is None:
        return []
    try:
        return find_ffn_sites(model)
    except ValueError:
        return []


def attach_neuron_gate(site: FFNSite) -> None:
    """Register the gate hook on the site's down projection once (again after pruning replaced it)."""
    gate_input_of(site.down(), site)
