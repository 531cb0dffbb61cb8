"""The joint byte-level BPE of ``tokenizer=bpe``. It is trained with ``tokenizers`` on both sides of
the training split (or on its first ``train_sentences`` pairs, a seeded sample since the split is
shuffled), cached under a hash of the text and the settings.

Design: NFC normalisation, then a space is prepended to the text and a byte-level pre-tokenizer
maps every byte to a symbol; the decoder maps the bytes back and strips the prepended space. So
``decode(encode(s)) == unicodedata.normalize("NFC", s)`` for any text (accents, punctuation,
tabs, repeated spaces), and a word looks the same at the start of a sentence as in its middle.
Vocabularies of at least :data:`BYTE_ALPHABET_MIN_VOCAB` contain all 256 byte symbols, so
nothing is ever ``<unk>``; smaller ones (toy runs) start from the bytes seen in training.
Special tokens in the input text (``"<s>"``) are encoded as plain text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from posenc.config.data import BpeTokenizer
from posenc.data.corpus import Corpus, DataError
from posenc.data.tokenizer import BPE_SPECIALS, Tokenizer, text_cache_key
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.data.tokenizer")

BYTE_ALPHABET_MIN_VOCAB = 1024
CACHE_FORMAT = "posenc-bpe-1"  # change when the BPE recipe changes, to invalidate caches


def _bpe_settings(cfg: BpeTokenizer) -> dict:
    """The settings a BPE depends on (``train_sentences`` only when set, so caches of the
    settings before it stay valid)."""
    if cfg.vocab_size <= len(BPE_SPECIALS):
        raise DataError(
            f"tokenizer.vocab_size={cfg.vocab_size} leaves no room beside the "
            f"{len(BPE_SPECIALS)} special tokens; set it above {len(BPE_SPECIALS)}"
        )
    settings = {"vocab_size": cfg.vocab_size, "min_frequency": cfg.min_frequency}
    if cfg.train_sentences is not None:
        settings["train_sentences"] = cfg.train_sentences
    return settings


class _FirstPairs:
    """The first ``count`` pairs of a training split (``src``, ``tgt``, ``len``)."""

    def __init__(self, train: Corpus, count: int) -> None:
        self.name, self.src, self.tgt = train.name, train.src[:count], train.tgt[:count]

    def __len__(self) -> int:
        return len(self.src)


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


def build_bpe(cfg: BpeTokenizer, train: Corpus, cache_dir: Path | None) -> Tokenizer:
    """The BPE of the ``tokenizer`` node ``cfg`` trained on ``train`` (the first
    ``train_sentences`` pairs when set), reused from ``cache_dir`` when it was trained on the
    same text with the same settings before (``cache_dir=None``: trained, not cached)."""
    settings = _bpe_settings(cfg)
    if not len(train):
        raise DataError("cannot train a BPE on an empty training split; check the data config")
    if settings.get("train_sentences", len(train)) < len(train):
        train = _FirstPairs(train, settings["train_sentences"])
    path = None
    if cache_dir is None:
        backend = _trained(settings, train, None)
    else:
        from filelock import FileLock

        cache_dir.mkdir(parents=True, exist_ok=True)
        path = cache_dir / f"bpe-{text_cache_key(settings, train, CACHE_FORMAT)}.json"
        with FileLock(str(path) + ".lock"):  # jobs of a sweep wait for one another, train once
            if path.is_file():
                backend = HFTokenizer.from_file(str(path))
                log.info("reusing cached BPE %s", path)
            else:
                backend = _trained(settings, train, path)
    tokenizer = Tokenizer(backend, "bpe", cfg.name, BPE_SPECIALS)
    tokenizer.path = path
    return tokenizer


def _trained(settings: Mapping, train: Corpus, path: Path | None) -> HFTokenizer:
    """A BPE trained on ``train`` (written to ``path`` when given), its cost logged."""
    started = time.perf_counter()
    backend = _train_bpe(settings, train)
    if path is not None:
        write_text(path, backend.to_str())
    log.info(
        "trained BPE (%d tokens) on %d pairs in %.1f s%s",
        backend.get_vocab_size(),
        len(train),
        time.perf_counter() - started,
        f"; cached at {path}" if path else "",
    )
    return backend
