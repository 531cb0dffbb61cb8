"""The training and validation pairs as token ids: the training pairs from the prepared corpus
(made on first use: :mod:`posenc.data.prepare`), the validation pairs tokenised here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posenc.config.settings import Settings
from posenc.data.corpus import Corpus
from posenc.data.prepare import run_store
from posenc.data.splits import validation_split
from posenc.data.store import TokenStore, open_store
from posenc.data.tokenizer import Tokenizer, load_tokenizer
from posenc.runtime import distributed
from posenc.runtime.rundir import RunDir, as_run_dir


@dataclass
class EncodedData:
    """Token ids of the training pairs (the prepared corpus, memory-mapped; the length limits
    are applied by the batches: :class:`~posenc.data.pools.PooledBatcher`) and of the
    validation pairs."""

    train: TokenStore
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]
    valid_refs: list[str]  # the validation targets as text (validation BLEU's references)


def encode_pairs(
    tokenizer: Tokenizer,
    corpus: Corpus,
    max_positions: int | None = None,
    max_source_tokens: int | None = None,
) -> tuple[list[list[int]], list[list[int]], int]:
    """Ids of both sides. When limits are given, pairs with a side longer than
    ``max_positions`` tokens (EOS included) or a source longer than ``max_source_tokens``
    tokens (EOS excluded) are dropped. Returns ``(src_ids, tgt_ids, dropped)``."""
    src = tokenizer.encode_batch(corpus.src)
    tgt = tokenizer.encode_batch(corpus.tgt)
    longest = max_positions or float("inf")
    longest_source = max_source_tokens or float("inf")
    keep = [
        i
        for i in range(len(src))
        if max(len(src[i]), len(tgt[i])) + 1 <= longest and len(src[i]) <= longest_source
    ]
    return [src[i] for i in keep], [tgt[i] for i in keep], len(src) - len(keep)


def prepare(settings: Settings, run_dir: Path | RunDir) -> tuple[Tokenizer, EncodedData]:
    """The run's tokenizer (saved in ``RUN/tokenizer``) and its training and validation ids.

    The training pairs come from the prepared corpus of this data and tokenizer
    (:func:`~posenc.data.prepare.run_store`), memory-mapped. The validation pairs are read from
    their own file: a run on a prepared corpus reads no training text."""
    directory = run_store(settings, settings.trainer.progress)
    store = open_store(directory)  # checked before its tokenizer becomes the run's
    tokenizer = load_tokenizer(directory / "tokenizer")
    if distributed.is_main():
        tokenizer.save(as_run_dir(run_dir).tokenizer)
    valid = validation_split(settings.data)
    valid_src, valid_tgt, _ = encode_pairs(tokenizer, valid)
    return tokenizer, EncodedData(store, valid_src, valid_tgt, valid.tgt)
