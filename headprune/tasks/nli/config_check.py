"""The NLI task's config check: task.* and data.* settings, its data files, lengths the model can take."""

from headprune.core.checks import ConfigError, integer, rule
from headprune.tasks.config_check import TRAINER_SCHEMA, check_length_fits, checked_data
from headprune.tasks.data_sources import check_hub_dataset, dir_advice, utf8_lines

SCHEMA = {
    **TRAINER_SCHEMA,
    "data.synthetic.train_size": rule(integer, low=1),  # data=nli_synthetic: examples made per split
    "data.synthetic.eval_size": rule(integer, low=1),
    "data.synthetic.mismatched_size": rule(integer, low=0),  # 0: no eval_mismatched split
}


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The NLI settings, a tokenizer, an importance subset where importance is read, lengths, and the local files."""
    from headprune.tasks.nli.config import NLIDataConfig

    config = checked_data(cfg, SCHEMA, NLIDataConfig, importance, "examples, e.g. 2000")
    if not cfg.model.get("tokenizer"):
        raise ConfigError(f"model {cfg.model.get('name')!r} sets no tokenizer: set model.tokenizer=<dir, hub name or minilm>")
    if config.source == "synthetic":
        made = int(config.synthetic["train_size"])
        most = made // 2 if config.importance_holdout else made
        if config.importance_size > most:
            raise ConfigError(
                f"data.importance_size={config.importance_size} is more than the {most} examples the importance subset "
                f"can take of data.synthetic.train_size={made}"
                + (" (half of them with data.importance_holdout=true)" if config.importance_holdout else "")
                + ": lower data.importance_size or raise data.synthetic.train_size"
            )
    check_length_fits(cfg, "max_length", "pair")
    if config.source == "local" and files:
        check_files(config, cfg.data)
    if config.source == "hub" and files:
        check_hub_dataset(cfg.data, config.hub_path, "data.hub_path", "data=nli_local (MNLI files) or data=nli_synthetic")


def check_files(config, data) -> None:
    """Every split's file present (train and eval), UTF-8 and not empty; errors name file, line and the setting that gave the directory."""
    from headprune.tasks.nli.config import REQUIRED, SPLITS
    from headprune.tasks.nli.files import present_split_files

    try:
        for split, path in present_split_files(config.dir, config.files, SPLITS, REQUIRED):
            if sum(1 for _ in utf8_lines(path)) == 0 and split in REQUIRED:  # every line read: a bad byte is a TextFileError
                raise ConfigError(f"{path} (data.files.{split}) is empty: the {split} split needs labelled examples")
    except FileNotFoundError as err:  # a missing required file
        raise ConfigError(f"{err}; {dir_advice(data, 'the MNLI files (train.jsonl, dev_matched.jsonl, ...)')}") from None
    except (OSError, ValueError) as err:  # a bad byte (file:line)
        raise ConfigError(str(err)) from None
