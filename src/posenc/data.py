"""Corpora (a built-in toy task, local text files, or WMT14 from the Hugging Face hub), cleaning
of training pairs, token-bucketed batches and padding.

Data flows one way: ``load_corpora(cfg.data)`` returns the splits as plain sentence lists; the
tokenizer turns them into ids; :class:`TokenBatcher` groups example indices into batches under a
token budget; :func:`collate` pads one batch into tensors.

Every bad input raises :class:`DataError` with a one-line message that names the problem and the
fix.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor

log = logging.getLogger("posenc.data")

HELD_OUT = ("valid", "test")
MAX_LINE_CHARS = 10_000  # longer lines are broken input (no sentence is this long): dropped
# Control characters that are not whitespace (whitespace ones, tab or CR, become spaces)
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
CLEAN_FILTERS = ("empty", "length", "ratio", "duplicate")
CLEAN_SETTINGS = ("min_words", "max_words", "max_ratio", "dedup")


class DataError(ValueError):
    """A bad data input or data setting; the message is one line naming the problem and the fix."""


@dataclass
class Corpus:
    """Line-aligned sentence pairs of one split.

    Attributes:
        name: the split's name (``train``, ``valid``, ``test`` or an extra test set's name).
        src: source sentences, one string each.
        tgt: target sentences, ``len(tgt) == len(src)``.
    """

    name: str
    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)

    def subset(self, indices: Iterable[int]) -> Corpus:
        """The pairs at ``indices``, in that order."""
        indices = list(indices)
        return Corpus(self.name, [self.src[i] for i in indices], [self.tgt[i] for i in indices])


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_corpora(cfg: Mapping, with_train: bool = True) -> dict[str, Corpus]:
    """All splits described by the ``data`` config node (a DictConfig or a plain dict).

    Returns splits by name: ``train``, ``valid``, ``test``, plus one per extra test set (key =
    its name). Training pairs are cleaned with ``cfg.clean`` (see :func:`clean_pairs`) when the
    node has one, shuffled with ``cfg.seed`` and cut to ``cfg.train_size`` (a seeded random
    sample) when set. Held-out splits only lose pairs with an empty side (counted and logged);
    ``valid`` is a seeded random subset of ``cfg.valid_size`` pairs when set (original order
    kept), used for the validation loss during training. ``with_train=False`` (evaluation)
    returns the held-out splits only, the same ones, without streaming, cleaning or shuffling
    the training data (local held-out sets are still cut out of the training files).
    """
    cfg = plain_config(cfg)
    loaders: dict[str, Callable[[dict, bool], dict[str, Corpus]]] = {
        "toy": _load_toy,
        "local": _load_local,
        "wmt14": _load_wmt14,
    }
    kind = cfg.get("kind")
    if kind not in loaders:
        raise DataError(f"unknown data.kind {kind!r}; use one of {', '.join(loaders)}")
    splits = loaders[kind](cfg, with_train)
    if not with_train:
        splits.pop("train", None)
    return _prepare(splits, cfg)


def eval_splits(requested: Sequence[str], corpora: Mapping[str, Corpus]) -> list[str]:
    """The split names ``eval.splits`` asks for, in order; the entry ``all`` stands for every
    test split of the data (``test``, then the extra and held-out test sets; not ``valid``)."""
    names: list[str] = []
    for name in requested:
        if name == "all":
            names += [n for n in corpora if n not in ("train", "valid")]
        elif name not in corpora:
            raise DataError(
                f"eval.splits names {name!r}, but the data has only {sorted(corpora)} (or all)"
            )
        else:
            names.append(name)
    return list(dict.fromkeys(names))


def resolve_path(path: str | Path) -> Path:
    """``path`` made absolute against the directory the user launched from.

    Under Hydra the working directory may be the run directory, so relative paths are resolved
    with :func:`hydra.utils.to_absolute_path` (which falls back to the current directory when
    Hydra is not running). ``~`` is expanded.
    """
    from hydra.utils import to_absolute_path

    return Path(to_absolute_path(str(Path(path).expanduser())))


def plain_config(cfg: Mapping) -> dict:
    """A config node as a plain, resolved dict."""
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def _require(cfg: Mapping, key: str) -> Any:
    if cfg.get(key) is None:
        raise DataError(f"data config has no {key!r}; set data.{key} (see configs/data/*.yaml)")
    return cfg[key]


def _prepare(splits: dict[str, Corpus], cfg: dict) -> dict[str, Corpus]:
    """Clean, shuffle and cut the training split (when there is one); drop empty pairs of
    held-out splits."""
    seed = int(cfg.get("seed", 0))
    out = {"train": _prepare_train(splits["train"], cfg, seed)} if "train" in splits else {}
    for name, corpus in splits.items():
        if name != "train":
            out[name] = _drop_empty(corpus)
    if cfg.get("valid_size") is not None and len(out["valid"]) > int(cfg["valid_size"]):
        keep = random.Random(seed).sample(range(len(out["valid"])), int(cfg["valid_size"]))
        out["valid"] = out["valid"].subset(sorted(keep))
    log.info("splits: %s", ", ".join(f"{name} {len(c)}" for name, c in out.items()))
    return out


def _prepare_train(train: Corpus, cfg: dict, seed: int) -> Corpus:
    """The training split cleaned with ``cfg.clean``, shuffled with ``seed`` and cut to
    ``cfg.train_size``."""
    clean = cfg.get("clean")
    if clean:
        if set(clean) != set(CLEAN_SETTINGS):
            raise DataError(
                f"data.clean has keys {sorted(clean)}; it needs exactly {list(CLEAN_SETTINGS)}"
            )
        train, stats = clean_pairs(train, **clean)
        log.info(
            "train: %d pairs read; dropped %s; kept %d",
            stats["input"],
            ", ".join(f"{stats[k]} {k}" for k in CLEAN_FILTERS),
            stats["kept"],
        )
        if not train.src:
            worst = max(CLEAN_FILTERS, key=lambda k: stats[k])
            raise DataError(
                f"split 'train' is empty after cleaning: the {worst!r} filter dropped "
                f"{stats[worst]} of {stats['input']} pairs; relax data.clean or check the files"
            )
    else:
        train = _drop_empty(train)
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    if cfg.get("train_size") is not None:
        order = order[: int(cfg["train_size"])]
    return train.subset(order)


def _drop_empty(corpus: Corpus) -> Corpus:
    """``corpus`` without pairs that have an empty side or a side longer than
    :data:`MAX_LINE_CHARS` characters; logs how many went."""
    pairs = list(zip(corpus.src, corpus.tgt, strict=True))
    keep = [i for i, (s, t) in enumerate(pairs) if s and t]
    dropped = len(corpus) - len(keep)
    if dropped:
        log.info("%s: dropped %d pairs with an empty side", corpus.name, dropped)
    short = [i for i in keep if max(len(pairs[i][0]), len(pairs[i][1])) <= MAX_LINE_CHARS]
    if len(short) < len(keep):
        log.warning(
            "%s: dropped %d pairs with a side over %d characters (broken lines?)",
            corpus.name,
            len(keep) - len(short),
            MAX_LINE_CHARS,
        )
        keep = short
    if not keep:
        raise DataError(
            f"split {corpus.name!r} has no pair with two non-empty sides ({dropped} empty); "
            "check its files"
        )
    return corpus.subset(keep)


def _normalise(line: str) -> str:
    """Whitespace runs (any Unicode whitespace, e.g. NBSP or tab) to one space, ends stripped;
    other control characters (NUL, ESC, ...) removed."""
    return " ".join(CONTROL.sub("", line).split())


def _check_extra_names(extra: Mapping) -> None:
    for name in extra:
        if name in ("train", "all", *HELD_OUT):
            raise DataError(f"extra test set name {name!r} clashes with a split; rename it")


# --- local files -----------------------------------------------------------------------------


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, whitespace-normalised (empty lines kept as ``""``).

    Lines are split on ``\\n`` only (so alignment never depends on other Unicode line breaks);
    a UTF-8 byte-order mark is ignored; control characters other than whitespace are removed
    (the lines that had some are counted in a warning). An empty file is refused.
    """
    if not path.is_file():
        raise DataError(
            f"missing data file {path}; set data.dir or the POSENC_DATA environment variable "
            "to the folder that holds it"
        )
    raw = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(
            f"{path} line {line} is not valid UTF-8 ({err.reason}); re-encode the file as UTF-8"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"data file {path} is empty; check it (a failed download?) or its stem")
    dirty = sum(1 for line in lines if CONTROL.search(line))
    if dirty:
        log.warning("%s: removed control characters from %d lines", path, dirty)
    return [_normalise(line) for line in lines]


def read_pair(directory: Path, stem: str, src_lang: str, tgt_lang: str, name: str) -> Corpus:
    """The aligned files ``directory/STEM.SRC_LANG`` and ``directory/STEM.TGT_LANG``."""
    src_path = directory / f"{stem}.{src_lang}"
    tgt_path = directory / f"{stem}.{tgt_lang}"
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}; "
            "the two files must be line-aligned"
        )
    return Corpus(name, src, tgt)


def _load_local(cfg: dict, with_train: bool = True) -> dict[str, Corpus]:
    """Splits from ``dir/STEM.{src_lang,tgt_lang}`` files (see ``configs/data/local.yaml``).
    The training files are read even without ``with_train``: held-out sets are cut out of them."""
    directory = resolve_path(_require(cfg, "dir"))
    if not directory.is_dir():
        raise DataError(
            f"data directory {directory} does not exist; set data.dir or the POSENC_DATA "
            "environment variable"
        )
    src_lang, tgt_lang = _require(cfg, "src_lang"), _require(cfg, "tgt_lang")
    stems = _require(cfg, "train")
    stems = [stems] if isinstance(stems, str) else list(stems)
    if not stems:
        raise DataError("data.train lists no file stem; give at least one")
    parts = [read_pair(directory, stem, src_lang, tgt_lang, "train") for stem in stems]
    for stem, part in zip(stems, parts, strict=True):
        log.info("train: %s: %d pairs", stem, len(part))
    splits: dict[str, Corpus] = {}
    extra = cfg.get("extra_tests") or {}
    holdout = cfg.get("holdout") or {}
    _check_extra_names({**extra, **holdout})
    clash = sorted(set(extra) & set(holdout))
    if clash:
        raise DataError(f"{clash} named in both data.extra_tests and data.holdout; rename one")
    for name, stem in {"valid": cfg.get("valid"), "test": cfg.get("test"), **extra}.items():
        if stem is None:
            raise DataError(f"no file stem for split {name!r}; set data.{name}")
        if stem in stems:
            log.warning("split %r (%s) is also training data: not held-out", name, stem)
        splits[name] = read_pair(directory, stem, src_lang, tgt_lang, name)
    held_out = carve_holdout(parts, stems, holdout, int(cfg.get("seed", 0)))
    train = Corpus(
        "train", [s for part in parts for s in part.src], [t for part in parts for t in part.tgt]
    )
    train = _without_held_out_sources(train, list(held_out.values()))
    return {"train": train, **splits, **held_out}


def carve_holdout(
    parts: list[Corpus], stems: list[str], holdout: Mapping, seed: int
) -> dict[str, Corpus]:
    """In-domain test sets cut out of training stems (``data.holdout``, name -> ``{stem,
    size}``): a seeded random sample of ``size`` pairs of that stem, each with a distinct,
    non-empty source, in the sample's (random) order so ``eval.max_sentences`` keeps a random
    subset. The pairs are removed from ``parts`` in place; returns the sets by name."""
    out = {}
    for name, spec in holdout.items():
        if not isinstance(spec, Mapping) or set(spec) != {"stem", "size"}:
            raise DataError(f"data.holdout.{name} must be {{stem: STEM, size: N}}, got {spec!r}")
        stem, size = spec["stem"], spec["size"]
        if stem not in stems:
            raise DataError(
                f"data.holdout.{name}.stem {stem!r} is not in data.train; a holdout is cut out "
                "of training data (for a separate file use data.extra_tests)"
            )
        part = parts[stems.index(stem)]
        first = {}
        for i, (s, t) in enumerate(zip(part.src, part.tgt, strict=True)):
            if s and t:
                first.setdefault(s, i)
        candidates = sorted(first.values())
        if not isinstance(size, int) or not 0 < size < len(candidates):
            raise DataError(
                f"data.holdout.{name}.size must be an integer in [1, {len(candidates)}) (the "
                f"distinct sources of {stem}), got {size!r}"
            )
        chosen = random.Random(f"holdout:{seed}:{name}").sample(candidates, size)
        out[name] = part.subset(chosen)
        taken = set(chosen)
        parts[stems.index(stem)] = part.subset(i for i in range(len(part)) if i not in taken)
        log.info("%s: %d pairs held out of %s", name, size, stem)
    return out


def _without_held_out_sources(train: Corpus, held_out: list[Corpus]) -> Corpus:
    """``train`` without the pairs whose source sentence is a held-out source (a source with
    several translations must not be seen in training with another one)."""
    if not held_out:
        return train
    sources = {s for corpus in held_out for s in corpus.src}
    keep = [i for i, s in enumerate(train.src) if s not in sources]
    log.info("train: dropped %d more pairs whose source is held out", len(train) - len(keep))
    return train.subset(keep)


# --- WMT14 from the hub ----------------------------------------------------------------------


def hub_unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it came from) says the hub cannot be reached."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    kinds: tuple[type[BaseException], ...] = (
        ConnectionError,
        TimeoutError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    )
    try:
        import httpx

        kinds = (*kinds, httpx.TransportError)
    except ImportError:  # older huggingface_hub versions use requests, whose errors are OSErrors
        pass
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, kinds):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _load_wmt14(cfg: dict, with_train: bool = True) -> dict[str, Corpus]:
    """WMT14 through ``datasets`` with streaming (see ``configs/data/wmt14.yaml``)."""
    import datasets

    hub, config = cfg.get("hub_name", "wmt14"), cfg.get("hub_config", "fr-en")
    src_lang, tgt_lang = _require(cfg, "src_lang"), _require(cfg, "tgt_lang")
    if {src_lang, tgt_lang} != set(config.split("-")):
        raise DataError(
            f"data.src_lang/tgt_lang {src_lang}/{tgt_lang} do not match hub config {config!r}; "
            "set data.hub_config to the language pair"
        )
    train_size = cfg.get("train_size")
    seed = int(cfg.get("seed", 0))

    def fetch(split: str, name: str, limit: int | None) -> Corpus:
        stream = datasets.load_dataset(hub, config, split=split, streaming=True)
        if split == "train":
            stream = stream.shuffle(seed=seed, buffer_size=int(cfg.get("shuffle_buffer", 10_000)))
        if limit is not None:
            stream = stream.take(int(limit))
        src, tgt = [], []
        for example in stream:
            pair = example["translation"]
            src.append(_normalise(pair[src_lang]))
            tgt.append(_normalise(pair[tgt_lang]))
        log.info("%s: %d pairs from %s/%s split %r", name, len(src), hub, config, split)
        return Corpus(name, src, tgt)

    try:
        train = {"train": fetch("train", "train", train_size)} if with_train else {}
        return {
            **train,
            "valid": fetch("validation", "valid", None),
            "test": fetch("test", "test", None),
        }
    except Exception as err:
        if hub_unreachable(err):
            raise DataError(
                f"the Hugging Face hub is unreachable ({type(err).__name__}) for dataset "
                f"{hub}/{config}; use data=local (with POSENC_DATA pointing to the offline copies)"
            ) from None
        raise


# --- toy tasks -------------------------------------------------------------------------------

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


def _load_toy(cfg: dict, with_train: bool = True) -> dict[str, Corpus]:
    """Seeded symbol sequences and their reversal/rotation (see ``configs/data/toy.yaml``).

    Held-out sets are drawn first; training sequences equal to a held-out source are redrawn,
    so every held-out source is unseen in training (drawing them is cheap, so ``with_train``
    changes nothing here).
    """
    task = cfg.get("task")
    if task not in TOY_TASKS:
        raise DataError(f"unknown toy task {task!r}; set data.task to one of {TOY_TASKS}")
    vocab_size, seed = int(_require(cfg, "vocab_size")), int(_require(cfg, "seed"))
    shift = int(cfg.get("shift", 1))
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

    lo, hi = int(_require(cfg, "min_len")), int(_require(cfg, "max_len"))
    test_size = int(_require(cfg, "test_size"))
    extra = cfg.get("extra_tests") or {}
    _check_extra_names(extra)
    held_out = {
        "valid": draw("valid", int(_require(cfg, "valid_size")), lo, hi, set()),
        "test": draw("test", test_size, lo, hi, set()),
    }
    for name, spec in extra.items():
        spec = dict(spec or {})
        size = int(spec.get("size", test_size))
        lo_x, hi_x = int(spec.get("min_len", lo)), int(spec.get("max_len", hi))
        held_out[name] = draw(name, size, lo_x, hi_x, set())
    avoid = {line for corpus in held_out.values() for line in corpus.src}
    return {"train": draw("train", int(_require(cfg, "train_size")), lo, hi, avoid), **held_out}


# --------------------------------------------------------------------------------------------
# Cleaning
# --------------------------------------------------------------------------------------------


def clean_pairs(
    corpus: Corpus, min_words: int, max_words: int, max_ratio: float, dedup: bool
) -> tuple[Corpus, dict[str, int]]:
    """Filter training pairs; each pair is counted under the first filter that drops it.

    In order: pairs with an empty side (``empty``); pairs with a side of fewer than
    ``min_words`` or more than ``max_words`` whitespace-separated words (``length``); pairs
    whose word-count ratio, longer side over shorter side, exceeds ``max_ratio`` (``ratio``);
    repeats of an earlier identical (src, tgt) pair when ``dedup`` (``duplicate``).

    Returns the kept pairs (original order) and ``{'input', 'empty', 'length', 'ratio',
    'duplicate', 'kept'}`` counts.
    """
    if not 0 <= min_words <= max_words or max_ratio < 1:
        raise DataError(
            f"bad data.clean settings min_words={min_words}, max_words={max_words}, "
            f"max_ratio={max_ratio}; need 0 <= min_words <= max_words and max_ratio >= 1"
        )
    stats = dict.fromkeys(("input", *CLEAN_FILTERS, "kept"), 0)
    stats["input"] = len(corpus)
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, (s, t) in enumerate(zip(corpus.src, corpus.tgt, strict=True)):
        ns, nt = len(s.split()), len(t.split())
        if ns == 0 or nt == 0:
            stats["empty"] += 1
        elif not (min_words <= ns <= max_words and min_words <= nt <= max_words):
            stats["length"] += 1
        elif max(ns, nt) > max_ratio * min(ns, nt):
            stats["ratio"] += 1
        elif dedup and (s, t) in seen:
            stats["duplicate"] += 1
        else:
            if dedup:
                seen.add((s, t))
            keep.append(i)
    stats["kept"] = len(keep)
    return corpus.subset(keep), stats


# --------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------


class TokenBatcher:
    """Batches of example indices, bucketed by length under a token budget.

    Each epoch: sort the examples by (source length, target length), breaking ties at random;
    cut the sorted run into consecutive batches whose padded size
    ``count * max(max_src + 1, max_tgt + 2) <= max_tokens`` (``+1``: the EOS that
    :func:`collate` appends to the source; ``+2``: BOS and EOS of the target, a safe bound on
    ``tgt_in``/``tgt_out``); then shuffle the batch order. Lengths are token counts without
    special tokens. An example that alone exceeds the budget gets a batch of its own (with a
    warning at construction).

    Everything random comes from ``numpy.random.default_rng([seed, epoch])``, so
    ``batches(epoch)`` is the same list every time it is called with the same ``(seed, epoch)``:
    training resumes mid-epoch by recomputing it and skipping the batches already done. The
    cut points depend only on the sorted lengths, so every epoch has the same number of
    batches. With ``shuffle=False`` ties keep index order and batches stay sorted by length
    (for evaluation).

    For distributed training, rank ``rank`` of ``world_size`` gets batches
    ``rank::world_size`` of the epoch, after truncating the epoch to a multiple of
    ``world_size`` so every rank has the same number of batches.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise DataError(
                f"TokenBatcher got {len(src_lengths)} source and {len(tgt_lengths)} target "
                "lengths; pass one of each per example"
            )
        if not len(src_lengths):
            raise DataError("TokenBatcher got no examples; check that the split is not empty")
        if max_tokens < 1 or seed < 0 or not 0 <= rank < world_size:
            raise DataError(
                f"TokenBatcher needs max_tokens >= 1, seed >= 0 and 0 <= rank < world_size; got "
                f"max_tokens={max_tokens}, seed={seed}, rank={rank}, world_size={world_size}"
            )
        self.src = np.asarray(src_lengths, dtype=np.int64)
        self.tgt = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens = int(max_tokens)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self._cuts = self._cut_points(np.lexsort((self.tgt, self.src)))
        oversized = int((np.maximum(self.src + 1, self.tgt + 2) > self.max_tokens).sum())
        if oversized:
            log.warning(
                "%d examples alone exceed max_tokens=%d; each gets a batch of its own",
                oversized,
                self.max_tokens,
            )
        self._per_rank = len(self._cuts) // self.world_size
        if self._per_rank == 0:
            raise DataError(
                f"{len(self._cuts)} batches cannot be shared by {world_size} ranks; lower "
                "max_tokens or world_size"
            )

    def _cut_points(self, order: np.ndarray) -> list[tuple[int, int]]:
        """``[start, end)`` slices of the sorted order, one per batch."""
        src = (self.src[order] + 1).tolist()
        tgt = (self.tgt[order] + 2).tolist()
        cuts, start, longest = [], 0, 0
        for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
            grown = max(longest, s, t)
            if i > start and grown * (i - start + 1) > self.max_tokens:
                cuts.append((start, i))
                start, grown = i, max(s, t)
            longest = grown
        cuts.append((start, len(src)))
        return cuts

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch`` (lists of example indices), in training order."""
        if self.shuffle:
            rng = np.random.default_rng([self.seed, int(epoch)])
            order = np.lexsort((rng.random(len(self.src)), self.tgt, self.src))
        else:
            order = np.lexsort((self.tgt, self.src))
        batches = [order[a:b].tolist() for a, b in self._cuts]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        batches = batches[: self._per_rank * self.world_size]
        return batches[self.rank :: self.world_size]

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._per_rank


def collate(
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pad one batch of id lists into long tensors.

    Returns ``src`` ``(B, Ls)`` = ids + EOS, ``tgt_in`` ``(B, Lt)`` = BOS + ids and ``tgt_out``
    ``(B, Lt)`` = ids + EOS, each right-padded with ``pad_id``; ``Ls``/``Lt`` are the longest
    source/target length + 1.
    """
    if len(src_ids) != len(tgt_ids) or not len(src_ids):
        raise DataError(
            f"collate got {len(src_ids)} sources and {len(tgt_ids)} targets; pass the same "
            "non-zero number of each"
        )
    batch = len(src_ids)
    src = torch.full((batch, max(map(len, src_ids)) + 1), pad_id, dtype=torch.long)
    tgt_len = max(map(len, tgt_ids)) + 1
    tgt_in = torch.full((batch, tgt_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((batch, tgt_len), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[row, : len(s) + 1] = torch.tensor([*s, eos_id])
        tgt_in[row, : len(t) + 1] = torch.tensor([bos_id, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, eos_id])
    return src, tgt_in, tgt_out
