"""Removing token rows: the embedding's and the output head's rows (ties kept), config.vocab_size, and the id renumbering."""

import torch
from torch import nn

from headprune.core.hidden.pruning import Slicer
from headprune.core.masks import hard_mask
from headprune.core.site_gates import Site, removed_record
from headprune.core.vocab.rows import GROUP, SPECIAL_FIELDS, VOCAB_ATTR, id_map, output_heads, token_tables, vocab_book, vocab_site


def prune_vocab_mask(model: nn.Module, mask) -> dict:
    """Remove every token whose entry of ``mask`` ({"vocab": [1, V]}) is 0 from every token table; returns the record."""
    book, site, tables = vocab_book(model), vocab_site(model), token_tables(model)
    row = hard_mask(mask, {GROUP: (1, book["size_orig"])}, "removing tokens", unit="token")[GROUP]
    positions = torch.tensor([p for p, i in enumerate(book["ids"]) if row[0, i] != 0], dtype=torch.long)  # kept rows now
    heads, slicer = output_heads(model), Slicer(positions)  # an output head tied to the table keeps the one sliced tensor
    for table in tables:  # tables sharing the rows keep sharing the one sliced tensor
        slicer.take(table, 0, "weight")
        table.num_embeddings = len(positions)
        if table.padding_idx is not None:
            rows = positions.tolist()
            table.padding_idx = rows.index(table.padding_idx) if table.padding_idx in rows else None
    for head in heads:
        slicer.take(head, 0, "weight", "bias")
        head.out_features = len(positions)
    for module in model.modules():  # BART / Marian: a [1, vocab] bias added beside the head
        if isinstance(getattr(module, "final_logits_bias", None), torch.Tensor):
            slicer.take(module, 1, "final_logits_bias")
    book["ids"] = [book["ids"][p] for p in positions.tolist()]
    model.config.vocab_size = len(book["ids"])
    if getattr(model.config, "decoder_vocab_size", None) is not None:  # Marian sizes its head and bias by this field
        model.config.decoder_vocab_size = len(book["ids"])
    site.unit_ids = list(book["ids"])
    old_to_new = torch.full((book["size_orig"],), -1, dtype=torch.long)
    old_to_new[torch.tensor(book["ids"], dtype=torch.long)] = torch.arange(len(book["ids"]))
    site.old_to_new = old_to_new  # the model still reads and writes original ids until it is saved
    return vocab_record(model)


def vocab_record(model: nn.Module) -> dict:
    """{"vocab": {"0": removed original ids}} (empty when every token is kept)."""
    book = getattr(model, VOCAB_ATTR, None)  # the vocabulary's record as one site's
    return removed_record([Site(GROUP, GROUP, 0, book["size_orig"], book["ids"])]) if book else {}


def renumbered_ids(config, mapping: dict[int, int]) -> dict[str, object]:
    """{field: new value} of the config's special-token ids (a list of ids, as eos may be, renumbered each)."""
    out = {}
    for field in SPECIAL_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int):
            out[field] = mapping.get(value, value)
        elif isinstance(value, list) and all(isinstance(v, int) for v in value):
            out[field] = [mapping.get(v, v) for v in value]
    return out


def set_ids(model: nn.Module, values: dict[str, object]) -> None:
    """Set special-token id fields on the config and the generation config."""
    for config in (model.config, getattr(model, "generation_config", None)):
        for field, value in values.items():
            if config is not None and hasattr(config, field):
                setattr(config, field, value)


def vocab_meta(model: nn.Module) -> dict | None:
    """What save_pruned writes for the vocab kind: the original size, the kept ids and the old -> new map of special ids."""
    book = getattr(model, VOCAB_ATTR, None)
    if not book or len(book["ids"]) == book["size_orig"]:
        return None
    specials = renumbered_ids(model.config, id_map(model))
    return {"vocab_size_orig": book["size_orig"], "kept_ids": list(book["ids"]), "special_ids": specials}


def vocab_flops_table(model: nn.Module, seq_len: int) -> dict[str, torch.Tensor]:
    """{"vocab": [1, V + 1]}: FLOPs per example with 0..V tokens kept (the output heads' rows; an embedding lookup costs none)."""
    size = vocab_book(model)["size_orig"]
    per_token = sum(2 * head.in_features * seq_len for head in output_heads(model))
    return {GROUP: (torch.arange(size + 1, dtype=torch.float64) * per_token).unsqueeze(0)}
