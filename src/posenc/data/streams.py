"""Training text as streams: lines of plain or gzip files read one at a time, line-aligned pairs,
in-domain held-out sets carved out of a training stem, and the cleaning filters (dedup by
digests), so that preparing a corpus of any size holds one pair at a time plus 8 bytes a pair.

Every bad input raises :class:`~posenc.data.corpus.DataError` with a one-line message that names
the problem and the fix.
"""

from __future__ import annotations

import gzip
import logging
import random
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from posenc.data.corpus import Corpus, DataError

log = logging.getLogger("posenc.data.splits")

MAX_LINE_CHARS = 10_000  # longer lines are broken input (no sentence is this long): dropped
# Control characters that are not whitespace (whitespace ones, tab or CR, become spaces)
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
CLEAN_FILTERS = ("empty", "length", "ratio", "duplicate")
CLEAN_SETTINGS = ("min_words", "max_words", "max_ratio", "dedup")
#: compressed files are read when ``STEM.LANG`` is absent and ``STEM.LANG.gz`` is there
COMPRESSED = ".gz"


def normalise(line: str) -> str:
    """Whitespace runs (any Unicode whitespace, e.g. NBSP or tab) to one space, ends stripped;
    other control characters (NUL, ESC, ...) removed."""
    return " ".join(CONTROL.sub("", line).split())


def digest(*texts: str) -> int:
    """A 64-bit digest of ``texts``, equal for equal texts within one process (Python's string
    hash: fast, and never stored, so its per-process salt does not matter). Two different
    pairs share one with probability about n^2 / 2^65 among n pairs (3e-5 for all of WMT14)."""
    return hash(texts)


def text_file(directory: Path, stem: str, lang: str) -> Path:
    """``directory/STEM.LANG``, or ``STEM.LANG.gz`` when only the compressed file exists.

    Raises:
        DataError: neither exists.
    """
    plain = directory / f"{stem}.{lang}"
    if plain.is_file():
        return plain
    compressed = plain.with_name(plain.name + COMPRESSED)
    if compressed.is_file():
        return compressed
    raise DataError(
        f"missing data file {plain} (or {compressed.name}); set data.dir or the POSENC_DATA "
        "environment variable to the folder that holds it"
    )


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == COMPRESSED else path.open("rb")


#: bytes read at a time: decoding and splitting a block at once is several times faster than
#: decoding line by line
BLOCK_BYTES = 1 << 22


def _blocks(handle: IO[bytes]) -> Iterator[bytes]:
    """The file in blocks of whole lines (each ends with ``\n`` but maybe the last)."""
    rest = b""
    while block := handle.read(BLOCK_BYTES):
        block = rest + block
        cut = block.rfind(b"\n") + 1
        rest = block[cut:]
        if cut:
            yield block[:cut]
    if rest:
        yield rest


def lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (plain or gzip), whitespace-normalised, streamed (empty
    lines kept as ``""``).

    Lines are split on ``\n`` only (so alignment never depends on other Unicode line breaks);
    a UTF-8 byte-order mark is ignored; control characters other than whitespace are removed
    (the lines that had some are counted in a warning at the end).

    Raises:
        DataError: a line is not UTF-8, the file is empty or not a valid gzip file.
    """
    count = dirty = 0
    try:
        with _open(path) as handle:
            for block in _blocks(handle):
                if not count:
                    block = block.removeprefix(b"\xef\xbb\xbf")
                try:
                    text = block.decode("utf-8")
                except UnicodeDecodeError as err:
                    line = count + block.count(b"\n", 0, err.start) + 1
                    raise DataError(
                        f"{path} line {line} is not valid UTF-8 ({err.reason}); re-encode the "
                        "file as UTF-8"
                    ) from None
                block_lines = text.split("\n")
                if block_lines[-1] == "":
                    block_lines.pop()
                for line in block_lines:
                    if CONTROL.search(line):
                        dirty += 1
                        line = CONTROL.sub("", line)
                    yield " ".join(line.split())
                count += len(block_lines)
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read {path} ({err}); download it again") from None
    if not count:
        raise DataError(f"data file {path} is empty; check it (a failed download?) or its stem")
    if dirty:
        log.warning("%s: removed control characters from %d lines", path, dirty)


def pairs(directory: Path, stem: str, src_lang: str, tgt_lang: str) -> Iterator[tuple[str, str]]:
    """The line-aligned pairs of ``STEM.SRC_LANG`` and ``STEM.TGT_LANG`` (plain or gzip).

    Raises:
        DataError: a file is missing or broken, or their line counts differ (raised when the
            shorter one ends, with both counts).
    """
    src_path = text_file(directory, stem, src_lang)
    tgt_path = text_file(directory, stem, tgt_lang)
    sources, targets = lines(src_path), lines(tgt_path)
    count = 0
    for count, source in enumerate(sources, start=1):  # noqa: B007 (count is read after)
        target = next(targets, None)
        if target is None:
            rest = sum(1 for _ in sources)
            raise DataError(
                f"line counts differ: {src_path} has {count + rest} lines, {tgt_path} has "
                f"{count - 1} lines; the two files must be line-aligned"
            )
        yield source, target
    rest = sum(1 for _ in targets)
    if rest:
        raise DataError(
            f"line counts differ: {src_path} has {count} lines, {tgt_path} has {count + rest} "
            "lines; the two files must be line-aligned"
        )


# --- held-out sets carved out of a training stem ---------------------------------------------


#: the sides of a held-out pair that no training pair may share (``data.holdout_drops``); a
#: config without the key (runs made before it existed) drops shared sources only
HOLDOUT_SIDES = ("source", "target")


@dataclass
class Carving:
    """In-domain test sets to cut out of training stems: for each set its stem and the indices
    of its pairs there in the sample's order (``chosen``), the indices each stem loses
    (``taken``: stem -> indices) and the digests of every held-out source and target (a
    training pair with one of those, on the sides named by ``drops``, is dropped too). The sets'
    text is collected by a pass over the stems (:func:`training_pairs` or
    :func:`held_out_sets`)."""

    chosen: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    taken: dict[str, set[int]] = field(default_factory=dict)
    sources: set[int] = field(default_factory=set)
    targets: set[int] = field(default_factory=set)
    drops: tuple[str, ...] = HOLDOUT_SIDES

    def shares(self, source: str, target: str) -> bool:
        """Whether a training pair shares a dropped side with a held-out pair."""
        return (
            "source" in self.drops and bool(self.sources) and digest(source) in self.sources
        ) or ("target" in self.drops and bool(self.targets) and digest(target) in self.targets)


def carve_holdout(
    read: Callable[[str], Iterable[tuple[str, str]]],
    stems: list[str],
    holdout: Mapping,
    seed: int,
    drops: Sequence[str] = HOLDOUT_SIDES,
) -> Carving:
    """The held-out sets of ``data.holdout`` (name -> ``{stem, size}``): a seeded random sample
    of ``size`` pairs of that stem (``read(stem)`` streams its pairs), each with a distinct,
    non-empty source, in the sample's (random) order so ``eval.max_sentences`` keeps a random
    subset; training then drops every pair that shares a side named in ``drops`` (``source``,
    ``target``) with a held-out pair. Reads each holdout stem once and keeps 16 bytes per
    distinct source."""
    unknown = sorted(set(drops) - set(HOLDOUT_SIDES))
    if unknown or not drops:
        raise DataError(
            f"data.holdout_drops={list(drops)}: name one or both of {list(HOLDOUT_SIDES)}"
        )
    carving = Carving(drops=tuple(drops))
    for name, spec in holdout.items():
        if not isinstance(spec, Mapping) or set(spec) != {"stem", "size"}:
            raise DataError(f"data.holdout.{name} must be {{stem: STEM, size: N}}, got {spec!r}")
        stem, size = spec["stem"], spec["size"]
        if stem not in stems:
            raise DataError(
                f"data.holdout.{name}.stem {stem!r} is not in data.train; a holdout is cut out "
                "of training data (for a separate file use data.extra_tests)"
            )
        taken = carving.taken.setdefault(stem, set())
        first: dict[int, int] = {}  # source digest -> index of its first pair
        target_at: dict[int, int] = {}  # that pair's target digest
        for i, (s, t) in enumerate(read(stem)):
            if s and t and i not in taken and digest(s) not in first:
                first[digest(s)] = i
                target_at[i] = digest(t)
        source_of = {i: key for key, i in first.items()}
        candidates = sorted(source_of)
        del first
        if not isinstance(size, int) or not 0 < size < len(candidates):
            raise DataError(
                f"data.holdout.{name}.size must be an integer in [1, {len(candidates)}) (the "
                f"distinct sources of {stem}), got {size!r}"
            )
        chosen = random.Random(f"holdout:{seed}:{name}").sample(candidates, size)
        carving.chosen[name] = (stem, chosen)
        carving.sources.update(source_of[i] for i in chosen)
        carving.targets.update(target_at[i] for i in chosen)
        del target_at
        taken.update(chosen)
        log.info("%s: %d pairs held out of %s", name, size, stem)
    return carving


def _collect(carving: Carving, found: dict[tuple[str, int], tuple[str, str]]) -> dict[str, Corpus]:
    """The held-out sets from their pairs ``found`` by (stem, index)."""
    sets = {}
    for name, (stem, chosen) in carving.chosen.items():
        both = [found[stem, i] for i in chosen]
        sets[name] = Corpus(name, [s for s, _ in both], [t for _, t in both])
    return sets


def held_out_sets(
    read: Callable[[str], Iterable[tuple[str, str]]], carving: Carving
) -> dict[str, Corpus]:
    """The held-out sets' pairs, read from their stems only."""
    found = {}
    for stem, taken in carving.taken.items():
        found.update(((stem, i), pair) for i, pair in enumerate(read(stem)) if i in taken)
    return _collect(carving, found)


def training_pairs(
    read: Callable[[str], Iterable[tuple[str, str]]],
    stems: list[str],
    carving: Carving,
    held_out: dict[str, Corpus] | None = None,
) -> Iterator[tuple[str, str]]:
    """The pairs of the training ``stems`` in order, without the held-out pairs and without
    every pair that shares a dropped side with one (:meth:`Carving.shares`; logged at the
    end). When ``held_out`` is given, the held-out sets are put there once the stream ends."""
    dropped = 0
    found: dict[tuple[str, int], tuple[str, str]] = {}
    for stem in stems:
        taken = carving.taken.get(stem, set())
        count = 0
        for i, (s, t) in enumerate(read(stem)):
            count += 1
            if i in taken:
                found[stem, i] = (s, t)
            elif carving.shares(s, t):
                dropped += 1
            else:
                yield s, t
        log.info("train: %s: %d pairs", stem, count)
    if carving.chosen:
        log.info(
            "train: dropped %d more pairs whose %s is held out", dropped, " or ".join(carving.drops)
        )
    if held_out is not None:
        held_out.update(_collect(carving, found))


# --- cleaning ---------------------------------------------------------------------------------


class Cleaner:
    """The training pairs' filters, applied one pair at a time; each pair is counted under the
    first filter that drops it.

    In order: pairs with an empty side (``empty``); pairs with a side of fewer than
    ``min_words`` or more than ``max_words`` whitespace-separated words (``length``); pairs
    whose word-count ratio, longer side over shorter side, exceeds ``max_ratio`` (``ratio``);
    repeats of an earlier identical (src, tgt) pair when ``dedup`` (``duplicate``, found by a
    64-bit digest of the pair). ``stats`` counts ``input``, each filter and ``kept``.

    Repeats are found once every pair is read: :meth:`keeps` applies the other filters and
    keeps the digest of each pair it passes in an int64 array (8 bytes a pair, where a set of
    them holds about 70, so a streamed preparation stays small); :meth:`distinct` then gives
    the positions of the first of each distinct pair among those passed.
    """

    def __init__(self, min_words: int, max_words: int, max_ratio: float, dedup: bool) -> None:
        if not 0 <= min_words <= max_words or max_ratio < 1:
            raise DataError(
                f"bad data.clean settings min_words={min_words}, max_words={max_words}, "
                f"max_ratio={max_ratio}; need 0 <= min_words <= max_words and max_ratio >= 1"
            )
        self.min_words, self.max_words, self.max_ratio = min_words, max_words, max_ratio
        self.dedup = dedup
        self.digests = array("q")  # of the pairs passed, with dedup
        self.stats = dict.fromkeys(("input", *CLEAN_FILTERS, "kept"), 0)

    @classmethod
    def of(cls, clean: Mapping) -> Cleaner:
        """The cleaner of a ``data.clean`` node (exactly :data:`CLEAN_SETTINGS`)."""
        if set(clean) != set(CLEAN_SETTINGS):
            raise DataError(
                f"data.clean has keys {sorted(clean)}; it needs exactly {list(CLEAN_SETTINGS)}"
            )
        return cls(**clean)

    def distinct(self) -> np.ndarray:
        """Positions, among the pairs :meth:`keeps` passed, of those kept: with ``dedup`` the
        first of each distinct pair, ascending, the repeats moved from ``kept`` to
        ``duplicate`` in ``stats``; otherwise all. ``(kept,)`` int64. Call it once, when every
        pair has been read, and before :meth:`report`."""
        if not self.dedup:
            return np.arange(self.stats["kept"], dtype=np.int64)
        digests = np.frombuffer(self.digests, dtype=np.int64) if self.digests else np.zeros(0, int)
        first = np.sort(np.unique(digests, return_index=True)[1]).astype(np.int64)
        self.stats["duplicate"] += self.stats["kept"] - len(first)
        self.stats["kept"] = len(first)
        self.digests = array("q")
        return first

    def keeps(self, source: str, target: str) -> bool:
        """Whether the pair passes every filter (counted in ``stats`` either way)."""
        self.stats["input"] += 1
        ns, nt = len(source.split()), len(target.split())
        if ns == 0 or nt == 0:
            reason = "empty"
        elif not (
            self.min_words <= ns <= self.max_words and self.min_words <= nt <= self.max_words
        ):
            reason = "length"
        elif max(ns, nt) > self.max_ratio * min(ns, nt):
            reason = "ratio"
        else:
            self.stats["kept"] += 1
            if self.dedup:
                self.digests.append(digest(source, target))
            return True
        self.stats[reason] += 1
        return False

    def report(self, name: str = "train") -> None:
        """Log the counts; raise when nothing was kept.

        Raises:
            DataError: every pair was dropped (names the filter that dropped most).
        """
        stats = self.stats
        log.info(
            "%s: %d pairs read; dropped %s; kept %d",
            name,
            stats["input"],
            ", ".join(f"{stats[k]} {k}" for k in CLEAN_FILTERS),
            stats["kept"],
        )
        if not stats["kept"]:
            worst = max(CLEAN_FILTERS, key=lambda k: stats[k])
            raise DataError(
                f"split {name!r} is empty after cleaning: the {worst!r} filter dropped "
                f"{stats[worst]} of {stats['input']} pairs; relax data.clean or check the files"
            )


def sendable_pairs(name: str, stream: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """The pairs of ``stream`` with two non-empty sides of at most :data:`MAX_LINE_CHARS`
    characters (a longer line is broken input); the dropped ones are counted in the log when
    the stream ends.

    Raises:
        DataError: no pair was kept (at the end of the stream).
    """
    kept = empty = long = 0
    for source, target in stream:
        if not (source and target):
            empty += 1
        elif max(len(source), len(target)) > MAX_LINE_CHARS:
            long += 1
        else:
            kept += 1
            yield source, target
    if empty:
        log.info("%s: dropped %d pairs with an empty side", name, empty)
    if long:
        log.warning(
            "%s: dropped %d pairs with a side over %d characters (broken lines?)",
            name,
            long,
            MAX_LINE_CHARS,
        )
    if not kept:
        raise DataError(
            f"split {name!r} has no pair with two non-empty sides ({empty} empty); check its files"
        )


def kept_pairs(stream: Iterable[tuple[str, str]], clean: Mapping | None) -> list[tuple[str, str]]:
    """The training pairs of ``stream`` that ``data.clean`` keeps (:class:`Cleaner`; without
    it, those with two sides: :func:`sendable_pairs`), in order, counted in the log."""
    if not clean:
        return list(sendable_pairs("train", stream))
    cleaner = Cleaner.of(clean)
    passed = [pair for pair in stream if cleaner.keeps(*pair)]
    kept = [passed[i] for i in cleaner.distinct()]
    cleaner.report()
    return kept


def shuffled_order(count: int, seed: int, size: int | None) -> array:
    """The training pairs' order: ``range(count)`` shuffled with ``seed`` (Python's
    ``random.Random``), cut to ``size`` when set; an int64 ``array`` (8 bytes a pair, where a
    list holds about 40), the same order as a shuffled list."""
    order = array("q", range(count))
    random.Random(seed).shuffle(order)
    return order if size is None else order[: int(size)]
