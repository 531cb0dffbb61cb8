"""Near duplicates (:mod:`posenc.data.near_duplicates`): two sentences are within one word when,
lowercased and without punctuation, one word inserted, deleted or replaced turns one into the
other. Checked against the word edit distance computed the slow way, pair by pair."""

from __future__ import annotations

import random

import pytest

from posenc.data.near_duplicates import NearIndex, within_one_word, words


def word_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Levenshtein distance over words: the textbook table, cell by cell."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        table[i][0] = i
    for j in range(len(b) + 1):
        table[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(
                table[i - 1][j] + 1,
                table[i][j - 1] + 1,
                table[i - 1][j - 1] + (a[i - 1] != b[j - 1]),
            )
    return table[-1][-1]


def random_sentences(n: int, seed: int) -> list[str]:
    """Short sentences over four words, so that many lie within one word of each other."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(["ab", "cd", "ef", "gh"]) for _ in range(rng.randint(0, 4)))
        for _ in range(n)
    ]


def test_words_are_lowercased_without_punctuation():
    assert words("Tom, it's «Paris»!  Non.") == ("tom", "it", "s", "paris", "non")


def test_within_one_word_is_a_word_edit_distance_of_at_most_one():
    sentences = [words(s) for s in random_sentences(120, 0)]
    for a in sentences:
        for b in sentences:
            assert within_one_word(a, b) == (word_distance(a, b) <= 1), (a, b)


def test_shared_deletion_keys_alone_are_not_enough():
    """``a b`` and ``b a`` share the key ``(b,)`` but are two edits apart."""
    assert NearIndex(["a b"]).near("b a") == set()
    assert NearIndex(["the cat sat"]).near("The dog sat.") == {0}


@pytest.mark.parametrize("seed", [1, 2])
def test_the_index_finds_exactly_the_held_out_sentences_a_stream_comes_within_one_word_of(seed):
    held_out, stream = random_sentences(40, seed), random_sentences(60, seed + 10)
    expected = [any(word_distance(words(h), words(s)) <= 1 for s in stream) for h in held_out]
    index = NearIndex(held_out)
    found = set().union(*(index.near(s) for s in stream))
    assert [i in found for i in range(len(held_out))] == expected
    assert 0 < sum(expected) < len(expected)
