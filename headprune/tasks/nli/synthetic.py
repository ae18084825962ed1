"""A built-in synthetic NLI set made from templates: deterministic from a seed, offline, learnable in a minute."""

import random

NAMES = "Anna Ben Carla David Elena Farid Grace Hugo Iris Jonas Kemal Lena Maya Nils Olga Pedro Quinn Rosa Sami Tara".split()
NAMES_MISMATCHED = ["Uma", "Victor", "Wendy", "Xavier", "Yara", "Zoe", "Arjun", "Bianca", "Chen", "Dmitri"]
PLACES = ["kitchen", "garden", "library", "office", "park", "station", "museum", "bakery", "garage", "classroom", "hospital", "market"]
PLACES_MISMATCHED = ["harbor", "stadium", "theater", "airport", "laboratory", "church"]
ACTIONS = (
    "reading a book, eating an apple, writing a letter, playing the guitar, painting a picture, fixing a bike, drinking coffee, "
    "watching a movie, cooking soup, singing a song, cleaning the floor, talking on the phone"
).split(", ")
EXTRAS = ["with a friend", "with two children", "with a small dog", "with her brother", "with his sister"]
REASONS = ["because it is raining", "because it is late", "because it is Monday", "for a school project"]
FEELINGS = ["happy", "tired", "hungry", "bored", "excited"]

ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2


def _other(rng: random.Random, items: list[str], not_this: str) -> str:
    choice = rng.choice(items)
    while choice == not_this:
        choice = rng.choice(items)
    return choice


HYPOTHESES = {  # str.format templates per label; the fillers of each label are drawn in _hypothesis
    ENTAILMENT: ("{name} is {action}.", "Someone is {action} in the {place}.", "{name} is in the {place}.", "A person is {action}."),
    NEUTRAL: (
        "{name} is {action} {extra}.",
        "{name} is {action} {reason}.",
        "{name} is {feeling} in the {place}.",
        "{other_name} is also in the {place}.",
    ),
    CONTRADICTION: (
        "{name} is not {action}.",
        "Nobody is in the {place}.",
        "{name} is in the {other_place} right now.",
        "{name} is sleeping at home.",
    ),
}


def _hypothesis(rng: random.Random, label: int, name: str, action: str, place: str, names, places) -> str:
    """One hypothesis with the given label for the premise (name, action, place)."""
    fillers = {}  # drawn before the template, in this order, so a seed gives the same set as ever
    if label == NEUTRAL:
        fillers = {
            "extra": rng.choice(EXTRAS),
            "reason": rng.choice(REASONS),
            "feeling": rng.choice(FEELINGS),
            "other_name": _other(rng, names, name),
        }
    elif label == CONTRADICTION:
        fillers = {"other_place": _other(rng, places, place)}
    return rng.choice(HYPOTHESES[label]).format(name=name, action=action, place=place, **fillers)


def generate(n: int, seed: int, mismatched: bool = False) -> dict[str, list]:
    """``n`` balanced (premise, hypothesis, label) triples; the same seed gives the same set."""
    rng = random.Random(seed)
    names = NAMES_MISMATCHED if mismatched else NAMES
    places = PLACES_MISMATCHED if mismatched else PLACES
    out = {"premise": [], "hypothesis": [], "label": []}
    for i in range(n):
        label = i % 3
        name, action, place = rng.choice(names), rng.choice(ACTIONS), rng.choice(places)
        out["premise"].append(f"{name} is {action} in the {place}.")
        out["hypothesis"].append(_hypothesis(rng, label, name, action, place, names, places))
        out["label"].append(label)
    order = list(range(n))
    rng.shuffle(order)
    return {key: [values[i] for i in order] for key, values in out.items()}


def synthetic_splits(seed: int = 0, train_size: int = 3000, eval_size: int = 600, mismatched_size: int = 600) -> dict[str, dict]:
    """{"train", "eval", "eval_mismatched"}: eval pairs never occur in train; mismatched uses unseen names and places."""
    train = generate(train_size, seed)
    seen = set(zip(train["premise"], train["hypothesis"]))
    pool = generate(eval_size * 3, seed + 1)
    keep = [i for i, pair in enumerate(zip(pool["premise"], pool["hypothesis"])) if pair not in seen][:eval_size]
    evaluation = {key: [values[i] for i in keep] for key, values in pool.items()}
    return {"train": train, "eval": evaluation, "eval_mismatched": generate(mismatched_size, seed + 2, mismatched=True)}
