"""A split of sentence pairs, the error every bad data input raises, and the helpers every
corpus loader shares."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from posenc.config.data import DataError

HELD_OUT = ("valid", "test")


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


def resolve_path(path: str | Path) -> Path:
    """``path`` made absolute against the directory the user launched from.

    Under Hydra the working directory may be the run directory, so relative paths are resolved
    with :func:`hydra.utils.to_absolute_path` (which falls back to the current directory when
    Hydra is not running). ``~`` is expanded.
    """
    from hydra.utils import to_absolute_path

    return Path(to_absolute_path(str(Path(path).expanduser())))


def check_extra_names(extra: Mapping) -> None:
    for name in extra:
        if name in ("train", "all", *HELD_OUT):
            raise DataError(f"extra test set name {name!r} clashes with a split; rename it")
