"""Subword tokenizers: a joint BPE trained with ``tokenizers`` on the training split, or the
multilingual BERT (mBERT) WordPiece vocabulary.

Both are a :class:`Tokenizer` wrapping a ``tokenizers.Tokenizer``, so batch encoding runs in
Rust, and ``save``/``load_tokenizer`` go through the library's ``tokenizer.json``.

BPE design: NFC normalisation, then a space is prepended to the text and a byte-level
pre-tokenizer maps every byte to a symbol; the decoder maps the bytes back and strips the
prepended space. So ``decode(encode(s)) == unicodedata.normalize("NFC", s)`` for any text
(accents, punctuation, tabs, repeated spaces), and a word looks the same at the start of a
sentence as in its middle. Vocabularies of at least :data:`BYTE_ALPHABET_MIN_VOCAB` contain all
256 byte symbols, so nothing is ever ``<unk>``; smaller ones (toy runs) start from the bytes
seen in training. Special tokens in the input text (``"<s>"``) are encoded as plain text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from posenc.config import plain
from posenc.data.corpora import hub_unreachable
from posenc.data.corpus import Corpus, DataError, resolve_path
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.data.tokenizer")

BPE_SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
MBERT_SPECIALS = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}
BYTE_ALPHABET_MIN_VOCAB = 1024
CACHE_FORMAT = "posenc-bpe-1"  # change when the BPE recipe changes, to invalidate caches
META_FILE = "posenc_tokenizer.json"


class Tokenizer:
    """Text <-> ids with the special tokens the model uses.

    Attributes:
        pad_id, bos_id, eos_id, unk_id: ids of the special tokens.
        vocab_size: number of ids (special tokens included).
        name: a short label for logs and reports.
        kind: ``bpe`` or ``mbert``.
        path: the cache file a BPE was trained into or reused from (None otherwise).
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
        """Detokenised text of ``ids``; special tokens are skipped."""
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """:meth:`decode` of each id list (parallel, in Rust)."""
        return self.backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=True)

    def save(self, directory: Path) -> None:
        """Write ``tokenizer.json`` and ``posenc_tokenizer.json`` so :func:`load_tokenizer` can
        rebuild this tokenizer."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / "tokenizer.json", self.backend.to_str())
        meta = {"kind": self.kind, "name": self.name, "specials": self.specials}
        write_text(directory / META_FILE, json.dumps(meta, indent=2))


class WordPieceTokenizer(Tokenizer):
    """mBERT WordPiece, whose decoding also re-joins what BERT's pre-tokenizer split apart.

    BERT splits every punctuation mark into its own token and keeps no record of the spaces, so
    ``l'homme``, ``est-il`` and ``3.5`` come back as ``l ' homme``, ``est - il`` and ``3. 5``.
    :meth:`decode` joins an apostrophe or hyphen between two word characters and a ``.``/``,``
    between two digits: exactly the cases that sacreBLEU's 13a tokenizer keeps as one token, so
    BLEU is not penalised for them. Other spacing may still differ from the input.
    """

    JOINS = (
        (re.compile(r"(?<=\w) ([-'\u2019]) (?=\w)"), r"\1"),
        (re.compile(r"(?<=\d)([.,]) (?=\d)"), r"\1"),
    )

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenised text of ``ids``; special tokens are skipped."""
        return self._join(super().decode(ids))

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """:meth:`decode` of each id list."""
        return [self._join(text) for text in super().decode_batch(batch)]

    def _join(self, text: str) -> str:
        for pattern, replacement in self.JOINS:
            text = pattern.sub(replacement, text)
        return text


def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer that :meth:`Tokenizer.save` wrote to ``directory``."""
    directory = Path(directory)
    meta_path, model_path = directory / META_FILE, directory / "tokenizer.json"
    if not (meta_path.is_file() and model_path.is_file()):
        raise DataError(
            f"no saved tokenizer in {directory} (need tokenizer.json and {META_FILE}); "
            "point to a run's tokenizer/ directory"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    backend = HFTokenizer.from_file(str(model_path))
    cls = WordPieceTokenizer if meta["kind"] == "mbert" else Tokenizer
    return cls(backend, meta["kind"], meta["name"], meta["specials"])


def build_tokenizer(cfg: Mapping, train: Corpus, cache_dir: Path) -> Tokenizer:
    """The tokenizer described by the ``tokenizer`` config node.

    ``kind: bpe`` trains a joint BPE on both sides of ``train`` (or reuses the one cached in
    ``cache_dir`` under a hash of the data and the settings); ``kind: mbert`` loads the mBERT
    vocabulary (``train`` and ``cache_dir`` are unused).
    """
    cfg = plain(cfg)
    kind = cfg.get("kind")
    if kind == "bpe":
        return _build_bpe(cfg, train, Path(cache_dir).expanduser())
    if kind == "mbert":
        return _build_mbert(cfg)
    raise DataError(f"unknown tokenizer.kind {kind!r}; use bpe or mbert")


# --- BPE -------------------------------------------------------------------------------------


def _bpe_settings(cfg: Mapping) -> dict:
    vocab_size, min_frequency = int(cfg.get("vocab_size", 8000)), int(cfg.get("min_frequency", 2))
    if vocab_size <= len(BPE_SPECIALS) or min_frequency < 1:
        raise DataError(
            f"bad BPE settings vocab_size={vocab_size}, min_frequency={min_frequency}; need "
            f"vocab_size > {len(BPE_SPECIALS)} and min_frequency >= 1"
        )
    return {"vocab_size": vocab_size, "min_frequency": min_frequency}


def _cache_key(settings: Mapping, train: Corpus) -> str:
    """Hash of the recipe, the settings and the training text (order-independent: the same
    pairs in another order give the same BPE counts, so one cached model serves every seed)."""
    import tokenizers

    h = hashlib.sha256()
    h.update(json.dumps([CACHE_FORMAT, tokenizers.__version__, dict(settings)]).encode())
    for side in (train.src, train.tgt):
        h.update(b"\x00side\x00")
        for line in sorted(side):
            h.update(line.encode("utf-8"))
            h.update(b"\n")
    return h.hexdigest()[:20]


def _new_bpe() -> HFTokenizer:
    """An untrained BPE with the normaliser/pre-tokenizer/decoder described in the module doc."""
    backend = HFTokenizer(models.BPE(unk_token=BPE_SPECIALS["unk"]))
    backend.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Prepend(" ")])
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    return backend


def _train_bpe(settings: Mapping, train: Corpus) -> HFTokenizer:
    """A BPE trained on both sides of ``train``; special tokens get ids 0..3."""
    backend = _new_bpe()
    alphabet = (
        pre_tokenizers.ByteLevel.alphabet()
        if settings["vocab_size"] >= BYTE_ALPHABET_MIN_VOCAB
        else []
    )
    trainer = trainers.BpeTrainer(
        vocab_size=settings["vocab_size"],
        min_frequency=settings["min_frequency"],
        special_tokens=list(BPE_SPECIALS.values()),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    backend.train_from_iterator(
        (line for side in (train.src, train.tgt) for line in side),
        trainer=trainer,
        length=2 * len(train),
    )
    return backend


def _build_bpe(cfg: Mapping, train: Corpus, cache_dir: Path) -> Tokenizer:
    from filelock import FileLock

    settings = _bpe_settings(cfg)
    if not len(train):
        raise DataError("cannot train a BPE on an empty training split; check the data config")
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"bpe-{_cache_key(settings, train)}.json"
    with FileLock(str(path) + ".lock"):  # jobs of a sweep wait for one another, train once
        if path.is_file():
            backend = HFTokenizer.from_file(str(path))
            log.info("reusing cached BPE %s", path)
        else:
            started = time.perf_counter()
            backend = _train_bpe(settings, train)
            write_text(path, backend.to_str())
            log.info(
                "trained BPE (%d tokens) on %d pairs in %.1f s; cached at %s",
                backend.get_vocab_size(),
                len(train),
                time.perf_counter() - started,
                path,
            )
    tokenizer = Tokenizer(backend, "bpe", str(cfg.get("name", "bpe")), BPE_SPECIALS)
    tokenizer.path = path
    return tokenizer


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


def _build_mbert(cfg: Mapping) -> Tokenizer:
    """mBERT from the local ``vocab_file`` when it exists, else ``name_or_path`` from the hub."""
    name = str(cfg.get("name_or_path", "bert-base-multilingual-cased"))
    vocab_file = cfg.get("vocab_file")
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
    return WordPieceTokenizer(backend, "mbert", str(cfg.get("name", "mbert")), MBERT_SPECIALS)
