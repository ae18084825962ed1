"""A built-in synthetic translation task, deterministic from a seed, for tests and offline demos."""

import random
from dataclasses import dataclass, replace

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


@dataclass
class SyntheticConfig:
    """Sizes of the lexicon and the sentence shapes."""

    seed: int = 0
    nouns: int = 24
    adjectives: int = 12
    verbs: int = 12
    prepositions: int = 4
    max_adjectives: int = 2  # per noun phrase
    pp_prob: float = 0.5  # probability of a prepositional phrase


def _words(rng: random.Random, n: int, syllables: tuple[int, int], taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        word = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(*syllables)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


class SyntheticTranslation:
    """The lexicon and grammar of one synthetic language pair; ``pairs(n, seed)`` samples sentences."""

    def __init__(self, config: SyntheticConfig | None = None, **overrides):
        self.cfg = cfg = replace(config or SyntheticConfig(), **overrides)
        rng = random.Random(f"lexicon-{cfg.seed}")
        taken: set[str] = {"ta", "tu", "lo", "li", "los", "lis"}  # the determiners below
        src_nouns, tgt_nouns = _words(rng, cfg.nouns, (1, 3), taken), _words(rng, cfg.nouns, (2, 3), taken)
        self.nouns = [(s, t, rng.choice("mf")) for s, t in zip(src_nouns, tgt_nouns)]  # (source, target stem, gender)
        self.adjectives = list(zip(_words(rng, cfg.adjectives, (2, 2), taken), _words(rng, cfg.adjectives, (1, 2), taken)))
        self.verbs = list(zip(_words(rng, cfg.verbs, (2, 3), taken), _words(rng, cfg.verbs, (1, 2), taken)))
        self.preps = list(zip(_words(rng, cfg.prepositions, (1, 1), taken), _words(rng, cfg.prepositions, (1, 2), taken)))
        self.src_det = {"sg": "ta", "pl": "tu"}
        self.tgt_det = {("m", "sg"): "lo", ("f", "sg"): "li", ("m", "pl"): "los", ("f", "pl"): "lis"}

    def _noun_phrase(self, rng: random.Random):
        noun = rng.choice(self.nouns)
        number = rng.choice(("sg", "pl"))
        adjs = rng.sample(self.adjectives, rng.randint(0, self.cfg.max_adjectives))
        src = [self.src_det[number]] + [a[0] for a in adjs] + [noun[0]]
        gender = noun[2]
        ending = ("o" if gender == "m" else "a") + ("s" if number == "pl" else "")
        tgt_noun = noun[1] + ("en" if number == "pl" else "")
        tgt = [self.tgt_det[(gender, number)], tgt_noun] + [a[1] + ending for a in reversed(adjs)]
        return src, tgt, number

    def sentence(self, rng: random.Random) -> tuple[str, str]:
        """One (source, target) pair."""
        subj_src, subj_tgt, number = self._noun_phrase(rng)
        verb = rng.choice(self.verbs)
        obj_src, obj_tgt, _ = self._noun_phrase(rng)
        src = subj_src + [verb[0]] + obj_src
        pp_tgt: list[str] = []
        if rng.random() < self.cfg.pp_prob:
            prep = rng.choice(self.preps)
            pp_src, pp_np, _ = self._noun_phrase(rng)
            src += [prep[0]] + pp_src
            pp_tgt = [prep[1]] + pp_np
        tgt = subj_tgt + pp_tgt + obj_tgt + [verb[1] + ("t" if number == "sg" else "n")]
        return " ".join(src) + ".", " ".join(tgt) + "."

    def pairs(self, n: int, seed: int) -> tuple[list[str], list[str]]:
        """``n`` sentence pairs sampled with ``seed`` (the same seed always gives the same pairs)."""
        rng = random.Random(f"sentences-{self.cfg.seed}-{seed}")
        src, tgt = zip(*(self.sentence(rng) for _ in range(n))) if n else ((), ())
        return list(src), list(tgt)


def synthetic_splits(sizes: dict[str, int], seed: int = 0, **lexicon) -> dict[str, tuple[list[str], list[str]]]:
    """{split: (sources, targets)} with one sampling seed per split (train, valid, test never share a stream)."""
    language = SyntheticTranslation(SyntheticConfig(seed=seed, **lexicon))
    return {split: language.pairs(n, seed=index + 1) for index, (split, n) in enumerate(sorted(sizes.items()))}
