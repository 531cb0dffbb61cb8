"""Atomic checkpoints: written to a temporary file in the same directory, flushed to disk, then
renamed over the old one, so a kill at any moment leaves the previous checkpoint intact.

``RUN/checkpoints/last.pt`` is the newest checkpoint; before it is replaced, the one it replaces
becomes ``previous.pt`` (a hard link, so ``last.pt`` is complete at every moment). A kill during
a save leaves a hidden ``.last.pt.XXXX.tmp`` behind, which :func:`remove_stale` deletes.

A checkpoint holds tensors and plain values only (dicts, lists, tuples, numbers, strings), so it
loads with ``torch.load(..., weights_only=True)``: opening a run someone shared never runs code
that a crafted pickle would carry; such a file is refused with one line.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from posenc.config import paste
from posenc.runtime.files import replacing

PREVIOUS = "previous.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file and the way out."""


def save_atomic(obj: Any, path: Path, keep_previous: bool = False) -> None:
    """``torch.save(obj)`` to ``path`` so that readers see the old file or the new one, never half.

    With ``keep_previous``, the file being replaced first becomes ``previous.pt`` in the same
    directory (``path`` itself stays complete throughout).
    """
    with replacing(path, "wb") as handle:
        torch.save(obj, handle)
        if keep_previous and path.exists():
            _link_over(path, path.with_name(PREVIOUS))


def _link_over(source: Path, target: Path) -> None:
    """Make ``target`` the same file as ``source`` (a hard link, or a copy where links are not
    supported), replacing ``target`` atomically."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def remove_stale(directory: Path) -> list[Path]:
    """Delete the temporary files that a killed save left in ``directory``; returns them."""
    stale = sorted(directory.glob(".*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _fallback(path: Path) -> str:
    """Where to go from the unreadable checkpoint ``path``."""
    for name in (PREVIOUS, "best.pt"):
        other = path.with_name(name)
        if other != path and other.is_file():
            return (
                f"resume from the one before with {paste('trainer.resume', other)}, "
                f"or delete {path.name} to start over"
            )
    return "delete it to start over, or resume from another one with trainer.resume=PATH"


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint dict on the CPU with ``weights_only=True``, or raise
    :class:`CheckpointError` naming the file (missing, corrupt, or holding anything but tensors
    and plain values)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check trainer.resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        if found is None:  # not a forbidden object: a damaged pickle
            raise CheckpointError(
                f"checkpoint {path} is corrupt or truncated (UnpicklingError); {_fallback(path)}"
            ) from err
        raise CheckpointError(
            f"checkpoint {path} refused: it names '{found.group(1)}', not a tensor or plain "
            "value, and loading it could run code; posenc checkpoints hold tensors and plain "
            "values only "
            "(one written by posenc before weights-only checkpoints cannot be loaded)"
        ) from None
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}); {_fallback(path)}"
        ) from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(
            f"checkpoint {path} holds no posenc model state; is it a posenc run? {_fallback(path)}"
        )
    return state
