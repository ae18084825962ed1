"""The vocab kind: token ids, each its embedding row and its output-head row (tied or not, with its bias); mask {"vocab": [1, V]}."""

import torch

from headprune.core.checks import ConfigError
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.site_gates import ModelWideGates
from headprune.core.vocab.merges import merge_closed_scores, merge_parts
from headprune.core.vocab.pruning import prune_vocab_mask, renumbered_ids, set_ids, vocab_flops_table, vocab_meta, vocab_record
from headprune.core.vocab.rows import GROUP, SITE_ATTR, VOCAB_ATTR, input_embedding, vocab_book, vocab_refusal, vocab_site
from headprune.core.vocab.scores import token_loss_scores
from headprune.core.vocab.tokenizer import floor_ids, rewrite_saved_tokenizer, rewritten_tokenizer, tokenizer_json

SAVED_IDS = "_headprune_vocab_original_ids"  # the config's special ids while save_pruned writes the renumbered ones


class VocabGates(ModelWideGates):
    """Gates on every token row of a model: one [1, V] group named ``vocab``."""

    unit, noun = "vocab", "token"
    find, refusal = staticmethod(lambda model: [vocab_site(model)]), staticmethod(vocab_refusal)


class VocabKind(UnitKind):
    """Token ids: rows of the input embedding and of the output head, one group for the whole model."""

    name, noun, parts, groups, config_fields = "vocab", "token", ("vocabulary",), (GROUP,), ("vocab_size",)
    unit_fields = config_fields
    ablation = (
        "removing one token at a time is no useful pruning order: a vocabulary holds thousands of tokens and the order would need "
        "one evaluation each; tokens are ranked by how often the importance data uses them (prune.order=importance or fisher)"
    )
    keep_one = "the vocabulary is one group of one row, not layers of units: keeping each layer's best token measures nothing"
    rearrangement = "tokens form one group shared by the whole model: rearrangement re-chooses units within each layer's count"
    reconstruction = None  # nothing of its own to re-solve: in a joint unit the other kinds' projections are re-solved
    reconstruction_alone = "removed tokens leave no projection with fewer inputs to re-solve"
    floor_units = None
    group_floor = 1  # a model keeps a token
    layer_rows = False  # one row for the whole vocabulary
    rebuild_order = 40
    gates_class = VocabGates
    prune, record, flops_tables = staticmethod(prune_vocab_mask), staticmethod(vocab_record), staticmethod(vocab_flops_table)
    available = staticmethod(vocab_refusal)
    renumbers_ids = True
    text_floor = True
    export_formats = ("hf", "onnx", "gguf")  # the formats that write the rewritten tokenizer beside the renumbered rows

    def refusal(self, fields, settings):
        model_type = fields.get("model_type")
        if "vocab_size" in fields or not model_type:
            return None
        from transformers import AutoConfig

        try:
            config = AutoConfig.for_model(model_type)
        except (KeyError, ValueError):  # a type transformers does not know: the model's own check says it at load
            return None
        if hasattr(config, "vocab_size"):
            return None
        return (
            f"{model_type} models read no token ids (their config has no vocab_size), so they have no token rows to remove: "
            "prune their heads, neurons, layers or channels"
        )

    def export_refusal(self, fmt):
        if fmt in self.export_formats:
            return None
        return (
            f"export.format={fmt} writes the original tokenizer beside the pruned token rows: use export.format="
            f"{' or '.join(self.export_formats)} (they ship the rewritten tokenizer), or save the point's model with prune.save "
            "and load it with headprune.load_pruned"
        )

    def export_ids(self, model):
        book, table = getattr(model, VOCAB_ATTR, None), input_embedding(model)
        if not book or getattr(getattr(table, SITE_ATTR, None), "old_to_new", None) is None:
            return None  # nothing removed, or a loaded pruned model: it reads and writes its own ids already
        return list(book["ids"]), int(book["size_orig"])

    def held_ids(self, model):
        meta = vocab_meta(model)  # None: nothing removed
        return None if meta is None else (meta["kept_ids"], int(meta["vocab_size_orig"]))

    def export_tokenizer(self, model, tokenizer):
        found = self.export_ids(model) or self.held_ids(model)
        return tokenizer if found is None or tokenizer is None else rewritten_tokenizer(tokenizer, found[0])

    def to_export_ids(self, model):
        meta = vocab_meta(model)
        if meta is None:
            return
        vocab_site(model).old_to_new = None  # no id view: new ids in, logits over the kept ids out
        set_ids(model, meta["special_ids"])

    def floor(self, gates, tokenizer, needed):
        size = vocab_book(gates.model)["size_orig"]
        if tokenizer is None:
            raise ConfigError("prune.unit=vocab keeps the tokens its tokenizer needs, and this task has no tokenizer")
        if len(tokenizer) > size:
            raise ConfigError(
                f"prune.unit=vocab: the tokenizer has {len(tokenizer)} ids and the model {size} token rows: give the model's own tokenizer"
            )
        ids = floor_ids(tokenizer, needed)
        if len(ids) >= size:
            raise ConfigError(
                f"prune.unit=vocab: the tokenizer's floor (special tokens, base characters, the task's tokens) holds {len(ids)} of "
                f"the model's {size} tokens, so none can be removed: use a larger vocabulary (data.tokenizer.vocab_size)"
            )
        row = torch.zeros(1, size, dtype=torch.bool)
        row[0, ids] = True
        return {GROUP: row}

    def ranked_scores(self, gates, tokenizer, scores):
        """Merge-closed: a kept BPE token keeps its merge's two parts (recursively); a token no text produces goes first."""
        if GROUP not in scores or tokenizer is None:
            return scores
        parts, dead = merge_parts(tokenizer_json(tokenizer))
        if not parts and not dead:
            return scores
        return {**scores, GROUP: merge_closed_scores(scores[GROUP][0], parts, dead).unsqueeze(0)}

    def counted_scores(self, gates, site, mean_loss):
        """A site's tokens scored on the loss scale from their uses while probing (``core/vocab/scores.py``); None: not its site."""
        if not hasattr(site, "counts") or site.group != GROUP:
            return None
        values = renumbered_ids(gates.model.config, {}).values()  # the config's special ids: no rank in the prior
        special = [int(i) for v in values for i in (v if isinstance(v, list) else [v])]
        return token_loss_scores(site.counts, special, mean_loss)[site.unit_ids], site.unit_ids, GROUP

    def save_meta(self, model):
        meta = vocab_meta(model)
        if meta is not None:  # the saved config speaks the new ids (``finish_save`` puts the original ones back)
            model.__dict__[SAVED_IDS] = renumbered_ids(model.config, {})
            set_ids(model, meta["special_ids"])
        return meta

    def finish_save(self, model, path, tokenizer):
        original = model.__dict__.pop(SAVED_IDS, None)
        if original is None:
            return
        set_ids(model, original)  # the model in memory reads and writes original ids again
        if tokenizer is not None:
            rewrite_saved_tokenizer(path, vocab_book(model)["ids"])

    def restore(self, model, meta, path):
        if meta:
            setattr(model, VOCAB_ATTR, {"ids": [int(i) for i in meta["kept_ids"]], "size_orig": int(meta["vocab_size_orig"])})

    def verify(self, model, meta, path):
        if meta and input_embedding(model).num_embeddings != len(meta["kept_ids"]):
            raise ValueError(
                f"{path} keeps {len(meta['kept_ids'])} tokens in its pruning record but its embedding has "
                f"{input_embedding(model).num_embeddings} rows: save the model again"
            )
