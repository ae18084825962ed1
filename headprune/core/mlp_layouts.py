"""The layout of a family's feed-forward blocks: where they live and which projections hold their neurons (a ``Family`` row's ``mlp``)."""

import re
from dataclasses import dataclass


def site(path: str, group: str, *fields: str) -> tuple[str, ...]:
    """A ``sites`` entry: a module path (``*`` for the layer number) matched at the end of a module's path, its group, and
    the entry's other fields."""
    return r"(?:^|\.)" + re.escape(path).replace(r"\*", r"(\d+)") + "$", group, *fields


FFN_GROUPS = ("enc_ffn", "dec_ffn")  # the encoder's and the decoder's feed-forward blocks


@dataclass(frozen=True)
class MLPLayout:
    """How to find and slice the feed-forward blocks of one model family."""

    sites: tuple[tuple[str, str, str], ...]  # (regex on the module path with one (\d+) for the layer, group, config field of its width)
    up: tuple[str, ...]  # paths from that module to the projections whose output rows are the neurons (those it has)
    down: str  # path from that module to the projection whose input columns are the neurons
    blocks: int = 1  # neuron row blocks stacked in each up projection (2: a fused [gate | up] projection)
