"""The training and validation pairs as token ids: corpora loaded and cleaned, the tokenizer
built (or reused from the cache), pairs over the length limits dropped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from posenc.data.corpora import load_corpora
from posenc.data.corpus import Corpus
from posenc.data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer
from posenc.runtime import distributed
from posenc.runtime.rundir import RunDir, as_run_dir

log = logging.getLogger("posenc.training")


@dataclass
class EncodedData:
    """Token ids of the training and validation pairs."""

    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]


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


def prepare(cfg: DictConfig, run_dir: Path | RunDir) -> tuple[Tokenizer, EncodedData]:
    """Load and clean the corpora, build (or reuse) the tokenizer, encode train and valid.

    Under torchrun rank 0 builds the tokenizer and saves it in ``RUN/tokenizer``; the other
    ranks wait for it there and load it."""
    corpora = load_corpora(cfg.data)
    if distributed.is_main():
        cache_dir = Path(cfg.cache_dir).expanduser()
        tokenizer = build_tokenizer(cfg.tokenizer, corpora["train"], cache_dir)
        tokenizer.save(as_run_dir(run_dir).tokenizer)
    distributed.barrier()
    if not distributed.is_main():
        tokenizer = load_tokenizer(as_run_dir(run_dir).tokenizer)
    t = cfg.trainer
    train_src, train_tgt, dropped = encode_pairs(
        tokenizer, corpora["train"], t.max_positions, t.max_source_tokens
    )
    if dropped:
        log.info(
            "dropped %d training pairs over the length limits (max_positions=%s, "
            "max_source_tokens=%s)",
            dropped,
            t.max_positions,
            t.max_source_tokens,
        )
    if not train_src:
        raise ValueError("no training pairs left after tokenisation; raise trainer.max_positions")
    valid_src, valid_tgt, _ = encode_pairs(tokenizer, corpora["valid"])
    return tokenizer, EncodedData(train_src, train_tgt, valid_src, valid_tgt)
