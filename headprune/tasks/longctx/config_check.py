"""The passkey task's config check: task.* and data.* settings, its haystack, prompts that fit the context and the positions."""

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError, check_schema, choice, integer, number, optional, positive_ints, rule, string_list, text
from headprune.models.sources import max_positions
from headprune.tasks.data_sources import check_hub_dataset
from headprune.tasks.lm.config_check import SCHEMA as LM_SCHEMA
from headprune.tasks.lm.config_check import check_lengths as check_decode_lengths
from headprune.tasks.longctx.config import ASK, SOURCES, SPLITS, PasskeyConfig
from headprune.tasks.longctx.prompt import placeholders
from headprune.tasks.longctx.task import METRICS


def depths(value, name: str) -> list[float]:
    """A non-empty list of fractions in [0, 1] (0: the needle first in the haystack, 1: last)."""
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(f"{name} is empty: give needle depths in [0, 1], e.g. [0.0, 0.5, 1.0]")
    return [number(v, name, 0.0, 1.0, closed="[]") for v in items]


SCHEMA = {
    **{key: value for key, value in LM_SCHEMA.items() if key.startswith("task.")},
    "data.source": rule(choice, choices=SOURCES),
    "data.seed": rule(integer),
    **{f"data.sizes.{split}": rule(integer, low=0) for split in SPLITS},
    "data.context_lengths": rule(positive_ints),
    "data.depths": rule(depths),
    "data.key_digits": rule(integer, low=1, high=18),
    "data.needles": rule(integer, low=1),
    "data.ask": rule(choice, choices=ASK),
    "data.metric": rule(choice, choices=tuple(METRICS)),
    **{key: LM_SCHEMA[key] for key in ("data.add_bos", "data.batch_size", "data.eval_batch_size", "data.tokenizer.vocab_size")},
    **{f"data.template.{part}": rule(text) for part in ("needle", "question", "named_needle", "named_question", "all_question")},
    "data.names": rule(string_list),
    "data.text_field": optional(rule(text)),
    "data.synthetic.seed": rule(integer),
    "data.synthetic.sentences": rule(integer, low=1),
    "data.repeat": optional(rule(string_list)),
}
NEEDS = {"needle": {"key"}, "named_needle": {"key", "name"}, "named_question": {"name"}}  # placeholders a template must hold


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The settings, the haystack (readable, not empty), keys enough, and prompts within the context and the positions."""
    check_schema(cfg, SCHEMA)
    config = PasskeyConfig.from_cfg(cfg.data)
    if importance and config.sizes["importance"] < 1:
        raise ConfigError(
            "data.sizes.importance=0 leaves the importance split empty (head importance and the held-out choices read it): "
            "set data.sizes.importance to a number of examples, e.g. 16"
        )
    check_source_settings(config)
    check_templates(config)
    check_keys(config)
    check_positions(cfg, config)
    check_decode_lengths(cfg)  # the decode timing of experiment=speed (task.decode_*) within the positions
    if config.source == "hub" and files:
        check_hub_dataset(cfg.data, config.hub_path, "data.hub_path", "data=passkey_local (text files) or data=passkey_synthetic")
    if files and config.source in ("local", "synthetic", "repeat"):
        check_prompts(cfg, config)


def check_source_settings(config: PasskeyConfig) -> None:
    """data.repeat holds sentences with data.source=repeat, and is not given with another source (nothing would read it)."""
    if config.source == "repeat" and (config.repeat is None or not any(line.strip() for line in config.repeat)):
        raise ConfigError(
            f"data.source=repeat needs the haystack's sentences in data.repeat, got {config.repeat}: "
            "e.g. data.repeat='[The grass is green.,The sky is blue.]'"
        )
    if config.source != "repeat" and config.repeat is not None:
        raise ConfigError(
            f"data.repeat is read only with data.source=repeat, but data.source={config.source}: drop data.repeat or set data.source=repeat"
        )
    if config.source == "repeat" and config.files:
        raise ConfigError("data.files is read only with data.source=local, but data.source=repeat: set data.files=null")


def check_templates(config: PasskeyConfig) -> None:
    """The needle and question templates hold the placeholders they fill; several needles have a name each."""
    for part, needed in NEEDS.items():
        missing = needed - placeholders(getattr(config.template, part))
        if missing:
            raise ConfigError(f"data.template.{part}={getattr(config.template, part)!r} lacks {sorted('{' + m + '}' for m in missing)}")
    if config.needles > 1 and len(set(config.names)) < config.needles:
        raise ConfigError(
            f"data.needles={config.needles}, but data.names holds {len(set(config.names))} distinct names: give one name per needle"
        )


def check_keys(config: PasskeyConfig) -> None:
    """Every needle of every split gets its own key: at most half of the keys of ``key_digits`` digits are drawn."""
    wanted = config.needles * sum(config.sizes.values())
    available = 9 * 10 ** (config.key_digits - 1)
    if wanted > available // 2:
        raise ConfigError(
            f"data.key_digits={config.key_digits} gives {available} keys, too few for {wanted} needles drawn without repeats "
            f"(data.sizes x data.needles): raise data.key_digits"
        )


def check_positions(cfg, config: PasskeyConfig) -> None:
    """The longest context and its answer fit the model's positions; the key fits the shortest context."""
    longest, shortest = max(config.context_lengths), min(config.context_lengths)
    if config.key_digits >= shortest:
        raise ConfigError(
            f"data.key_digits={config.key_digits}: a key of {config.key_digits} digits is longer than the context of "
            f"{shortest} tokens (data.context_lengths): give longer contexts or shorter keys"
        )
    positions = max_positions(cfg.model)
    if positions is not None and longest >= positions:
        raise ConfigError(
            f"data.context_lengths holds {longest} tokens, but model {cfg.model.get('name')} takes at most {positions} "
            f"positions (the answer follows the context): give context lengths below {positions}"
        )


def check_prompts(cfg, config: PasskeyConfig) -> None:
    """The haystack is readable and not empty, and the prompts fit the shortest context and the longest one the positions."""
    from headprune.tasks.longctx.examples import PasskeyGenerator
    from headprune.tasks.longctx.haystack import haystack_pools

    try:
        pools = haystack_pools(config)
    except (ValueError, OSError) as err:
        raise ConfigError(f"data={config.name}: {err}") from None
    tokenizer, bos = prompt_tokenizer(cfg, config, pools)
    generator = PasskeyGenerator(config, tokenizer, bos)
    keys = ["9" * config.key_digits] * config.needles
    names = sorted(config.names, key=len, reverse=True)[: config.needles] if config.needles > 1 else [""]
    fixed = generator.fixed_tokens(keys, names, -1 if config.ask == "all" else 0)
    shortest = min(config.context_lengths)
    if fixed > shortest:
        raise ConfigError(
            f"data.context_lengths holds {shortest} tokens, too short for the intro, {config.needles} needle(s) and the question "
            f"alone ({fixed} tokens of the model's tokenizer): give context lengths of at least {fixed} tokens or shorter data.template.*"
        )
    answer = len(generator.answer(keys, -1 if config.ask == "all" else 0)[0])
    positions = max_positions(cfg.model)
    longest = max(config.context_lengths)
    if positions is not None and longest + answer - 1 > positions:
        raise ConfigError(
            f"data.context_lengths holds {longest} tokens, and its answer of {answer} tokens follows: {longest + answer - 1} "
            f"positions, but model {cfg.model.get('name')} takes at most {positions}: give context lengths of at most {positions - answer + 1}"
        )


def prompt_tokenizer(cfg, config: PasskeyConfig, pools: dict[str, list[str]]):
    """(the tokenizer the task will use, its BOS id): the model's own, or the one a fresh model trains on the haystack."""
    from headprune.models.build import build_tokenizer
    from headprune.models.tokenizers import train_tokenizer
    from headprune.tasks.lm.task import text_start
    from headprune.tasks.longctx.task import tokenizer_texts

    if cfg.model.get("tokenizer"):
        tokenizer = build_tokenizer(cfg.model)
    else:
        tokenizer = train_tokenizer(tokenizer_texts(config, pools), vocab_size=int(cfg.data.tokenizer.vocab_size))
    try:
        start = text_start(cfg, tokenizer)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return tokenizer, start
