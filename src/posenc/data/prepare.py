"""Preparing the training corpus as a store (:mod:`posenc.data.store`), streamed. Memory
grows with the corpus by a few int64 arrays only: the training pairs are read one at a time,
filtered and spooled to text files on disk (the byte offsets of their lines, 16 bytes a pair),
deduplicated by their 64-bit digests (8 bytes a pair, then a sort); their order is shuffled
with ``data.seed``; the tokenizer is built from the spool (a BPE on its first
``tokenizer.train_sentences`` pairs when set); the pairs are tokenised in chunks by one worker
process per core and written in order; the store is renamed into place when complete.

Ahead of a sweep, with the overrides ``train.py`` takes::

    python -m posenc.data.prepare data=local tokenizer=bpe

A run prepares on first use when nothing is there (:func:`posenc.training.inputs.prepare`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import mmap
import os
import shutil
import signal
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.config.data import DataConfig, TokenizerConfig
from posenc.config.settings import Settings
from posenc.data.splits import training_stream
from posenc.data.store import StoreWriter, flatten, store_directory
from posenc.data.streams import Cleaner, sendable_pairs, shuffled_order
from posenc.data.tokenizer import Tokenizer, build_tokenizer
from posenc.runtime import distributed
from posenc.runtime.progress import bar_disabled

log = logging.getLogger("posenc.data.prepare")

#: pairs tokenised and written at a time
CHUNK_PAIRS = 50_000


class SpooledSide(Sequence[str]):
    """One side of the spooled pairs in a given order: ``side[i]`` is the text of pair
    ``order[i]``, read from the memory-mapped spool file."""

    def __init__(self, text: mmap.mmap | bytes, ends: np.ndarray, order: np.ndarray) -> None:
        self._text, self._ends, self._order = text, ends, order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._line(row) for row in self._order[i]]
        return self._line(self._order[i])

    def __iter__(self) -> Iterator[str]:
        return (self._line(row) for row in self._order)

    def _line(self, row: int) -> str:
        start = self._ends[row - 1] if row else 0
        return self._text[start : self._ends[row] - 1].decode("utf-8")

    def release(self) -> None:
        """Drop the spool pages read so far from this process (they stay in the page cache):
        read through the map, a whole spool would count in the process's resident memory."""
        if isinstance(self._text, mmap.mmap):
            self._text.madvise(mmap.MADV_DONTNEED)


class SpooledCorpus:
    """The training split as the tokenizer builders read it (``src``, ``tgt``, ``len``)."""

    def __init__(self, src: SpooledSide, tgt: SpooledSide) -> None:
        self.name, self.src, self.tgt = "train", src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def release(self) -> None:
        """:meth:`SpooledSide.release` on both sides."""
        self.src.release()
        self.tgt.release()


class Spool:
    """Cleaned training pairs written one line a side to ``DIR/spool.{src,tgt}``, with the
    byte offset of each line's end (8 bytes a pair a side in memory)."""

    def __init__(self, directory: Path) -> None:
        self.paths = {side: directory / f"spool.{side}" for side in ("src", "tgt")}
        self._handles = {side: path.open("wb") for side, path in self.paths.items()}
        self._ends = {side: array("q") for side in self.paths}
        self._sizes = dict.fromkeys(self.paths, 0)

    def __len__(self) -> int:
        return len(self._ends["src"])

    def add(self, source: str, target: str) -> None:
        for side, text in (("src", source), ("tgt", target)):
            data = text.encode("utf-8") + b"\n"
            self._handles[side].write(data)
            self._sizes[side] += len(data)
            self._ends[side].append(self._sizes[side])

    def corpus(self, order: Sequence[int]) -> SpooledCorpus:
        """The spooled pairs in ``order``, memory-mapped (the spool is closed for writing)."""
        rows = np.asarray(order, dtype=np.int64)
        sides = []
        for side, handle in self._handles.items():
            handle.close()
            ends = np.frombuffer(self._ends[side], dtype=np.int64)
            with self.paths[side].open("rb") as reader:
                text = mmap.mmap(reader.fileno(), 0, access=mmap.ACCESS_READ) if len(ends) else b""
            sides.append(SpooledSide(text, ends, rows))
        return SpooledCorpus(*sides)


def prepare_store(
    data: DataConfig, tokenizer: TokenizerConfig, directory: Path, progress: bool = False
) -> dict:
    """Prepare the store ``directory`` for ``data`` and ``tokenizer`` (see the module doc);
    returns the facts written to its ``meta.json`` (counts and seconds).

    Raises:
        DataError: bad data or settings (one line, before anything is kept).
    """
    from tqdm import tqdm

    clean = data.clean
    started = time.perf_counter()
    directory.parent.mkdir(parents=True, exist_ok=True)
    spool_dir = Path(tempfile.mkdtemp(prefix=f".{directory.name}.spool.", dir=directory.parent))
    try:
        spool = Spool(spool_dir)
        cleaner = Cleaner.of(clean) if clean else None
        with tqdm(desc="reading", unit=" pairs", disable=bar_disabled(progress)) as bar:
            stream = _Counted(training_stream(data), bar)
            passing = (
                (pair for pair in stream if cleaner.keeps(*pair))
                if cleaner
                else sendable_pairs("train", stream)
            )
            for source, target in passing:
                spool.add(source, target)
        read = stream.count
        rows = cleaner.distinct() if cleaner else np.arange(len(spool), dtype=np.int64)
        if cleaner:
            cleaner.report()
        order = shuffled_order(len(rows), data.seed, data.train_size)
        train = spool.corpus(rows[np.asarray(order)])
        kept = len(rows)
        del rows, order  # 16 bytes a pair, no longer needed
        tokenizing = time.perf_counter()
        built = build_tokenizer(tokenizer, train, None)
        train.release()
        tokenised = time.perf_counter()
        with StoreWriter(directory, built.vocab_size) as writer:
            _write_ids(writer, train, built, progress)
            facts = {
                "pairs_read": read,
                "pairs_kept": kept,
                "seconds_reading": round(tokenizing - started, 1),
                "seconds_tokenizer": round(tokenised - tokenizing, 1),
                "seconds_total": round(time.perf_counter() - started, 1),
            }
            writer.finish(built, **facts)
    finally:
        shutil.rmtree(spool_dir, ignore_errors=True)
    log.info(
        "prepared %d training pairs (of %d read) in %.0f s (%.0f pairs/s) in %s",
        len(train),
        read,
        facts["seconds_total"],
        read / max(facts["seconds_total"], 1e-9),
        directory,
    )
    return facts


def prepared_store(
    data: DataConfig, tokenizer: TokenizerConfig, directory: Path, progress: bool = False
) -> Path:
    """``directory`` (:func:`~posenc.data.store.store_directory`), the prepared corpus of
    ``data`` and ``tokenizer``, prepared first when there is none (:func:`prepare_store`, one
    process at a time). Under torchrun rank 0 prepares while the other ranks wait."""
    if distributed.is_main() and not (directory / "meta.json").is_file():
        from filelock import FileLock

        with FileLock(str(directory) + ".lock"):  # one preparation at a time per store
            if not (directory / "meta.json").is_file():
                _remove_leftovers(directory)
                prepare_store(data, tokenizer, directory, progress)
    distributed.barrier()
    return directory


def run_store(settings: Settings, progress: bool = False) -> Path:
    """The prepared corpus of a run's data and tokenizer (:func:`prepared_store`), in the
    directory its data and tokenizer nodes, as the run's config gives them, name under its
    cache directory (:func:`~posenc.data.store.store_directory`)."""
    given = settings.composed
    directory = store_directory(settings.run.cache_dir, given["data"], given["tokenizer"])
    return prepared_store(settings.data, settings.tokenizer, directory, progress)


def _remove_leftovers(directory: Path) -> None:
    """Delete the temporary folders (``.NAME.*``: spool, unfinished store) that a killed
    preparation of ``directory`` left beside it; called under its lock, so none is in use."""
    for leftover in directory.parent.glob(f".{directory.name}.*"):
        if leftover.is_dir():
            log.info("removing %s, left by a preparation that was killed", leftover.name)
            shutil.rmtree(leftover, ignore_errors=True)


class _Counted:
    """A stream that counts its items (``count``) and shows them on a progress ``bar`` (every
    10,000: a bar update per pair would cost more than reading it)."""

    def __init__(self, stream: Iterator, bar) -> None:
        self.stream, self.bar, self.count = stream, bar, 0

    def __iter__(self) -> Iterator:
        for item in self.stream:
            self.count += 1
            if self.count % 10_000 == 0:
                self.bar.update(10_000)
            yield item


#: what a worker tokenises from (the spooled corpus, the tokenizer, the store's id type); set
#: before the workers are forked, so they share it with the preparing process
_WORK: tuple[SpooledCorpus, Tokenizer, np.dtype] | None = None


def _encoded_chunk(start: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The ids of the chunk of :data:`CHUNK_PAIRS` pairs from ``start``, both sides flat
    (:func:`~posenc.data.store.flatten`)."""
    train, tokenizer, dtype = _WORK
    end = start + CHUNK_PAIRS
    src = flatten(tokenizer.encode_batch(train.src[start:end]), dtype)
    tgt = flatten(tokenizer.encode_batch(train.tgt[start:end]), dtype)
    train.release()
    return src, tgt


#: Linux's prctl option that sends the caller a signal when its parent ends
PR_SET_PDEATHSIG = 1


def _worker_signals(parent: int) -> None:
    """A worker's signals: SIGTERM ends it (the pool ends its workers so), Ctrl-C is the
    preparing process's to handle. A fork inherits the parent's handlers, and training's,
    installed while it prepares its corpus, would swallow the pool's SIGTERM: the run would wait
    for its workers forever. On Linux the worker is also killed when the preparing process
    ``parent`` ends in any way (``kill -9`` included): a fork shares its parent's open files,
    the run's lock among them, and an orphan finishing its chunk would hold the lock for
    seconds after its run was gone."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent ended before the request took effect
            os._exit(1)


@contextlib.contextmanager
def _workers(count: int) -> Iterator[Any]:
    """A pool of ``count`` forked worker processes (None below two). Each tokenises with one
    thread (``tokenizers`` turns its own parallelism off after a fork; the variable set around
    the fork says so instead of a warning) and has :func:`_worker_signals`."""
    if count < 2:
        yield None
        return
    import multiprocessing

    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        pool = multiprocessing.get_context("fork").Pool(
            count, initializer=_worker_signals, initargs=(os.getpid(),)
        )
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    with pool:
        yield pool


def _write_ids(
    writer: StoreWriter, train: SpooledCorpus, tokenizer: Tokenizer, progress: bool
) -> None:
    """Tokenise ``train`` in chunks of :data:`CHUNK_PAIRS` pairs and append the ids, in order.
    With more than one chunk, one worker process per core tokenises them (one encoder thread
    each, so the encoder and the Python work around it, reading the spooled lines and
    flattening the ids, run on every core)."""
    from tqdm import tqdm

    global _WORK
    starts = range(0, len(train), CHUNK_PAIRS)
    _WORK = (train, tokenizer, writer.dtype)
    try:
        with (
            tqdm(
                total=len(train), desc="tokenising", unit=" pairs", disable=bar_disabled(progress)
            ) as bar,
            _workers(min(len(os.sched_getaffinity(0)), len(starts))) as pool,
        ):
            chunks = pool.imap(_encoded_chunk, starts) if pool else map(_encoded_chunk, starts)
            for src, tgt in chunks:
                writer.append(src, tgt)
                bar.update(len(src[1]))
    finally:
        _WORK = None


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.data.prepare [OVERRIDE ...]``: prepare the store ``train.py`` with
    the same overrides would use, print where it is and what it holds."""
    from hydra import compose, initialize_config_dir

    from posenc.config import CONFIG_DIR
    from posenc.data.corpus import DataError
    from posenc.data.fetch import use_local_mix
    from posenc.runtime.cli import one_line_errors

    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        print(__doc__)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors("posenc.data.prepare", (DataError, ValueError)):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("train", overrides=args)
        use_local_mix(cfg)
        directory = run_store(Settings.of(cfg), progress=True)
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        print(f"{directory}: {meta['rows']:,} training pairs, {size / 2**20:,.1f} MiB")


if __name__ == "__main__":
    main()
