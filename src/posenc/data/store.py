"""A prepared training corpus on disk: the token ids of every cleaned training pair in flat
NumPy arrays, memory-mapped by every run that asks for the same data, so that a second run (a
sweep's next job, another seed, every torchrun rank) reads no text, tokenises nothing and holds
no Python lists: the page cache keeps one copy for all.

Layout of a store directory (fairseq's binarised arrays, in NumPy form)::

    src.bin, tgt.bin   the ids of every row, concatenated (uint16, or uint32 for vocabularies
                       over 65,536 tokens)
    src.off, tgt.off   int64 offsets: row i is bin[off[i]:off[i + 1]]
    tokenizer/         the tokenizer the ids belong to
    meta.json          format, rows, dtype, the key it was made for (:func:`store_key`), the
                       vocabulary size and a SHA-256 of the tokenizer's files

It is written into a temporary directory beside it (with the umask's permissions) and renamed
into place when complete, so a killed preparation leaves nothing a later run trusts; a store
directory without its ``meta.json`` is set aside (``.NAME.damaged-*``) when it is prepared
again. A store is shared ground (a lab file system, a copied cache): :func:`open_store` checks
it before a run trusts it, in time linear in its size and at flat memory, chunk by chunk (so it
stays interruptible): the key it was made for is its folder's name, the tokenizer is the one it
was made with, every offset lies between the previous one and the end of its ids, and every id
is below the vocabulary size. Its name is a digest of what it depends
on (:func:`store_key`): the data and tokenizer settings (folders and files by their real
paths, so a relative spelling names the same store), the sizes and modification times of the
files read, the tokenizers library's version and this format's. Length limits are not part
of it: :meth:`TokenStore.within` selects rows by their lengths.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from posenc.config import plain
from posenc.data.corpus import DataError
from posenc.data.tokenizer import Tokenizer

#: the layout version: a change makes new stores instead of misreading old ones
FORMAT = 2
#: values read at once while a store is checked
CHECK_CHUNK = 1 << 22
SIDES = ("src", "tgt")


class TokenColumn(Sequence[list[int]]):
    """One side of a store, as a sequence of id lists: ``column[i]`` is row ``i``'s ids, read
    from the memory-mapped ids and offsets. :meth:`lengths` reads the offsets file instead of
    the map, so a pass over every row's length leaves no pages resident in the process."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, offsets_file: Path) -> None:
        self._ids, self._offsets, self._offsets_file = ids, offsets, offsets_file

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):  # a row index, as the training loop asks (slices are not needed)
        return self._ids[self._offsets[i] : self._offsets[i + 1]].tolist()

    def lengths(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Token counts of rows ``[start, stop)`` (``stop`` None: to the end), ``(rows,)``
        int32."""
        stop = len(self) if stop is None else stop
        ends = np.fromfile(
            self._offsets_file, dtype=np.int64, count=stop - start + 1, offset=8 * start
        )
        return np.diff(ends).astype(np.int32)


class TokenStore:
    """The training pairs of a store directory, memory-mapped (read-only)."""

    def __init__(self, src: TokenColumn, tgt: TokenColumn) -> None:
        self.src, self.tgt = src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def within(
        self,
        max_positions: int | None,
        max_source_tokens: int | None,
        start: int = 0,
        stop: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``[start, stop)`` whose sides fit ``max_positions`` tokens with EOS and
        whose source has at most ``max_source_tokens`` tokens (None: no limit), in store order
        (the rows and order that :func:`posenc.training.inputs.encode_pairs` keeps from the
        same pairs), with their lengths: ``(rows, src_lengths, tgt_lengths)``, ``(kept,)``
        int64, int32, int32."""
        src, tgt = self.src.lengths(start, stop), self.tgt.lengths(start, stop)
        keep = np.ones(len(src), dtype=bool)
        if max_positions:
            keep &= np.maximum(src, tgt) + 1 <= max_positions
        if max_source_tokens:
            keep &= src <= max_source_tokens
        kept = np.flatnonzero(keep)
        return kept + start, src[kept], tgt[kept]


def store_key(data: Mapping, tokenizer: Mapping) -> str:
    """The digest naming the store of the training pairs of the ``data`` and ``tokenizer``
    config nodes (see the module doc)."""
    import tokenizers

    data, tokenizer = plain(data), plain(tokenizer)
    files = _stamps(data, tokenizer)
    for node, path in ((data, "dir"), (tokenizer, "vocab_file")):  # one folder, however spelled
        if node.get(path):
            node[path] = os.path.realpath(Path(node[path]).expanduser())
    settings = [FORMAT, tokenizers.__version__, data, tokenizer, files]
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _stamps(data: dict, tokenizer: dict) -> list[tuple[str, int, int]]:
    """``(real path, size, mtime_ns)`` of the files the store is made from: local training and
    held-out stems on both sides, and a vocabulary file."""
    paths = []
    if data.get("kind") == "local" and data.get("dir"):
        directory = Path(data["dir"]).expanduser()
        stems = data.get("train") or []
        stems = [stems] if isinstance(stems, str) else list(stems)
        stems += [h["stem"] for h in (data.get("holdout") or {}).values() if "stem" in h]
        paths += [
            directory / f"{s}.{data[lang]}" for s in stems for lang in ("src_lang", "tgt_lang")
        ]
    if tokenizer.get("vocab_file"):
        paths.append(Path(tokenizer["vocab_file"]).expanduser())
    stamps = []
    for path in paths:
        real = os.path.realpath(path)
        try:
            info = os.stat(real)
        except OSError:
            continue  # missing: the loader names it when the store is built
        stamps.append((real, info.st_size, info.st_mtime_ns))
    return stamps


class StoreWriter:
    """Writes a store in chunks of rows: ``with StoreWriter(directory, vocab_size) as writer:
    writer.append(flatten(src_rows, writer.dtype), flatten(tgt_rows, writer.dtype)) ...;
    writer.finish(tokenizer)``. Rows go to a temporary directory beside ``directory``, renamed
    into place by :meth:`finish`; leaving the ``with`` block without it (an error, a kill)
    leaves nothing a later run trusts. When another process
    finished the same store first, theirs is kept."""

    def __init__(self, directory: Path, vocab_size: int) -> None:
        self.directory = directory
        self.vocab_size = vocab_size
        self.dtype = np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        self.work.chmod(0o777 & ~current_umask())  # mkdtemp's 0700 would outlive the rename
        self._bins = {side: (self.work / f"{side}.bin").open("wb") for side in SIDES}
        self._ends = {side: [np.zeros(1, np.int64)] for side in SIDES}
        self._sizes = dict.fromkeys(SIDES, 0)
        self.rows = 0

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._bins.values():
            handle.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def append(
        self, src: tuple[np.ndarray, np.ndarray], tgt: tuple[np.ndarray, np.ndarray]
    ) -> None:
        """Add rows of aligned pairs, each side as :func:`flatten` gives it: ``(ids,
        lengths)``."""
        if len(src[1]) != len(tgt[1]):
            raise ValueError(f"{len(src[1])} source rows but {len(tgt[1])} target rows")
        for side, (flat, lengths) in zip(SIDES, (src, tgt), strict=True):
            try:
                flat.astype(self.dtype, copy=False).tofile(self._bins[side])
            except OSError as err:  # a full disk: numpy says only "N requested and M written"
                raise DataError(
                    f"writing the prepared corpus into {self.work.parent} failed ({err}); is "
                    "the disk full? free space there or point cache_dir (POSENC_CACHE) elsewhere"
                ) from None
            self._ends[side].append(self._sizes[side] + np.cumsum(lengths))
            self._sizes[side] += int(lengths.sum())
        self.rows += len(src[1])

    def finish(self, tokenizer: Tokenizer, **facts) -> None:
        """Write the offsets, ``tokenizer`` and ``meta.json`` (with ``facts``, e.g. cleaning
        counts), then rename the store into place."""
        for side in SIDES:
            self._bins[side].close()
            np.concatenate(self._ends[side]).astype(np.int64).tofile(self.work / f"{side}.off")
        tokenizer.save(self.work / "tokenizer")
        meta = {
            "format": FORMAT,
            "rows": self.rows,
            "dtype": self.dtype.name,
            "key": self.directory.name,
            "vocab_size": self.vocab_size,
            "tokenizer_sha256": files_digest(self.work / "tokenizer"),
            **facts,
        }
        (self.work / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        if self.directory.is_dir() and not (self.directory / "meta.json").is_file():
            aside = Path(
                tempfile.mkdtemp(
                    prefix=f".{self.directory.name}.damaged-", dir=self.directory.parent
                )
            )
            self.directory.rename(aside / "store")  # a store without its meta: kept, not used
        try:
            self.work.rename(self.directory)
        except OSError:
            if not (self.directory / "meta.json").is_file():
                raise


def flatten(rows: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` of ids as one flat array of ``dtype`` and their lengths, ``(ids, lengths)``
    (``(total,)``, ``(len(rows),)`` int64)."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), dtype, int(lengths.sum())), lengths


def open_store(directory: Path) -> TokenStore:
    """The store in ``directory``, memory-mapped, once checked (see the module docstring).

    Raises:
        DataError: its files are missing, do not agree with one another or with the key,
            tokenizer and vocabulary it was made for (one line naming the store and the fix).
    """
    try:
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        rows, dtype = int(meta["rows"]), np.dtype(meta["dtype"])
        if meta.get("format") != FORMAT or dtype not in (np.uint16, np.uint32):
            raise ValueError(f"format {meta.get('format')}, dtype {dtype}")
        if meta.get("key") != directory.name:
            raise ValueError(f"it was made for the settings {meta.get('key')!r}, not these")
        if meta.get("tokenizer_sha256") != files_digest(directory / "tokenizer"):
            raise ValueError("its tokenizer is not the one its ids were made with")
        vocab_size = int(meta["vocab_size"])
        columns = []
        for side in SIDES:
            offsets = np.memmap(directory / f"{side}.off", dtype=np.int64, mode="r")
            size = (directory / f"{side}.bin").stat().st_size // dtype.itemsize
            if len(offsets) != rows + 1 or offsets[0] != 0 or offsets[-1] != size:
                raise ValueError(f"{side}.off does not match {side}.bin and {rows} rows")
            ids = (
                np.memmap(directory / f"{side}.bin", dtype=dtype, mode="r")
                if size
                else np.zeros(0, dtype)
            )
            _check_offsets(offsets, side)
            _check_ids(ids, vocab_size, side)
            columns.append(TokenColumn(ids, offsets, directory / f"{side}.off"))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(
            f"the prepared corpus {directory} is damaged ({err}); delete it and run again to "
            "prepare it anew"
        ) from None
    return TokenStore(*columns)


def _check_offsets(offsets: np.ndarray, side: str) -> None:
    """Every offset at least the one before it (the first is 0, the last the end of the ids:
    checked before), a chunk at a time."""
    for start in range(0, len(offsets) - 1, CHECK_CHUNK):
        chunk = np.asarray(offsets[start : start + CHECK_CHUNK + 1])
        if (np.diff(chunk) < 0).any():
            row = start + int(np.flatnonzero(np.diff(chunk) < 0)[0])
            raise ValueError(f"{side}.off goes backwards at row {row}")


def _check_ids(ids: np.ndarray, vocab_size: int, side: str) -> None:
    """Every id below ``vocab_size``, a chunk at a time."""
    for start in range(0, len(ids), CHECK_CHUNK):
        largest = int(np.asarray(ids[start : start + CHECK_CHUNK]).max())
        if largest >= vocab_size:
            raise ValueError(
                f"{side}.bin holds id {largest}, beyond its {vocab_size}-token vocabulary"
            )


def files_digest(directory: Path) -> str:
    """SHA-256 over the names and bytes of the files in ``directory`` (sorted; links are not
    followed: a link makes the digest differ from the store's)."""
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        digest.update(path.name.encode() + b"\0")
        if path.is_symlink() or not path.is_file():
            digest.update(b"<not a file>")
            continue
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def current_umask() -> int:
    """The process's umask (read by setting it back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def prepared(root: Path, key: str) -> Path:
    """Where the store named ``key`` lives under the cache directory ``root``."""
    return Path(root).expanduser() / "stores" / key


def store_directory(root: str | Path, data: Mapping, tokenizer: Mapping) -> Path:
    """Where the store of the ``data`` and ``tokenizer`` config nodes, as a run's config gives
    them (:func:`store_key`), lives under the cache directory ``root``."""
    return prepared(Path(root), store_key(data, tokenizer))
