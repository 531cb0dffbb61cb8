"""The ``data`` and ``tokenizer`` config groups, typed: one class per kind (local files, WMT14 on
the hub, the toy task; BPE, mBERT), each key with what it accepts, and :func:`data_config` and
:func:`tokenizer_config` picking the class a node's kind names. Defaults are those of runs made
before a key existed, so their saved configs read as they were made (``holdout_drops``: shared
sources only; ``training_types_only``: the full vocabulary)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from posenc.config import ConfigGroup, plain, setting


class DataError(ValueError):
    """A bad data input or data setting; the message is one line naming the problem and the fix."""


SIZE = {"kind": "int", "low": 1, "optional": True, "default": None}
#: the toy task's split sizes: generated pairs held in memory (a trillion asked for climbed past
#: 5 GB before anything was trained)
TOY_SIZE = {"kind": "int", "low": 1, "high": 10_000_000, "optional": True, "default": None}
STEM = {"kind": "str", "optional": True, "default": None}


@dataclass(frozen=True, kw_only=True)
class DataConfig(ConfigGroup):
    """What every kind of data has: its name and kind, the language pair, the seed of its
    shuffles and subsets, the sizes kept and more test sets."""

    GROUP: ClassVar[str] = "data"
    KIND: ClassVar[str]
    name: str = setting("str", default="")
    kind: str = setting("str")
    src_lang: str | None = setting("str", optional=True, default=None)
    tgt_lang: str | None = setting("str", optional=True, default=None)
    seed: int = setting("int", default=0)
    train_size: int | None = setting(**SIZE)
    valid_size: int | None = setting(**SIZE)
    extra_tests: Mapping[str, Any] | None = setting("mapping", optional=True, default=None)
    clean: Mapping[str, Any] | None = setting("mapping", optional=True, default=None)

    def required(self, key: str) -> Any:
        """The value of ``key``, which this use of the data needs.

        Raises:
            DataError: it is null or absent, naming the key to set.
        """
        value = getattr(self, key)
        if value is None:
            raise DataError(f"data config has no {key!r}; set data.{key} (see configs/data/*.yaml)")
        return value


@dataclass(frozen=True, kw_only=True)
class LocalData(DataConfig):
    """``configs/data/local.yaml``: aligned text files under ``dir``, held-out sets cut out of
    training stems."""

    KIND: ClassVar[str] = "local"
    dir: str | None = setting(**STEM)
    train: list[str] | None = setting("list", optional=True, default=None)
    valid: str | None = setting(**STEM)
    test: str | None = setting(**STEM)
    holdout: Mapping[str, Any] | None = setting("mapping", optional=True, default=None)
    holdout_drops: tuple[str, ...] = setting("list", default=("source",))


@dataclass(frozen=True, kw_only=True)
class HubData(DataConfig):
    """``configs/data/wmt14.yaml``: WMT14 streamed from the Hugging Face hub."""

    KIND: ClassVar[str] = "wmt14"
    hub_name: str = setting("str", default="wmt14")
    hub_config: str = setting("str", default="fr-en")
    shuffle_buffer: int = setting("int", low=1, default=10_000)


@dataclass(frozen=True, kw_only=True)
class ToyData(DataConfig):
    """``configs/data/toy.yaml``: seeded symbol sequences and their reversal or rotation."""

    KIND: ClassVar[str] = "toy"
    task: str | None = setting("str", optional=True, default=None)
    shift: int = setting("int", default=1)
    vocab_size: int | None = setting("int", optional=True, default=None)
    min_len: int | None = setting("int", optional=True, default=None)
    max_len: int | None = setting("int", optional=True, default=None)
    test_size: int | None = setting(**TOY_SIZE)
    train_size: int | None = setting(**TOY_SIZE)
    valid_size: int | None = setting(**TOY_SIZE)


#: the classes of the data kinds, by ``data.kind``
DATA_KINDS: dict[str, type[DataConfig]] = {
    kind.KIND: kind for kind in (LocalData, HubData, ToyData)
}


def data_config(node: Mapping | DataConfig) -> DataConfig:
    """The typed config of a ``data`` node (a DictConfig or a dict; a typed one as it is);
    ``data.train`` given as one stem (``data.train=STEM``) is a list of it.

    Raises:
        DataError: an unknown kind, an unknown key of that kind, or a value that does not fit
            (one line naming the key and what it must be).
    """
    if isinstance(node, DataConfig):
        return node
    values = plain(node)
    if isinstance(values.get("train"), str):
        values["train"] = [values["train"]]
    return _of_kind(values, DATA_KINDS)


@dataclass(frozen=True, kw_only=True)
class TokenizerConfig(ConfigGroup):
    """What every tokenizer has: its name and kind."""

    GROUP: ClassVar[str] = "tokenizer"
    KIND: ClassVar[str]
    name: str = setting("str", default="")
    kind: str = setting("str")


@dataclass(frozen=True, kw_only=True)
class BpeTokenizer(TokenizerConfig):
    """``configs/tokenizer/bpe.yaml``: a joint byte-level BPE learnt on the training pairs."""

    KIND: ClassVar[str] = "bpe"
    name: str = setting("str", default="bpe")
    vocab_size: int = setting("int", low=1, default=8000)
    min_frequency: int = setting("int", low=1, default=2)
    train_sentences: int | None = setting(**SIZE)


@dataclass(frozen=True, kw_only=True)
class MbertTokenizer(TokenizerConfig):
    """``configs/tokenizer/mbert.yaml``: mBERT's WordPiece vocabulary, from a file or the hub."""

    KIND: ClassVar[str] = "mbert"
    name: str = setting("str", default="mbert")
    name_or_path: str = setting("str", default="bert-base-multilingual-cased")
    vocab_file: str | None = setting(**STEM)
    training_types_only: bool = setting("bool", default=False)


#: the classes of the tokenizer kinds, by ``tokenizer.kind``
TOKENIZER_KINDS: dict[str, type[TokenizerConfig]] = {
    kind.KIND: kind for kind in (BpeTokenizer, MbertTokenizer)
}


def tokenizer_config(node: Mapping | TokenizerConfig) -> TokenizerConfig:
    """The typed config of a ``tokenizer`` node (a DictConfig or a dict; a typed one as it is).

    Raises:
        DataError: as :func:`data_config`.
    """
    if isinstance(node, TokenizerConfig):
        return node
    return _of_kind(plain(node), TOKENIZER_KINDS)


def _of_kind(values: dict, kinds: Mapping[str, type[ConfigGroup]]) -> Any:
    """``values`` as the class of ``kinds`` its ``kind`` names, its errors as :class:`DataError`."""
    kind = values.get("kind")
    group = next(iter(kinds.values())).GROUP
    if kind not in kinds:
        raise DataError(f"unknown {group}.kind {kind!r}; use one of {', '.join(kinds)}")
    try:
        return kinds[kind].of(values)
    except ValueError as err:
        raise DataError(str(err)) from None
