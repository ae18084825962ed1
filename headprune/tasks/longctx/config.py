"""The passkey data settings (``data.*`` of conf/data/passkey_*.yaml), read once into a dataclass; values come from conf/."""

from dataclasses import dataclass, field

from omegaconf import OmegaConf

SOURCES = ("synthetic", "local", "hub", "repeat")
SPLITS = ("eval", "importance", "heldout", "train")  # also the order keys are drawn in: eval's never depend on the others
ASK = ("one", "all")  # ask for one needle's key, or for every key in the order the needles appear


@dataclass(frozen=True)
class Templates:
    """The words of a prompt; ``{key}`` and ``{name}`` are filled per needle (see headprune.tasks.longctx.prompt)."""

    intro: str  # before the haystack
    needle: str  # the one needle: {key}
    question: str  # after the haystack, asking the one needle's key; the answer follows it
    named_needle: str  # one of several needles: {name}, {key}
    named_question: str  # asking one of several needles' key: {name}
    all_question: str  # asking every key, in the order the needles appear
    joiner: str  # between the keys of an answer to all_question


@dataclass(frozen=True)
class PasskeyConfig:
    """Where the haystack comes from, which examples each split holds and how they are batched."""

    name: str
    source: str
    seed: int
    sizes: dict  # {split: examples}; each split drawn with its own seed
    context_lengths: tuple[int, ...]  # prompt tokens of an example (BOS, intro, haystack, needles, question)
    depths: tuple[float, ...]  # where the (asked) needle starts, as a fraction of the haystack's tokens
    key_digits: int
    needles: int
    ask: str
    add_bos: bool
    batch_size: int
    eval_batch_size: int
    template: Templates
    names: tuple[str, ...]  # needle names when there are several
    dir: str | None
    files: dict | None  # {split: [text files under dir]} (source local)
    hub_path: str | None
    hub_name: str | None
    hub_splits: dict | None  # {split: hub split} (source hub)
    text_field: str | None
    synthetic_seed: int | None  # the lexicon of the synthetic language (source synthetic)
    synthetic_sentences: int | None  # sentences in each split's synthetic haystack pool
    repeat: tuple[str, ...] | None  # sentences repeated in order as every split's haystack (source repeat)
    metric: str  # accuracy | key_log_likelihood
    raw: object = field(compare=False, repr=False)  # the data config itself (advice names the setting that gave data.dir)

    @classmethod
    def from_cfg(cls, data) -> "PasskeyConfig":
        """``data.*`` of a composed config (its rules are headprune.tasks.longctx.config_check.SCHEMA)."""
        values = OmegaConf.to_container(data, resolve=True) if OmegaConf.is_config(data) else dict(data)
        files, synthetic = values.get("files"), values.get("synthetic")
        return cls(
            **{key: str(values[key]) for key in ("name", "source", "ask", "metric")},
            **{key: int(values[key]) for key in ("seed", "key_digits", "needles", "batch_size", "eval_batch_size")},
            **{key: values.get(key) for key in ("hub_path", "hub_name", "text_field")},
            sizes={split: int(n) for split, n in dict(values["sizes"]).items()},
            context_lengths=tuple(int(n) for n in values["context_lengths"]),
            depths=tuple(float(d) for d in values["depths"]),
            add_bos=bool(values["add_bos"]),
            template=Templates(**{k: str(v) for k, v in dict(values["template"]).items()}),
            names=tuple(str(n) for n in values["names"]),
            dir=None if values.get("dir") is None else str(values["dir"]),
            files=None if files is None else {s: [p] if isinstance(p, str) else list(p) for s, p in files.items() if p is not None},
            hub_splits=None if values.get("hub_splits") is None else dict(values["hub_splits"]),
            synthetic_seed=int(synthetic["seed"]) if synthetic else None,
            synthetic_sentences=int(synthetic["sentences"]) if synthetic else None,
            repeat=None if values.get("repeat") is None else tuple(str(line) for line in values["repeat"]),
            raw=data,
        )

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits with examples, in drawing order."""
        return tuple(split for split in SPLITS if self.sizes[split] > 0)
