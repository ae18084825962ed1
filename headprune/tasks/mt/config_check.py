"""The translation task's config check: task.* and data.* settings, its aligned files, lengths the model can take."""

from headprune.core.checks import ConfigError, boolean, check_schema, choice, integer, number, optional, rule, text
from headprune.models.sources import max_positions
from headprune.tasks.config_check import check_length_fits
from headprune.tasks.data_sources import check_hub_dataset, dir_advice
from headprune.tasks.mt.config import SPLITS

SCHEMA = {
    "task.label_smoothing": rule(number, low=0.0, high=1.0),
    "task.beam_size": rule(integer, low=1),
    "task.val_beam_size": rule(integer, low=1),
    "task.len_ratio": rule(number, low=0.0, closed="()"),
    "task.len_extra": rule(integer, low=0),
    "task.mask_chunk": rule(integer, low=1),
    "optim.lr": rule(number, low=0.0, closed="()"),
    "scheduler.warmup_steps": rule(integer, low=0),
    "data.source": rule(choice, choices=("files", "hub", "synthetic")),
    "data.source_prefix": optional(rule(text)),
    "data.eval_split": rule(choice, choices=SPLITS),
    "data.heldout_split": rule(choice, choices=SPLITS),
    "data.tokenizer.kind": rule(choice, choices=("bpe", "unigram")),
    "data.tokenizer.vocab_size": rule(integer, low=1),
    "data.tokenizer.min_frequency": rule(integer, low=1),
    "data.hub.trust_remote_code": rule(boolean),
    "data.num_workers": rule(integer, low=0),
    "data.importance.max_tokens": rule(integer, low=1),
    **{f"data.{key}": rule(integer, low=1) for key in ("max_tokens", "eval_max_tokens", "eval_batch_size", "max_len")},
    **{f"data.limits.{split}": optional(rule(integer, low=1)) for split in SPLITS},  # pairs kept (null: all)
    **{f"data.synthetic.sizes.{split}": rule(integer, low=1) for split in SPLITS},  # data=mt_synthetic: pairs made per split
}


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The MT settings, an importance subset where importance is read, lengths, and every split's aligned files."""
    check_schema(cfg, SCHEMA)
    data = cfg.data
    if importance:
        integer(data.importance.size, "data.importance.size", 1)
    check_lengths(cfg)
    if files and data.source == "files":
        check_files(data)
    if files and data.source == "hub":
        check_hub_dataset(data, data.hub.path, "data.hub.path", "data=mt_multi30k, mt_iwslt14 or mt_wmt (local files) or data=mt_synthetic")


def check_lengths(cfg) -> None:
    """Training pairs of data.max_len tokens and generated translations must fit the model's position embeddings."""
    check_length_fits(cfg, "max_len", "sentence")
    positions = max_positions(cfg.model)
    extra = (cfg.get("task") or {}).get("len_extra")
    if positions is not None and isinstance(extra, int) and extra >= positions:
        raise ConfigError(
            f"task.len_extra={extra} tokens beyond task.len_ratio x the source length, but model {cfg.model.get('name')} "
            f"generates at most {positions - 1} tokens (it takes {positions} positions): every translation would run "
            f"to that limit; set task.len_extra below {positions} (e.g. 10)"
        )


def check_files(data) -> None:
    """Every split's two files: present, UTF-8, aligned line by line (errors name file and line)."""
    from headprune.tasks.mt.files import read_aligned

    for split in SPLITS:
        stem = data.splits[split]
        try:
            read_aligned(data.dir, stem, data.src_lang, data.tgt_lang)
        except FileNotFoundError as err:
            raise ConfigError(
                f"data split {split!r}: {err}; {dir_advice(data, f'{stem}.{data.src_lang} and {stem}.{data.tgt_lang}')}"
            ) from None
        except (OSError, ValueError) as err:
            raise ConfigError(f"data split {split!r}: {err}") from None
