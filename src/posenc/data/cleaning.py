"""The recipes that clean the local mix's raw originals into its files. A recipe takes its
sources' bytes, in the order the manifest (:mod:`posenc.data.sources`) lists them, and returns
the file's bytes.

Every text is split on ``\\n`` alone (a ``\\r``, form feed or U+2028 inside a line cannot shift
the alignment of two sides) and each line is whitespace normalized by sacreBLEU's rule,
``re.sub(r"\\s+", " ", line.strip())``: every run of Unicode whitespace, no-break spaces
included, becomes one space, and the ends are stripped. The training stems then drop the pairs
with an empty side, those whose French side is a line of newstest2013 or newstest2014, and exact
duplicate pairs (the first kept), in that order; Europarl's 20k sample also drops the pairs of
the Europarl head. Tatoeba's pairs are the first two tab-separated columns of one member of its
zip (read in memory: nothing of the archive is written to disk).
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterable, Sequence

WHITESPACE = re.compile(r"\s+")
SEGMENT = re.compile(r"<seg.*?>(.*)</seg>.*?")
"""sacreBLEU's extraction of a ``<seg ...>`` line's text (its ``FakeSGMLDataset``)."""
TATOEBA_MEMBER = "fra-eng/fra.txt"

Pairs = list[tuple[str, str]]


class CleaningError(ValueError):
    """An original does not hold what its recipe expects (one line naming what)."""


def normalized(line: str) -> str:
    """``line`` with every run of whitespace one space and its ends stripped."""
    return WHITESPACE.sub(" ", line.strip())


def lines_of(data: bytes) -> list[str]:
    """The lines of UTF-8 ``data``, split on ``\\n`` alone (a final newline ends the last)."""
    lines = data.decode("utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def text_of(lines: Iterable[str]) -> bytes:
    """One line each, ``\\n``-terminated, UTF-8."""
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def copy(sources: Sequence[bytes]) -> bytes:
    """The original unchanged."""
    return sources[0]


def lines(sources: Sequence[bytes]) -> bytes:
    """The original's lines, whitespace normalized."""
    return text_of(normalized(line) for line in lines_of(sources[0]))


def sgm_segments(sources: Sequence[bytes]) -> bytes:
    """The text of every ``<seg ...>`` line of an SGM file, whitespace normalized (what
    ``sacrebleu -t wmt14/full`` reads)."""
    return text_of(
        normalized(SEGMENT.sub(r"\1", line))
        for line in lines_of(sources[0])
        if line.startswith("<seg ")
    )


def clean_pairs(
    fr: Sequence[str], en: Sequence[str], test_fr: set[str], exclude: set[tuple[str, str]]
) -> Pairs:
    """Normalized (fr, en) pairs without an empty side, a French side in ``test_fr``, a pair in
    ``exclude`` or a repeat of an earlier pair."""
    if len(fr) != len(en):
        raise CleaningError(f"the two sides have {len(fr):,} and {len(en):,} lines")
    kept: Pairs = []
    seen: set[tuple[str, str]] = set()
    for pair in zip(map(normalized, fr), map(normalized, en), strict=True):
        if not all(pair) or pair[0] in test_fr or pair in seen or pair in exclude:
            continue
        seen.add(pair)
        kept.append(pair)
    return kept


def stem_pairs(sources: Sequence[bytes]) -> Pairs:
    """A training stem's pairs from ``(raw fr, raw en, newstest2013.fr, newstest2014.fr[,
    excluded fr, excluded en])``."""
    raw_fr, raw_en, *tests = sources
    excluded: set[tuple[str, str]] = set()
    if len(tests) == 4:
        excluded = set(zip(lines_of(tests[2]), lines_of(tests[3]), strict=True))
        tests = tests[:2]
    test_fr = {line for test in tests for line in lines_of(test)}
    return clean_pairs(lines_of(raw_fr), lines_of(raw_en), test_fr, excluded)


def tatoeba_pairs(sources: Sequence[bytes]) -> Pairs:
    """Tatoeba's (fr, en) pairs: its zip's ``fra-eng/fra.txt``, English then French in the
    first two tab-separated columns, cleaned as a training stem (no test-set filter)."""
    try:
        with zipfile.ZipFile(io.BytesIO(sources[0])) as archive:
            data = archive.read(TATOEBA_MEMBER)
    except (zipfile.BadZipFile, KeyError) as err:
        raise CleaningError(f"no readable {TATOEBA_MEMBER} in the Tatoeba zip ({err})") from None
    rows = [line.split("\t") for line in lines_of(data)]
    if any(len(row) < 2 for row in rows):
        raise CleaningError(f"a line of {TATOEBA_MEMBER} has no tab")
    return clean_pairs([row[1] for row in rows], [row[0] for row in rows], set(), set())


def side(pairs: Callable[[Sequence[bytes]], Pairs], index: int) -> Callable[..., bytes]:
    """The recipe of one side (0 French, 1 English) of ``pairs``' result."""
    return lambda sources: text_of(pair[index] for pair in pairs(sources))


RECIPES: dict[str, Callable[[Sequence[bytes]], bytes]] = {
    "copy": copy,
    "lines": lines,
    "sgm_segments": sgm_segments,
    "pairs_fr": side(stem_pairs, 0),
    "pairs_en": side(stem_pairs, 1),
    "tatoeba_fr": side(tatoeba_pairs, 0),
    "tatoeba_en": side(tatoeba_pairs, 1),
}
"""Every recipe :mod:`posenc.data.sources` may name."""
