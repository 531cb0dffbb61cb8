"""Subword tokenizers: a joint BPE trained with ``tokenizers`` on the training split, or the
multilingual BERT (mBERT) WordPiece vocabulary, by default cut down to the types that occur in
the training split.

Both are a :class:`Tokenizer` wrapping a ``tokenizers.Tokenizer``, so batch encoding runs in
Rust, and ``save``/``load_tokenizer`` go through the library's ``tokenizer.json``.

The BPE is trained in :mod:`posenc.data.bpe` (its design is described there).

mBERT design (``training_types_only``, on by default): of the 119,547 WordPiece types, only the
special tokens and the types that occur in the training split (either side; the vocabulary is
joint) are given to the model, as compact ids ``0 .. n_kept-1`` in WordPiece-id order. The output
layer and the embedding are most of a small model with the full vocabulary, and the rows of types
that never occur in training are never trained towards anything, so they are not paid for. Text
is tokenised by WordPiece exactly as before and then mapped to compact ids; a type absent from
the training split (it can occur in a test set) becomes ``[UNK]``, and decoding maps compact ids
back and detokenises as before."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from posenc.config.data import BpeTokenizer, MbertTokenizer, TokenizerConfig
from posenc.data.corpus import Corpus, DataError, resolve_path
from posenc.data.splits import hub_unreachable
from posenc.runtime import untrusted
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.data.tokenizer")

BPE_SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
MBERT_SPECIALS = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}
TYPES_CACHE_FORMAT = "posenc-mbert-types-1"  # likewise for the kept mBERT types
META_FILE = "posenc_tokenizer.json"
KEPT_FILE = "posenc_kept_ids.json"  # the kept WordPiece ids of a compact mBERT, in order
TYPES_CHUNK = 10_000  # sentences tokenised at a time when collecting the training types


#: the line boundaries of :meth:`str.splitlines` (``\\r\\n`` counts as one)
LINE_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with each of its line breaks (:data:`LINE_BREAK`) made a space: a sentence is
    one line of a file. Text read from data has none (:func:`~posenc.data.streams.normalise`);
    a byte-level model that has not learnt yet can emit them, and one would shift every later
    line of its hypotheses file."""
    return LINE_BREAK.sub(" ", text)


class Tokenizer:
    """Text <-> ids with the special tokens the model uses.

    Attributes:
        pad_id, bos_id, eos_id, unk_id: ids of the special tokens.
        vocab_size: number of ids (special tokens included).
        name: a short label for logs and reports.
        kind: ``bpe`` or ``mbert``.
        path: the cache file a BPE was trained into or reused from, or that a compact mBERT's
            kept types were written to or read from (None otherwise).
    """

    def __init__(self, backend: HFTokenizer, kind: str, name: str, specials: Mapping[str, str]):
        backend.encode_special_tokens = True  # "<s>" typed in a sentence is text, not BOS
        self.backend, self.kind, self.name = backend, kind, name
        self.specials = dict(specials)
        ids = {role: backend.token_to_id(token) for role, token in self.specials.items()}
        missing = [self.specials[role] for role, i in ids.items() if i is None]
        if missing:
            raise DataError(f"tokenizer vocabulary lacks special tokens {missing}; rebuild it")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (
            ids["pad"],
            ids["bos"],
            ids["eos"],
            ids["unk"],
        )
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.path: Path | None = None

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, without special tokens (parallel, in Rust)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ``ids``, one line (:func:`one_line`); special tokens are
        skipped."""
        return one_line(self.backend.decode(list(ids), skip_special_tokens=True))

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """:meth:`decode` of each id list (parallel, in Rust)."""
        texts = self.backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=True)
        return [one_line(text) for text in texts]

    def save(self, directory: Path) -> None:
        """Write ``tokenizer.json`` and ``posenc_tokenizer.json`` so :func:`load_tokenizer` can
        rebuild this tokenizer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / "tokenizer.json", self.backend.to_str())
        write_text(directory / META_FILE, json.dumps(self._meta(directory), indent=2))

    def _meta(self, directory: Path) -> dict:
        """What ``posenc_tokenizer.json`` holds (subclasses may write more files)."""
        return {"kind": self.kind, "name": self.name, "specials": self.specials}


class WordPieceTokenizer(Tokenizer):
    """mBERT WordPiece, whose decoding also re-joins what BERT's pre-tokenizer split apart.

    BERT splits every punctuation mark into its own token and keeps no record of the spaces, so
    ``l'homme``, ``est-il`` and ``3.5`` come back as ``l ' homme``, ``est - il`` and ``3. 5``.
    :meth:`decode` joins an apostrophe or hyphen between two word characters and a ``.``/``,``
    between two digits: exactly the cases that sacreBLEU's 13a tokenizer keeps as one token, so
    BLEU is not penalised for them. Other spacing may still differ from the input.

    With ``kept_ids`` (sorted WordPiece ids, the four special tokens among them) the tokenizer
    is compact: the model's id ``i`` is WordPiece id ``kept_ids[i]``, ``vocab_size`` is
    ``len(kept_ids)`` and ``pad_id``/``bos_id``/``eos_id``/``unk_id`` are the compact ids of
    ``[PAD]``/``[CLS]``/``[SEP]``/``[UNK]``. Encoding tokenises with the full WordPiece
    vocabulary and maps every type not kept to ``[UNK]``: a word piece that never occurred in
    training gets the ``[UNK]`` embedding row instead of its own untrained one, and decoding can
    never produce it (it could not usefully before either: its output row was only ever pushed
    down in training). Decoding maps back to WordPiece ids and detokenises as without
    ``kept_ids``. Without ``kept_ids`` the ids are mBERT's own (119,547 of them).

    Attributes:
        kept_ids: the kept WordPiece ids in compact-id order, or None (full vocabulary).
        full_vocab_size: the size of the WordPiece vocabulary itself.
    """

    JOINS = (
        (re.compile(r"(?<=\w) ([-'\u2019]) (?=\w)"), r"\1"),
        (re.compile(r"(?<=\d)([.,]) (?=\d)"), r"\1"),
    )

    def __init__(
        self,
        backend: HFTokenizer,
        kind: str,
        name: str,
        specials: Mapping[str, str],
        kept_ids: Sequence[int] | None = None,
    ):
        super().__init__(backend, kind, name, specials)
        self.full_vocab_size = self.vocab_size
        self.kept_ids: list[int] | None = None
        if kept_ids is not None:
            self._compact(kept_ids)

    def _compact(self, kept_ids: Sequence[int]) -> None:
        """Switch to the compact ids of ``kept_ids`` (see the class doc)."""
        kept = [int(i) for i in kept_ids]
        roles = {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id}
        if (
            kept != sorted(set(kept))
            or not kept
            or kept[0] < 0
            or kept[-1] >= self.full_vocab_size
            or not set(roles.values()) <= set(kept)
        ):
            raise DataError(
                f"the kept mBERT types ({len(kept)} ids) are not sorted distinct ids of this "
                f"{self.full_vocab_size}-token vocabulary with its special tokens; rebuild the "
                "tokenizer"
            )
        compact = {wordpiece: i for i, wordpiece in enumerate(kept)}
        self._to_compact = [compact[self.unk_id]] * self.full_vocab_size
        for wordpiece, i in compact.items():
            self._to_compact[wordpiece] = i
        self.kept_ids = kept
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (
            compact[roles[role]] for role in ("pad", "bos", "eos", "unk")
        )
        self.vocab_size = len(kept)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, without special tokens; types not kept are ``unk_id``."""
        return self._model_ids(super().encode(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` of each text (tokenised in parallel, in Rust)."""
        return [self._model_ids(ids) for ids in super().encode_batch(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ``ids``; special tokens are skipped."""
        return self._join(super().decode(self._wordpiece_ids(ids)))

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """:meth:`decode` of each id list."""
        rows = [self._wordpiece_ids(ids) for ids in batch]
        return [self._join(text) for text in super().decode_batch(rows)]

    def _model_ids(self, ids: list[int]) -> list[int]:
        if self.kept_ids is None:
            return ids
        to_compact = self._to_compact
        return [to_compact[i] for i in ids]

    def _wordpiece_ids(self, ids: Sequence[int]) -> Sequence[int]:
        if self.kept_ids is None:
            return ids
        kept = self.kept_ids
        return [kept[i] for i in ids]

    def _meta(self, directory: Path) -> dict:
        """The base meta, and for a compact tokenizer ``kept_ids_file`` naming the file (beside
        it) that holds the kept WordPiece ids."""
        meta = super()._meta(directory)
        if self.kept_ids is None:
            (directory / KEPT_FILE).unlink(missing_ok=True)
        else:
            write_text(directory / KEPT_FILE, json.dumps(self.kept_ids))
            meta.update(
                kept_ids_file=KEPT_FILE,
                vocab_size=self.vocab_size,
                full_vocab_size=self.full_vocab_size,
            )
        return meta

    def _join(self, text: str) -> str:
        for pattern, replacement in self.JOINS:
            text = pattern.sub(replacement, text)
        return text


#: the most bytes :func:`load_tokenizer` reads of each file (mBERT's tokenizer.json is ~3 MB)
MAX_BYTES = {"tokenizer.json": 200_000_000, META_FILE: 1_000_000, KEPT_FILE: 10_000_000}
STR = untrusted.STR
#: what ``posenc_tokenizer.json`` must hold (``specials``: a string for each role, pad, bos, ...)
META_SCHEMA = untrusted.Fields(
    {
        "kind": untrusted.one_of("bpe", "mbert"),
        "name": STR,
        "specials": untrusted.Fields(dict.fromkeys(BPE_SPECIALS, STR), others=STR),
    },
    {"kept_ids_file": untrusted.one_of(KEPT_FILE)},
)


def _read_saved(path: Path, schema: untrusted.Schema | None = None) -> Any:
    """A file :meth:`Tokenizer.save` wrote, read with a size limit (:data:`MAX_BYTES`): its JSON
    checked against ``schema``, or without one (``tokenizer.json``) the ``tokenizers`` model.

    Raises:
        DataError: one line naming the file and what is wrong.
    """
    fix = "copy the run's whole tokenizer/ directory or retrain"
    try:
        if schema is not None:
            return untrusted.check(untrusted.read_json(path, MAX_BYTES[path.name]), schema, path)
        return HFTokenizer.from_str(untrusted.read_text(path, MAX_BYTES[path.name]))
    except untrusted.UntrustedFileError as err:
        raise DataError(f"{err.path}: {err.problem}; {fix}") from None
    except Exception as err:  # the tokenizers library's parse errors are plain Exceptions
        problem = (str(err).splitlines() or [type(err).__name__])[0]
        raise DataError(f"{path}: tokenizers cannot read it ({problem}); {fix}") from None


def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer that :meth:`Tokenizer.save` wrote to ``directory``, its files read with size
    limits and checked (:data:`META_SCHEMA`; the kept ids a list of integers).

    Raises:
        DataError: a file is missing, too large, or not what :meth:`Tokenizer.save` writes.
    """
    directory = Path(directory)
    meta_path, model_path = directory / META_FILE, directory / "tokenizer.json"
    if not (meta_path.is_file() and model_path.is_file()):
        raise DataError(
            f"no saved tokenizer in {directory} (need tokenizer.json and {META_FILE}); "
            "point to a run's tokenizer/ directory"
        )
    meta, backend = _read_saved(meta_path, META_SCHEMA), _read_saved(model_path)
    if meta["kind"] != "mbert":
        return Tokenizer(backend, meta["kind"], meta["name"], meta["specials"])
    kept = None
    if meta.get("kept_ids_file"):
        kept = _read_saved(directory / KEPT_FILE, untrusted.ListOf(untrusted.INT))
    return WordPieceTokenizer(backend, "mbert", meta["name"], meta["specials"], kept)


def build_tokenizer(cfg: TokenizerConfig, train: Corpus, cache_dir: Path | None) -> Tokenizer:
    """The tokenizer the ``tokenizer`` settings describe (typed at the door:
    :func:`~posenc.config.data.tokenizer_config`).

    ``kind: bpe`` trains a joint BPE on both sides of ``train`` (:mod:`posenc.data.bpe`; or
    reuses the one cached in ``cache_dir`` under a hash of the data and the settings);
    ``kind: mbert`` loads the mBERT vocabulary and, with ``training_types_only`` (true in
    ``configs/tokenizer/mbert.yaml``; absent counts as false, as in runs from before the
    setting), keeps only the special tokens and the types that occur in ``train`` (cached in
    ``cache_dir`` under a hash of the vocabulary and the data); with ``training_types_only:
    false`` ``train`` and ``cache_dir`` are unused. ``cache_dir=None`` caches nothing (a
    prepared corpus keeps its tokenizer itself). ``train`` may be any object with ``src`` and
    ``tgt`` sequences and a length (a prepared corpus's spool).
    """
    cache = None if cache_dir is None else Path(cache_dir).expanduser()
    if isinstance(cfg, BpeTokenizer):
        from posenc.data.bpe import build_bpe  # bpe builds on this module's Tokenizer

        return build_bpe(cfg, train, cache)
    return _build_mbert(cfg, train, cache)


def text_cache_key(settings: Mapping, train: Corpus, recipe: str) -> str:
    """Hash of the recipe, the settings and the training text (order-independent: the same
    pairs in another order give the same BPE counts or types, so one cached file serves every
    seed)."""
    import tokenizers

    h = hashlib.sha256()
    h.update(json.dumps([recipe, tokenizers.__version__, dict(settings)]).encode())
    for side in (train.src, train.tgt):
        h.update(b"\x00side\x00")
        for line in sorted(side):
            h.update(line.encode("utf-8"))
            h.update(b"\n")
    return h.hexdigest()[:20]


# --- mBERT -----------------------------------------------------------------------------------


def _wordpiece_from_vocab(vocab_file: Path) -> HFTokenizer:
    """Cased mBERT WordPiece (no lower-casing, accents kept) from a ``vocab.txt``."""
    backend = HFTokenizer(models.WordPiece.from_file(str(vocab_file), unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.add_special_tokens([*MBERT_SPECIALS.values(), "[MASK]"])
    return backend


def _build_mbert(cfg: MbertTokenizer, train: Corpus, cache_dir: Path | None) -> Tokenizer:
    """mBERT from the local ``vocab_file`` when it exists, else ``name_or_path`` from the hub;
    compact (the types of ``train`` only) when ``training_types_only`` is true."""
    name, vocab_file = cfg.name_or_path, cfg.vocab_file
    if vocab_file and resolve_path(vocab_file).is_file():
        backend = _wordpiece_from_vocab(resolve_path(vocab_file))
        log.info("mBERT vocabulary from %s", resolve_path(vocab_file))
    else:
        try:
            backend = HFTokenizer.from_pretrained(name)
        except Exception as err:
            if hub_unreachable(err):
                raise DataError(
                    f"mBERT vocabulary file {vocab_file} is missing and the Hugging Face hub is "
                    f"unreachable for {name!r}; set tokenizer.vocab_file or POSENC_DATA"
                ) from None
            raise
        log.info("mBERT vocabulary from the hub (%s)", name)
    tokenizer = WordPieceTokenizer(backend, "mbert", cfg.name, MBERT_SPECIALS)
    if not cfg.training_types_only:
        return tokenizer
    if not len(train):
        raise DataError(
            "cannot keep the training split's mBERT types: the training split is empty; check "
            "the data config or set tokenizer.training_types_only=false"
        )
    if cache_dir is None:
        kept, path = _training_types(tokenizer, train), None
    else:
        kept, path = _cached_training_types(tokenizer, train, cache_dir)
    tokenizer._compact(kept)
    tokenizer.path = path
    return tokenizer


def _cached_training_types(
    tokenizer: WordPieceTokenizer, train: Corpus, cache_dir: Path
) -> tuple[list[int], Path]:
    """The kept WordPiece ids (:func:`_training_types`) and the cache file they are in: read
    from ``cache_dir`` when a previous build of the same vocabulary and training text wrote
    them, else collected and written there (tokenising the training split takes seconds)."""
    from filelock import FileLock

    vocabulary = hashlib.sha256(tokenizer.backend.to_str().encode("utf-8")).hexdigest()
    key = text_cache_key({"vocabulary": vocabulary}, train, TYPES_CACHE_FORMAT)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"mbert-types-{key}.json"
    with FileLock(str(path) + ".lock"):  # jobs of a sweep wait for one another, count once
        if path.is_file():
            kept = json.loads(path.read_text(encoding="utf-8"))
            log.info("reusing the cached %d kept mBERT types %s", len(kept), path)
        else:
            started = time.perf_counter()
            kept = _training_types(tokenizer, train)
            write_text(path, json.dumps(kept))
            log.info(
                "kept %d of %d mBERT types (the special tokens and the types of %d training "
                "pairs) in %.1f s; cached at %s",
                len(kept),
                tokenizer.full_vocab_size,
                len(train),
                time.perf_counter() - started,
                path,
            )
    return kept, path


def _training_types(tokenizer: WordPieceTokenizer, train: Corpus) -> list[int]:
    """The WordPiece ids of the four special tokens and of every type in either side of
    ``train`` (``[UNK]`` included when a word has no WordPiece spelling), sorted."""
    backend = tokenizer.backend
    seen = {backend.token_to_id(token) for token in MBERT_SPECIALS.values()}
    for side in (train.src, train.tgt):
        for start in range(0, len(side), TYPES_CHUNK):
            chunk = list(side[start : start + TYPES_CHUNK])
            for encoding in backend.encode_batch(chunk, add_special_tokens=False):
                seen.update(encoding.ids)
    return sorted(seen)
