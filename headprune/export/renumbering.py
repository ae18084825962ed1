"""Exports whose token ids are renumbered (a kind's ``export_ids``): the check on text, the masked reference at the kept ids.

The export runs on text split by the tokenizer it ships; the masked model on the same text split by the model's own
tokenizer. A check row is a text both split into the same tokens (the shipped ids mapped back to the original ones);
the masked model's logits over every original id are compared at the kept ids, in the files' order.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from headprune.core.checks import ConfigError
from headprune.core.kinds import KINDS

ID_ROWS = ("input_ids", "decoder_input_ids")  # the token-id rows of a check batch: inputs, an encoder-decoder's decoder inputs


def real_rows(batch: dict, key: str) -> list[list[int]]:
    """Each row of ``batch[key]`` without its padding: by the attention mask (inputs) or the labels' -100 (decoder inputs)."""
    ids = batch[key]
    real = batch.get("attention_mask") if key == "input_ids" else batch["labels"] != -100 if "labels" in batch else None
    return [row[r.bool()].tolist() for row, r in zip(ids, torch.ones_like(ids) if real is None else real)]


@dataclass
class Renumbering:
    """The original ids the exported files' ids 0, 1, ... stand for (``kept``; None: the ids stay) and the tokenizer shipped."""

    kind: object = None
    kept: list[int] | None = None
    size: int = 0  # the original id count
    tokenizer: object = None

    @property
    def removed(self) -> list[int] | None:
        """The original ids the files hold no row of (None: the ids stay)."""
        return None if self.kept is None else sorted(set(range(self.size)) - set(self.kept))

    def old_to_new(self) -> torch.Tensor:
        """(size,) each original id's id in the files; -1 at a removed id."""
        table = torch.full((self.size,), -1, dtype=torch.long)
        table[torch.tensor(self.kept, dtype=torch.long)] = torch.arange(len(self.kept))
        return table

    def batches(self, tokenizer, batches: list[dict]) -> tuple[list[dict], list[dict], dict]:
        """(the reference's batches in original ids, the export's in the files' ids, how the check texts were split).

        A text both tokenizers split alike keeps its row (and its token types); another is split again by the shipped
        tokenizer (the masked model reads those tokens' original ids) where a row holds nothing but ids and a mask.
        """
        if self.kept is None:
            return batches, batches, {}
        table, kept = self.old_to_new(), torch.tensor(self.kept, dtype=torch.long)
        reference, export, counts = [], [], {"check_texts": 0, "split_alike": 0, "split_again": 0}
        for batch in batches:
            keys = [key for key in ID_ROWS if key in batch]  # an encoder-decoder's targets are text too
            rows = {key: real_rows(batch, key) for key in keys}
            split = {key: [self.split_again(tokenizer, row)[0] for row in rows[key]] for key in keys}
            n, inputs = len(batch["input_ids"]), {k: v for k, v in batch.items() if k != "labels"}  # labels: not an input
            alike = [i for i in range(n) if all([self.kept[t] for t in split[key][i]] == rows[key][i] for key in keys)]
            counts["check_texts"] += n
            if alike:
                picked = torch.tensor(alike, dtype=torch.long)  # the rows of every tensor with one row per example
                chosen = {k: v.index_select(0, picked) if v.dim() and v.shape[0] == n else v for k, v in inputs.items()}
                reference.append(chosen)
                export.append({**chosen, **{key: table[chosen[key]].clamp(min=0) for key in keys}})  # padding: a special id, kept
                counts["split_alike"] += len(alike)
            again = [i for i in range(n) if i not in set(alike)]
            if again and set(inputs) <= {"attention_mask", *ID_ROWS}:  # token types of a text split otherwise: unknown
                ids, mask = batch["input_ids"], batch.get("attention_mask", torch.ones_like(batch["input_ids"]))
                pad = int(table[int(ids[mask == 0][0])]) if bool((mask == 0).any()) else 0
                new = {key: pad_sequence([torch.tensor(split[key][i]) for i in again], batch_first=True, padding_value=pad) for key in keys}
                real = pad_sequence([torch.ones(len(split["input_ids"][i]), dtype=torch.long) for i in again], batch_first=True)
                reference.append({"attention_mask": real, **{key: kept[value] for key, value in new.items()}})
                export.append({"attention_mask": real, **new})  # (B, T) each
                counts["split_again"] += len(again)
        if not reference:
            raise ConfigError(
                f"none of the {counts['check_texts']} check texts of export.split is split alike by the exported (rewritten) "
                "tokenizer and the model's own, and their rows hold more than token ids and a mask: check on more texts "
                "(export.examples) or another split"
            )
        return reference, export, counts

    def split_again(self, tokenizer, ids: list[int], types: list[int] | None = None) -> tuple[list[int], list[int] | None]:
        """(the shipped tokenizer's ids, their token types) of the text of ``ids`` (``tokenizer``'s ids, ``types`` or none).

        Each run of ordinary tokens between special ones (and token-type changes, as a sentence pair's) is decoded by
        ``tokenizer`` and split again by the shipped one; a special token keeps its place, under its id in the files.
        """
        special, own = set(tokenizer.all_special_ids), self.kept is None
        new_id = {} if own else {old: new for new, old in enumerate(self.kept)}
        kinds = types if types is not None else [0] * len(ids)
        out, out_types, run = [], [], []

        def flush():
            if run:
                text = tokenizer.decode([ids[i] for i in run], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                split = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                out.extend(split)
                out_types.extend([kinds[run[0]]] * len(split))
                run.clear()

        for i, token in enumerate(ids):
            if token in special or (run and kinds[i] != kinds[run[0]]):
                flush()
            if token in special:
                out.append(int(token) if own else new_id[int(token)])
                out_types.append(kinds[i])
            else:
                run.append(i)
        flush()
        return out, out_types if types is not None else None

    def logits(self, reference: list[np.ndarray]) -> list[np.ndarray]:
        """The masked model's logits at the kept ids, in the files' order (logits not over the vocabulary: as they are)."""
        if self.kept is None:
            return reference
        return [r[..., self.kept] if r.shape[-1] == self.size else r for r in reference]

    def greedy(self, greedy: tuple | None) -> tuple | None:
        """The reference's greedy (prompt, tokens, eos, pad, new tokens) in the files' ids."""
        if self.kept is None or greedy is None:
            return greedy
        table = self.old_to_new()
        prompt, tokens, eos, pad, new = greedy
        mapped = table[torch.as_tensor(tokens, dtype=torch.long)].numpy()
        return table[prompt], mapped, [int(table[e]) for e in eos], int(table[pad]), new

    def apply(self, model: nn.Module) -> None:
        """Make the pruned copy read and write the files' ids (its special-token ids renumbered)."""
        if self.kind is not None:
            self.kind.to_export_ids(model)


def renumbering(model: nn.Module, tokenizer, loaded: bool = False) -> Renumbering:
    """How the exported files renumber ``model``'s token ids (asked of every kind), with the tokenizer they ship.

    ``loaded``: ``model`` is a saved pruned model loaded again, which reads and writes the files' ids already."""
    for kind in KINDS.values():
        found = kind.held_ids(model) if loaded else kind.export_ids(model)
        if found is not None:
            return Renumbering(kind, found[0], found[1], kind.export_tokenizer(model, tokenizer))
    return Renumbering(tokenizer=tokenizer)
