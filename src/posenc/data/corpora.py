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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from posenc.config import plain
from posenc.data.corpus import (
    Corpus,
    DataError,
    check_extra_names,
    require,
    resolve_path,
)
from posenc.data.toy import load_toy

log = logging.getLogger("posenc.data.corpora")

MAX_LINE_CHARS = 10_000  # longer lines are broken input (no sentence is this long): dropped
# Control characters that are not whitespace (whitespace ones, tab or CR, become spaces)
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
CLEAN_FILTERS = ("empty", "length", "ratio", "duplicate")
CLEAN_SETTINGS = ("min_words", "max_words", "max_ratio", "dedup")


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
    cfg = plain(cfg)
    loaders: dict[str, Callable[[dict, bool], dict[str, Corpus]]] = {
        "toy": load_toy,
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
    directory = resolve_path(require(cfg, "dir"))
    if not directory.is_dir():
        raise DataError(
            f"data directory {directory} does not exist; set data.dir or the POSENC_DATA "
            "environment variable"
        )
    src_lang, tgt_lang = require(cfg, "src_lang"), require(cfg, "tgt_lang")
    stems = require(cfg, "train")
    stems = [stems] if isinstance(stems, str) else list(stems)
    if not stems:
        raise DataError("data.train lists no file stem; give at least one")
    parts = [read_pair(directory, stem, src_lang, tgt_lang, "train") for stem in stems]
    for stem, part in zip(stems, parts, strict=True):
        log.info("train: %s: %d pairs", stem, len(part))
    splits: dict[str, Corpus] = {}
    extra = cfg.get("extra_tests") or {}
    holdout = cfg.get("holdout") or {}
    check_extra_names({**extra, **holdout})
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
    src_lang, tgt_lang = require(cfg, "src_lang"), require(cfg, "tgt_lang")
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
