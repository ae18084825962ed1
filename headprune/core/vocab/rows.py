"""Vocabulary rows: one unit per token id (its embedding row, its output-head row, tied or not, and logit biases).

A model keeps a book of the original ids it holds (``VOCAB_ATTR``). A gate multiplies a token's embedding row and its
logit: a gate at 0 is the row zeroed, so on text that avoids removed tokens the kept ids' logits equal the pruned model's.
After pruning, the model reads and writes original ids (an id view: inputs mapped old -> new, logits scattered back with
0 at removed ids, as the masked model gives them) until it is saved, when its tokenizer and config are renumbered.
"""

import torch
from torch import nn

from headprune.core.site_gates import Site, broadcast_unit_gate, example_rows

GROUP = "vocab"  # the mask group: [1, vocabulary size]
VOCAB_ATTR = "_headprune_vocab"  # the model's book: {"ids": kept original ids, "size_orig": vocabulary size}
SITE_ATTR = "_headprune_vocab_site"  # the VocabSite on the input embedding and on each output head
SPECIAL_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "sep_token_id", "cls_token_id", "mask_token_id")
SPECIAL_FIELDS += ("decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")


class VocabSite(Site):
    """The gate of every token row of a model: group and path ``vocab``, layer 0, its units the kept original token ids."""

    def __init__(self, ids: list[int], size_orig: int):
        super().__init__(GROUP, GROUP, 0, size_orig, list(ids))  # probes stay []: a token is scored by how often text uses it
        self.counts = torch.zeros(size_orig, dtype=torch.float64)  # uses of each original id while recording
        self.old_to_new: torch.Tensor | None = None  # (size_orig,) the id view of a pruned model; -1 at a removed id
        self.read: torch.Tensor | None = None  # the original ids of the last call through the id view
        self.head_row = 0  # the batch row the output head's next slice starts at, under per-example gates
        self.biased = False  # a final_logits_bias is added after the head: its owner's hook, not the head's, gates and scatters

    @property
    def recording(self) -> bool:
        return self._recording

    @recording.setter
    def recording(self, value: bool) -> None:
        if value:
            self.counts = torch.zeros(self.units_orig, dtype=torch.float64)  # each probing pass counts afresh
        self._recording = bool(value)


def input_embedding(model: nn.Module) -> nn.Embedding | None:
    """The token embedding table (None: the model reads no token ids)."""
    table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return table if isinstance(table, nn.Embedding) else None


def vocab_refusal(model: nn.Module) -> str | None:
    """Why this model has no token rows to gate and remove (None: it has)."""
    if input_embedding(model) is None:
        return f"{type(model).__name__} reads no token embedding table (nn.Embedding), so it has no token rows to remove"
    return None


def token_tables(model: nn.Module) -> list[nn.Embedding]:
    """The input embedding and every other table holding its weight (an encoder-decoder's shared, encoder and decoder tables)."""
    table = input_embedding(model)
    others = [m for m in model.modules() if isinstance(m, nn.Embedding) and m is not table and m.weight is table.weight]
    return [table, *others]


def bias_owner(model: nn.Module) -> nn.Module | None:
    """The module that adds a [1, vocab] ``final_logits_bias`` to its output head's logits (BART, Marian), else None."""
    return next((m for m in model.modules() if isinstance(getattr(m, "final_logits_bias", None), torch.Tensor)), None)


def output_heads(model: nn.Module) -> list[nn.Linear]:
    """The projections that write one logit per token id (a causal or seq2seq LM's head; none for an encoder's classifier)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    table = input_embedding(model)
    if isinstance(head, nn.Linear) and table is not None and head.out_features == table.num_embeddings:
        return [head]
    return []


def vocab_book(model: nn.Module) -> dict:
    """{"ids": the original ids the model holds, "size_orig": its original vocabulary size}."""
    book = getattr(model, VOCAB_ATTR, None)
    if book is None:
        size = input_embedding(model).num_embeddings
        book = {"ids": list(range(size)), "size_orig": size}
        setattr(model, VOCAB_ATTR, book)
    return book


def _to_rows(module, args):
    """Input embedding pre-hook: a pruned model's original ids -> its rows (a removed id reads row 0, zeroed by ``_gate_rows``)."""
    site = getattr(module, SITE_ATTR)  # set with the hook (a deep copy keeps both)
    if site.old_to_new is None:
        return None
    site.read = args[0]  # the original ids of this call
    return (site.old_to_new.to(args[0].device)[args[0]].clamp(min=0), *args[1:])


def _gate_rows(module, args, output):
    """Input embedding hook: each token's row times its gate (a removed id's row: 0); counts the ids while probing."""
    site = getattr(module, SITE_ATTR)
    rows = args[0]
    ids = rows if site.old_to_new is None else site.read
    if site.recording:
        site.counts += torch.bincount(ids.flatten().cpu(), minlength=site.units_orig).double()
    if site.old_to_new is not None:
        kept = site.old_to_new.to(ids.device)[ids] >= 0
        output = output * kept.unsqueeze(-1).to(output.dtype)
    if site.gate is None:
        return output
    gate = site.gate.to(output.dtype)  # each token's gate at ``rows`` (B, T), positions of the kept rows, as (B, T, 1)
    if gate.dim() == 2:  # (B, U) -> (B, T)
        gate = example_rows(gate, rows.shape[0])
        return output * gate.gather(1, rows.reshape(rows.shape[0], -1)).reshape(rows.shape).unsqueeze(-1)
    return output * gate[rows].unsqueeze(-1)


def _gate_logits(module, args, output):
    """Output head hook: each logit times its token's gate; a pruned model's logits scattered back to the original ids."""
    site = getattr(module, SITE_ATTR)
    if site.biased:  # a bias is added after the head: its owner's hook gates and scatters head + bias as a whole
        return output
    if site.gate is not None:
        gate, rows = site.gate, output.shape[0]
        if gate.dim() == 2 and rows < gate.shape[0]:  # (B, U): a task may run the head on consecutive slices of the batch's rows
            start, site.head_row = site.head_row, (site.head_row + rows) % gate.shape[0]
            gate = gate[start : start + rows]
        output = output * broadcast_unit_gate(gate, output)
    if site.old_to_new is not None:
        output = _scattered(site, output)
    return output


def _scattered(site: VocabSite, logits: torch.Tensor) -> torch.Tensor:
    """(..., kept) logits of a pruned model -> (..., original vocabulary), 0 at removed ids, as a zeroed row gives."""
    view = site.old_to_new.to(logits.device)  # the new id of each original id, -1 at a removed one
    return logits.index_select(-1, view.clamp(min=0)).masked_fill(view < 0, 0.0)


def _gate_biased_logits(module, args, output):
    """Hook of the module adding ``final_logits_bias``: gate (head + bias) as a whole, then scatter a pruned model's logits."""
    site = getattr(module, SITE_ATTR)
    logits = output.logits if hasattr(output, "logits") else output[0]
    if site.gate is not None:  # gate x (head + bias): a removed token loses its bias with its row
        logits = logits * broadcast_unit_gate(site.gate, logits)  # (B, U) per example: beams repeat each example's rows
    if site.old_to_new is not None:
        logits = _scattered(site, logits)
    if not hasattr(output, "logits"):
        return (logits, *output[1:])
    output.logits = logits
    return output


def vocab_site(model: nn.Module) -> VocabSite:
    """The model's vocabulary site, its hooks registered once (a deep copy keeps its own)."""
    table = input_embedding(model)
    site = getattr(table, SITE_ATTR, None)
    if site is None:
        book = vocab_book(model)
        site = VocabSite(book["ids"], book["size_orig"])
        for each in token_tables(model):  # every table reading the shared rows: each maps and gates its ids
            each.register_forward_pre_hook(_to_rows)
            each.register_forward_hook(_gate_rows)
            setattr(each, SITE_ATTR, site)
        for head in output_heads(model):
            head.register_forward_hook(_gate_logits)
            setattr(head, SITE_ATTR, site)
        owner = bias_owner(model)
        if owner is not None:
            site.biased = True
            owner.register_forward_hook(_gate_biased_logits)
            setattr(owner, SITE_ATTR, site)
    return site


def id_map(model: nn.Module) -> dict[int, int]:
    """{original id: new id} of the ids a model keeps, renumbered densely in their original order."""
    return {old: new for new, old in enumerate(vocab_book(model)["ids"])}
