"""The built-in toy tasks: seeded symbol sequences and their reversal or rotation (see
``configs/data/toy.yaml``); every held-out source is unseen in training."""

from __future__ import annotations

import random

from posenc.config.data import DataConfig, ToyData
from posenc.data.corpus import Corpus, DataError, check_extra_names

TOY_TASKS = ("reverse", "rotate")


def toy_word(index: int) -> str:
    """The name of toy symbol ``index``: a, b, ..., z, aa, ab, ... (letters only, so a
    byte-level BPE, which splits letters from digits, can keep each symbol one token)."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(ord("a") + rest) + name
    return name


def _toy_target(symbols: list[str], task: str, shift: int) -> list[str]:
    if task == "reverse":
        return symbols[::-1]
    k = shift % len(symbols)
    return symbols[k:] + symbols[:k]


def load_toy(cfg: DataConfig, with_train: bool = True) -> dict[str, Corpus]:
    """Seeded symbol sequences and their reversal/rotation (see ``configs/data/toy.yaml``).

    Held-out sets are drawn first; training sequences equal to a held-out source are redrawn,
    so every held-out source is unseen in training (drawing them is cheap, so ``with_train``
    changes nothing here).
    """
    if not isinstance(cfg, ToyData):
        raise DataError(f"data.kind is {cfg.kind!r}; the toy task needs data.kind=toy")
    task = cfg.task
    if task not in TOY_TASKS:
        raise DataError(f"unknown toy task {task!r}; set data.task to one of {TOY_TASKS}")
    vocab_size, seed, shift = cfg.required("vocab_size"), cfg.seed, cfg.shift
    if vocab_size < 2:
        raise DataError(f"data.vocab_size is {vocab_size}; the toy task needs at least 2 symbols")
    words = [toy_word(i) for i in range(vocab_size)]

    def draw(name: str, size: int, lo: int, hi: int, avoid: set[str]) -> Corpus:
        if not 1 <= lo <= hi or size < 1:
            raise DataError(
                f"toy split {name!r}: need 1 <= min_len <= max_len and size >= 1, got "
                f"min_len={lo}, max_len={hi}, size={size}; fix data.{name} settings"
            )
        rng = random.Random(f"toy:{seed}:{name}")
        src, tgt = [], []
        attempts = 0
        while len(src) < size:
            attempts += 1
            if attempts > 100 * size:
                raise DataError(
                    f"toy split {name!r}: cannot draw {size} sequences unseen in the held-out "
                    "sets; raise data.vocab_size or data.max_len"
                )
            symbols = rng.choices(words, k=rng.randint(lo, hi))
            line = " ".join(symbols)
            if line in avoid:
                continue
            src.append(line)
            tgt.append(" ".join(_toy_target(symbols, task, shift)))
        return Corpus(name, src, tgt)

    lo, hi = cfg.required("min_len"), cfg.required("max_len")
    test_size = cfg.required("test_size")
    extra = cfg.extra_tests or {}
    check_extra_names(extra)
    held_out = {
        "valid": draw("valid", cfg.required("valid_size"), lo, hi, set()),
        "test": draw("test", test_size, lo, hi, set()),
    }
    for name, spec in extra.items():
        spec = dict(spec or {})
        size = int(spec.get("size", test_size))
        lo_x, hi_x = int(spec.get("min_len", lo)), int(spec.get("max_len", hi))
        held_out[name] = draw(name, size, lo_x, hi_x, set())
    avoid = {line for corpus in held_out.values() for line in corpus.src}
    return {"train": draw("train", cfg.required("train_size"), lo, hi, avoid), **held_out}
