"""Near duplicates: sentences within one word of each other.

Two sentences are *within one word* when, lowercased, with punctuation removed and split on
white space, one becomes the other by inserting, deleting or replacing at most one word (word
edit distance <= 1). A held-out pair is near-clean when neither its source nor its reference is
within one word of a training sentence on the same side.

Finding them among hundreds of thousands of training sentences uses deletion keys (the
symmetric-deletion idea of spelling correctors): two word tuples within one word share a key
among ``{the tuple} | {the tuple less one word}``; every shared key is then checked with the
exact rule, since sharing a key alone can also mean two edits (``a b`` and ``b a``)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

Words = tuple[str, ...]


def words(text: str) -> Words:
    """``text`` lowercased, every punctuation character (Unicode category P) removed, split on
    white space."""
    kept = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text.lower())
    return tuple(kept.split())


def deletion_keys(sentence: Words) -> set[Words]:
    """The sentence and each form of it with one word left out."""
    return {sentence, *(sentence[:i] + sentence[i + 1 :] for i in range(len(sentence)))}


def within_one_word(a: Words, b: Words) -> bool:
    """Whether one word inserted, deleted or replaced turns ``a`` into ``b`` (or they are
    equal)."""
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) <= 1
    short, long = sorted((a, b), key=len)
    if len(long) - len(short) != 1:
        return False
    i = next((i for i, (x, y) in enumerate(zip(short, long, strict=False)) if x != y), len(short))
    return short[i:] == long[i + 1 :]


class NearIndex:
    """Sentences (the held-out ones, few) indexed by their deletion keys, to ask which of them
    lie within one word of each sentence of a long stream (the training side)."""

    def __init__(self, sentences: Sequence[str]) -> None:
        self.sentences = [words(s) for s in sentences]
        self.by_key: dict[Words, list[int]] = {}
        for i, sentence in enumerate(self.sentences):
            for key in deletion_keys(sentence):
                self.by_key.setdefault(key, []).append(i)

    def near(self, sentence: str) -> set[int]:
        """The indices of the indexed sentences within one word of ``sentence``."""
        mine = words(sentence)
        found: set[int] = set()
        for key in deletion_keys(mine):
            for i in self.by_key.get(key, ()):
                if i not in found and within_one_word(mine, self.sentences[i]):
                    found.add(i)
        return found
