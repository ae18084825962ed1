"""Passkey examples from a seed: a haystack of filler with keyed needles at chosen depths, a question, the answer."""

import random
from dataclasses import dataclass

from headprune.tasks.longctx.config import PasskeyConfig
from headprune.tasks.longctx.prompt import Pieces


@dataclass(frozen=True)
class PasskeyExample:
    """One example as token ids, with where its needles and its answer are."""

    ids: tuple[int, ...]  # the prompt, then the answer
    answer_start: int  # tokens of the prompt (the context length); ids[answer_start:] is the answer
    needles: tuple[tuple[int, int], ...]  # (start, end) of each needle in ids, in the order they appear
    copies: tuple[int, ...]  # per answer token: the needle whose key it repeats (index into needles), -1 for a joiner
    keys: tuple[str, ...]  # each needle's key, in the order the needles appear
    asked: int  # the needle asked for (index into needles), -1 when every key is asked for
    length: int  # the context length asked for
    depth: float  # the depth asked for
    haystack: tuple[int, int]  # (start, end) of the haystack in ids, its needles included

    def __len__(self) -> int:
        """Tokens of the prompt and the answer (what batches sort by)."""
        return len(self.ids)

    @property
    def answer(self) -> tuple[int, ...]:
        return self.ids[self.answer_start :]


class PasskeyGenerator:
    """Examples of one config in one tokenizer: ``split(name, pool, used)`` draws a split's examples."""

    def __init__(self, config: PasskeyConfig, tokenizer, bos_id: int | None):
        self.config = config
        self.pieces = Pieces(tokenizer)
        self.bos = [int(bos_id)] if config.add_bos and bos_id is not None else []
        self.intro = self.pieces.text(config.template.intro)

    def question_template(self) -> str:
        t = self.config.template
        if self.config.ask == "all":
            return t.all_question
        return t.question if self.config.needles == 1 else t.named_question

    def needle(self, key: str, name: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(ids of one needle, the (start, end) of each occurrence of its key within them)."""
        t = self.config.template
        ids, spans = self.pieces.filled(" " + (t.needle if self.config.needles == 1 else t.named_needle), {"key": key, "name": name})
        return ids, spans.get("key", [])

    def answer(self, keys: list[str], asked: int) -> tuple[list[int], list[int]]:
        """(answer ids, per answer token the index of the key it repeats or -1): one key, or all joined in order."""
        chosen = range(len(keys)) if asked < 0 else [asked]
        ids, copies = [], []
        for n, k in enumerate(chosen):
            if n:
                joiner = self.pieces.text(self.config.template.joiner)
                ids, copies = ids + joiner, copies + [-1] * len(joiner)
            piece = self.pieces.filled(" {key}", {"key": keys[k]})[0]
            ids, copies = ids + piece, copies + [k] * len(piece)
        return ids, copies

    def fixed_tokens(self, keys: list[str], names: list[str], asked: int) -> int:
        """Prompt tokens besides the filler: BOS, intro, needles and question."""
        needles = sum(len(self.needle(k, n)[0]) for k, n in zip(keys, names))
        question = self.pieces.filled(" " + self.question_template(), {"name": names[max(asked, 0)]})[0]
        return len(self.bos) + len(self.intro) + needles + len(question)

    def draw_key(self, rng: random.Random, used: set[str]) -> str:
        """A key of ``key_digits`` digits (no leading zero) not drawn before."""
        low, high = 10 ** (self.config.key_digits - 1), 10**self.config.key_digits - 1
        while True:
            key = str(rng.randint(low, high))
            if key not in used:
                used.add(key)
                return key

    def split(self, name: str, pool: list[str], used: set[str]) -> list[PasskeyExample]:
        """The ``sizes[name]`` examples of a split from its haystack pool (keys not in ``used``, which grows)."""
        config = self.config
        rng = random.Random(f"passkey-{config.seed}-{name}")
        pool_ids = self.pieces.many([" " + line for line in pool])
        grid = [(length, depth) for length in config.context_lengths for depth in config.depths]
        return [self.example(rng, pool_ids, *grid[i % len(grid)], used) for i in range(config.sizes[name])]

    def filler(self, rng: random.Random, pool_ids: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
        """(``budget`` filler ids: consecutive pool sentences from a random start, the last cut; the sentence starts)."""
        ids, starts = [], []
        at = rng.randrange(len(pool_ids))
        while len(ids) < budget:
            starts.append(len(ids))
            ids += pool_ids[at % len(pool_ids)]
            at += 1
        return ids[:budget], [s for s in starts if s < budget] + [budget]

    def example(self, rng: random.Random, pool_ids: list[list[int]], length: int, depth: float, used: set[str]) -> PasskeyExample:
        """One example of ``length`` prompt tokens with the asked needle at ``depth`` of the filler."""
        config = self.config
        count = config.needles
        keys = [self.draw_key(rng, used) for _ in range(count)]
        names = rng.sample(list(config.names), count) if count > 1 else [""]
        asked = -1 if config.ask == "all" else rng.randrange(count)
        budget = length - self.fixed_tokens(keys, names, asked)
        if budget < 0:
            raise ValueError(
                f"data.context_lengths holds {length} tokens, but the intro, {count} needle(s) and the question alone take "
                f"{length - budget}: give context lengths of at least {length - budget} tokens"
            )
        filler, starts = self.filler(rng, pool_ids, budget)
        first = max(asked, 0)
        targets = [depth if i == first else rng.random() for i in range(count)]
        offsets = [min(starts, key=lambda s, t=t: (abs(s - t * budget), s)) for t in targets]  # nearest sentence start
        order = sorted(range(count), key=lambda i: (offsets[i], i != first))  # the order the needles appear in
        ids, needles = list(self.bos) + list(self.intro), []
        haystack_start, at = len(ids), 0
        for i in order:
            ids += filler[at : offsets[i]]
            at = offsets[i]
            needle_ids, _ = self.needle(keys[i], names[i])
            needles.append((len(ids), len(ids) + len(needle_ids)))
            ids += needle_ids
        ids += filler[at:]
        haystack = (haystack_start, len(ids))
        ids += self.pieces.filled(" " + self.question_template(), {"name": names[first]})[0]
        answer_start = len(ids)
        shown = [keys[i] for i in order]  # keys in the order the needles appear
        answer, copies = self.answer(shown, -1 if asked < 0 else order.index(asked))
        return PasskeyExample(
            ids=tuple(ids + answer),
            answer_start=answer_start,
            needles=tuple(needles),
            copies=tuple(copies),
            keys=tuple(shown),
            asked=-1 if asked < 0 else order.index(asked),
            length=length,
            depth=depth,
            haystack=haystack,
        )


def generate(config: PasskeyConfig, tokenizer, bos_id: int | None, pools: dict[str, list[str]]) -> dict[str, list[PasskeyExample]]:
    """{split: examples} of every split with examples, keys unique over all of them (drawn in SPLITS order)."""
    generator = PasskeyGenerator(config, tokenizer, bos_id)
    used: set[str] = set()
    return {split: generator.split(split, pools[split], used) for split in config.splits}
