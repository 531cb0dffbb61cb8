"""The training and validation pairs as token ids: the training pairs from the prepared corpus
(made on first use: corpora loaded and cleaned, the tokenizer built or reused), pairs over the
length limits dropped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from posenc.data.corpora import load_corpora
from posenc.data.corpus import Corpus
from posenc.data.store import TokenColumn, open_store, prepared, store_key, write_store
from posenc.data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer
from posenc.runtime import distributed
from posenc.runtime.rundir import RunDir, as_run_dir

log = logging.getLogger("posenc.training")


@dataclass
class EncodedData:
    """Token ids of the training pairs (memory-mapped columns of the prepared corpus, with
    their ``lengths``) and of the validation pairs."""

    train_src: TokenColumn
    train_tgt: TokenColumn
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
    """The run's tokenizer (saved in ``RUN/tokenizer``) and its training and validation ids.

    The training pairs come from the prepared corpus of this data and tokenizer
    (:mod:`posenc.data.store`), memory-mapped; when there is none yet, the corpora are loaded
    and cleaned, the tokenizer built (or reused from the cache) and the store written first.
    Pairs over the length limits are then left out. Under torchrun rank 0 prepares while the
    other ranks wait, then every rank maps the same files."""
    directory = prepared(cfg.cache_dir, store_key(cfg.data, cfg.tokenizer))
    if distributed.is_main() and not (directory / "meta.json").is_file():
        from filelock import FileLock

        with FileLock(str(directory) + ".lock"):  # one preparation at a time per store
            if not (directory / "meta.json").is_file():
                _prepare_store(cfg, directory)
    distributed.barrier()
    tokenizer = load_tokenizer(directory / "tokenizer")
    if distributed.is_main():
        tokenizer.save(as_run_dir(run_dir).tokenizer)
    t = cfg.trainer
    everything = open_store(directory)
    train = everything.within(t.max_positions, t.max_source_tokens)
    dropped = len(everything) - len(train)
    if dropped:
        log.info(
            "dropped %d training pairs over the length limits (max_positions=%s, "
            "max_source_tokens=%s)",
            dropped,
            t.max_positions,
            t.max_source_tokens,
        )
    if not len(train):
        raise ValueError("no training pairs left after tokenisation; raise trainer.max_positions")
    valid = load_corpora(cfg.data, with_train=False)["valid"]
    valid_src, valid_tgt, _ = encode_pairs(tokenizer, valid)
    return tokenizer, EncodedData(train.src, train.tgt, valid_src, valid_tgt)


def _prepare_store(cfg: DictConfig, directory: Path) -> None:
    """Load and clean the corpora, build (or reuse) the tokenizer and write the training pairs'
    ids as the store ``directory``."""
    corpora = load_corpora(cfg.data)
    tokenizer = build_tokenizer(cfg.tokenizer, corpora["train"], Path(cfg.cache_dir).expanduser())
    src, tgt, _ = encode_pairs(tokenizer, corpora["train"])
    write_store(directory, src, tgt, tokenizer)
    log.info("prepared %d training pairs in %s", len(src), directory)
