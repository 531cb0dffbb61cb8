"""Atomic checkpoints: written to a temporary file in the same directory, flushed to disk, then
renamed over the old one, so a kill at any moment leaves the previous checkpoint intact."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file and the way out."""


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path`` so that readers see the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    """Load a checkpoint dict on the CPU, or raise :class:`CheckpointError` naming the file."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check trainer.resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated ({type(err).__name__}); delete it to start "
            f"over, or resume from another one with trainer.resume=PATH (e.g. {path.parent}/best.pt)"
        ) from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {path} holds no posenc model state; is it a posenc run?")
    return state
