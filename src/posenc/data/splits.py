"""The splits of a data config: training, validation, test and held-out sets.

They come from a built-in toy task, local text files, or WMT14 from the Hugging Face hub; one
split's pairs are a :class:`~posenc.data.corpus.Corpus`.

Data flows one way: ``load_corpora(cfg.data)`` returns the splits as plain sentence lists; the
tokenizer turns them into ids; :class:`TokenBatcher` groups example indices into batches under a
token budget; :func:`collate` pads one batch into tensors.

Every bad input raises :class:`DataError` with a one-line message that names the problem and the
fix.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from pathlib import Path

from posenc.config.data import DataConfig, HubData, LocalData
from posenc.data.corpus import Corpus, DataError, check_extra_names, resolve_path
from posenc.data.near_duplicates import NearIndex
from posenc.data.streams import (
    Carving,
    carve_holdout,
    digest,
    held_out_sets,
    kept_pairs,
    lines,
    normalise,
    pairs,
    sendable_pairs,
    shuffled_order,
    training_pairs,
)
from posenc.data.toy import load_toy

log = logging.getLogger("posenc.data.splits")


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_corpora(cfg: DataConfig, with_train: bool = True) -> dict[str, Corpus]:
    """All splits described by the ``data`` settings (typed at the door:
    :func:`~posenc.config.data.data_config`).

    Returns splits by name: ``train``, ``valid``, ``test``, plus one per extra test set (key =
    its name). Training pairs are cleaned with ``cfg.clean`` (the filters of
    :class:`~posenc.data.streams.Cleaner`) when the node has one, shuffled with ``cfg.seed`` and
    cut to ``cfg.train_size`` (a seeded random sample) when set. Held-out splits only lose pairs
    with an empty side (counted and logged); ``valid`` is a seeded random subset of
    ``cfg.valid_size`` pairs when set (original order kept), used for the validation loss during
    training. ``with_train=False`` (evaluation) returns the held-out splits only, the same ones,
    without streaming, cleaning or shuffling the training data (local held-out sets are still
    cut out of the training files).
    """
    if isinstance(cfg, LocalData):
        splits = _load_local(cfg, with_train)
    elif isinstance(cfg, HubData):
        splits = _load_wmt14(cfg, with_train)
    else:
        splits = load_toy(cfg, with_train)
    if not with_train:
        splits.pop("train", None)
    return _prepare(splits, cfg)


def validation_split(cfg: DataConfig) -> Corpus:
    """The ``valid`` split alone, as :func:`load_corpora` gives it (training needs nothing else
    besides its prepared corpus); local data reads its file only."""
    if not isinstance(cfg, LocalData):
        return load_corpora(cfg, with_train=False)["valid"]
    directory, _, _ = _local_files(cfg)
    if cfg.valid is None:
        raise DataError("no file stem for split 'valid'; set data.valid")
    valid = read_pair(directory, cfg.valid, cfg.src_lang, cfg.tgt_lang, "valid")
    return _prepare({"valid": valid}, cfg)["valid"]


def carve(
    read: Callable[[str], Iterable[tuple[str, str]]], stems: list[str], cfg: LocalData
) -> Carving:
    """The held-out sets of local data (:func:`carve_holdout`), dropping from training the
    pairs that share the sides of ``data.holdout_drops`` with them."""
    return carve_holdout(read, stems, cfg.holdout or {}, cfg.seed, cfg.holdout_drops)


def shared_with_training(cfg: DataConfig, near: bool = False) -> dict[str, list[bool]]:
    """For each held-out set of local ``data``, in the set's order, whether its pair
    shares a source or a target with a training pair of that node (those its holdout rule
    keeps, before cleaning: a superset of the pairs trained on); with ``near``, whether its
    source or target is within one word of the same side of a pair of the training stems that
    is not held out, whatever ``holdout_drops`` drops (:mod:`posenc.data.near_duplicates`), so
    every run of the same held-out sets has the same near-clean part. Under ``holdout_drops:
    [source, target]`` none is shared; runs made before that rule left many."""
    if not isinstance(cfg, LocalData):
        raise DataError(f"data.kind {cfg.kind!r} has no held-out sets; use local data")
    _, stems, read = _local_files(cfg)
    carving = carve(read, stems, cfg)
    if near:
        held_out = held_out_sets(read, carving)
        names = list(held_out)
        sources = NearIndex([s for n in names for s in held_out[n].src])
        targets = NearIndex([t for n in names for t in held_out[n].tgt])
        hit = [False] * len(sources.sentences)
        for stem in stems:  # every pair not held out, whatever holdout_drops drops: one
            taken = carving.taken.get(stem, set())  # near-clean part for every run of the sets
            for source, target in (p for i, p in enumerate(read(stem)) if i not in taken):
                for i in sources.near(source) | targets.near(target):
                    hit[i] = True
        starts = list(accumulate((len(held_out[n].src) for n in names), initial=0))
        return {n: hit[starts[k] : starts[k + 1]] for k, n in enumerate(names)}
    held_out: dict[str, Corpus] = {}
    seen_sources, seen_targets = set(), set()
    for source, target in training_pairs(read, stems, carving, held_out):
        seen_sources.add(digest(source))
        seen_targets.add(digest(target))
    return {
        name: [
            digest(s) in seen_sources or digest(t) in seen_targets
            for s, t in zip(corpus.src, corpus.tgt, strict=True)
        ]
        for name, corpus in held_out.items()
    }


def training_stream(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    """The training pairs of ``data`` as they are read, before cleaning, shuffling and
    ``train_size`` (:func:`posenc.data.prepare.prepare_store` does those), one at a time: local
    files without their held-out pairs, WMT14 from the hub, or the toy task."""
    if isinstance(cfg, LocalData):
        _, stems, read = _local_files(cfg)
        carving = carve(read, stems, cfg)
        yield from training_pairs(read, stems, carving)
    elif isinstance(cfg, HubData):
        yield from _hub_pairs(cfg, "train", cfg.train_size)
    else:
        train = load_toy(cfg)["train"]
        yield from zip(train.src, train.tgt, strict=True)


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


def _prepare(splits: dict[str, Corpus], cfg: DataConfig) -> dict[str, Corpus]:
    """Clean, shuffle and cut the training split (when there is one); drop empty pairs of
    held-out splits."""
    seed = cfg.seed
    out = {"train": _prepare_train(splits["train"], cfg, seed)} if "train" in splits else {}
    for name, corpus in splits.items():
        if name != "train":
            out[name] = _drop_empty(corpus)
    if cfg.valid_size is not None and len(out["valid"]) > cfg.valid_size:
        keep = random.Random(seed).sample(range(len(out["valid"])), cfg.valid_size)
        out["valid"] = out["valid"].subset(sorted(keep))
    log.info("splits: %s", ", ".join(f"{name} {len(c)}" for name, c in out.items()))
    return out


def _prepare_train(train: Corpus, cfg: DataConfig, seed: int) -> Corpus:
    """The training split cleaned with ``cfg.clean`` (:func:`streams.kept_pairs`), shuffled
    with ``seed`` and cut to ``cfg.train_size``."""
    kept = kept_pairs(zip(train.src, train.tgt, strict=True), cfg.clean)
    order = shuffled_order(len(kept), seed, cfg.train_size)
    return Corpus(train.name, [kept[i][0] for i in order], [kept[i][1] for i in order])


def _drop_empty(corpus: Corpus) -> Corpus:
    """``corpus`` without pairs that have an empty side or a side longer than
    :data:`~posenc.data.streams.MAX_LINE_CHARS` characters; logs how many went."""
    both = list(sendable_pairs(corpus.name, zip(corpus.src, corpus.tgt, strict=True)))
    return Corpus(corpus.name, [s for s, _ in both], [t for _, t in both])


# --- local files -----------------------------------------------------------------------------


def read_lines(path: Path) -> list[str]:
    """The whitespace-normalised lines of a UTF-8 text file (see :func:`streams.lines`)."""
    return list(lines(path))


def read_pair(directory: Path, stem: str, src_lang: str, tgt_lang: str, name: str) -> Corpus:
    """The aligned files ``directory/STEM.SRC_LANG`` and ``directory/STEM.TGT_LANG`` (plain or
    gzip)."""
    both = list(pairs(directory, stem, src_lang, tgt_lang))
    return Corpus(name, [s for s, _ in both], [t for _, t in both])


def _local_files(
    cfg: LocalData,
) -> tuple[Path, list[str], Callable[[str], Iterator[tuple[str, str]]]]:
    """The data directory, the training stems and a function streaming a stem's pairs."""
    directory = resolve_path(cfg.required("dir"))
    if not directory.is_dir():
        raise DataError(
            f"data directory {directory} does not exist; set data.dir or the POSENC_DATA "
            "environment variable"
        )
    src_lang, tgt_lang = cfg.required("src_lang"), cfg.required("tgt_lang")
    stems = list(cfg.required("train"))
    if not stems:
        raise DataError("data.train lists no file stem; give at least one")
    return directory, stems, lambda stem: pairs(directory, stem, src_lang, tgt_lang)


def _load_local(cfg: LocalData, with_train: bool = True) -> dict[str, Corpus]:
    """Splits from ``dir/STEM.{src_lang,tgt_lang}`` files, plain or gzip (see
    ``configs/data/local.yaml``). Without ``with_train`` only the stems that held-out sets are
    cut out of are read (streamed)."""
    directory, stems, read = _local_files(cfg)
    src_lang, tgt_lang = cfg.src_lang, cfg.tgt_lang
    splits: dict[str, Corpus] = {}
    extra = cfg.extra_tests or {}
    holdout = cfg.holdout or {}
    check_extra_names({**extra, **holdout})
    clash = sorted(set(extra) & set(holdout))
    if clash:
        raise DataError(f"{clash} named in both data.extra_tests and data.holdout; rename one")
    for name, stem in {"valid": cfg.valid, "test": cfg.test, **extra}.items():
        if stem is None:
            raise DataError(f"no file stem for split {name!r}; set data.{name}")
        if stem in stems:
            log.warning("split %r (%s) is also training data: not held-out", name, stem)
        splits[name] = read_pair(directory, stem, src_lang, tgt_lang, name)
    carving = carve(read, stems, cfg)
    if not with_train:
        return {**splits, **held_out_sets(read, carving)}
    held_out: dict[str, Corpus] = {}
    both = list(training_pairs(read, stems, carving, held_out))
    train = Corpus("train", [s for s, _ in both], [t for _, t in both])
    return {"train": train, **splits, **held_out}


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


def _load_wmt14(cfg: HubData, with_train: bool = True) -> dict[str, Corpus]:
    """WMT14 through ``datasets`` with streaming (see ``configs/data/wmt14.yaml``)."""

    def fetch(split: str, name: str, limit: int | None) -> Corpus:
        both = list(_hub_pairs(cfg, split, limit))
        log.info("%s: %d pairs from %s split %r", name, len(both), cfg.hub_name, split)
        return Corpus(name, [s for s, _ in both], [t for _, t in both])

    train = {"train": fetch("train", "train", cfg.train_size)} if with_train else {}
    return {
        **train,
        "valid": fetch("validation", "valid", None),
        "test": fetch("test", "test", None),
    }


def _hub_pairs(cfg: HubData, split: str, limit: int | None) -> Iterator[tuple[str, str]]:
    """The normalised pairs of a split of WMT14 on the hub, streamed (the training split
    shuffled with ``data.seed`` in a buffer of ``data.shuffle_buffer`` pairs), at most
    ``limit``.

    Raises:
        DataError: the hub cannot be reached, or the languages do not match its config.
    """
    import datasets

    hub, config = cfg.hub_name, cfg.hub_config
    src_lang, tgt_lang = cfg.required("src_lang"), cfg.required("tgt_lang")
    if {src_lang, tgt_lang} != set(config.split("-")):
        raise DataError(
            f"data.src_lang/tgt_lang {src_lang}/{tgt_lang} do not match hub config {config!r}; "
            "set data.hub_config to the language pair"
        )
    try:
        stream = datasets.load_dataset(hub, config, split=split, streaming=True)
        if split == "train":
            stream = stream.shuffle(seed=cfg.seed, buffer_size=cfg.shuffle_buffer)
        if limit is not None:
            stream = stream.take(int(limit))
        for example in stream:
            pair = example["translation"]
            yield normalise(pair[src_lang]), normalise(pair[tgt_lang])
    except Exception as err:
        if hub_unreachable(err):
            raise DataError(
                f"the Hugging Face hub is unreachable ({type(err).__name__}) for dataset "
                f"{hub}/{config}; use data=local (with POSENC_DATA pointing to the offline copies)"
            ) from None
        raise
