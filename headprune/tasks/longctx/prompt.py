"""Templates as token ids: each piece tokenized on its own, so that every needle's key tokens are known positions."""

import re

PLACEHOLDER = re.compile(r"(\s*)\{(\w+)\}")


class Pieces:
    """Token ids of texts and filled templates in one tokenizer (no special tokens), each text tokenized once."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._known: dict[str, list[int]] = {}

    def text(self, text: str) -> list[int]:
        """The ids of ``text`` alone."""
        if text not in self._known:
            self._known[text] = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        return self._known[text]

    def many(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text (one batched call for those not seen yet)."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._known and t]
        if todo:
            for text, ids in zip(todo, self.tokenizer(todo, add_special_tokens=False)["input_ids"]):
                self._known[text] = list(ids)
        return [self.text(t) for t in texts]

    def filled(self, template: str, values: dict[str, str]) -> tuple[list[int], dict[str, list[tuple[int, int]]]]:
        """(ids of ``template`` with ``values`` filled in, {placeholder: [(start, end) of each of its occurrences]})."""
        ids: list[int] = []
        spans: dict[str, list[tuple[int, int]]] = {}
        at = 0
        for found in PLACEHOLDER.finditer(template):
            ids += self.text(template[at : found.start()])
            name = found.group(2)
            if name not in values:
                raise ValueError(f"the template {template!r} has a placeholder {{{name}}}; it may hold {sorted(values)}")
            piece = self.text(found.group(1) + values[name])
            spans.setdefault(name, []).append((len(ids), len(ids) + len(piece)))
            ids += piece
            at = found.end()
        ids += self.text(template[at:])
        return ids, spans


def placeholders(template: str) -> set[str]:
    """The placeholder names a template holds."""
    return {found.group(2) for found in PLACEHOLDER.finditer(template)}
