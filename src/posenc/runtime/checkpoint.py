"""Atomic checkpoints: written to a temporary file in the same directory, flushed to disk, then
renamed over the old one, so a kill at any moment leaves the previous checkpoint intact.

``RUN/checkpoints/last.pt`` is the newest checkpoint; before it is replaced, the one it replaces
becomes ``previous.pt`` (a hard link, so ``last.pt`` is complete at every moment). A kill during
a save leaves a hidden ``.last.pt.XXXX.tmp`` behind, which :func:`remove_stale` deletes.

At a new best validation, ``best.pt`` becomes a hard link of the ``last.pt`` just written, and
``last.pt`` records that step as ``best_step``: :func:`best_checkpoint` notices a ``best.pt`` left
behind by a kill between the two and names the checkpoint that holds the best step.

A checkpoint holds tensors and plain values only (dicts, lists, tuples, numbers, strings), so it
loads with ``torch.load(..., weights_only=True)``: opening a run someone shared never runs code
that a crafted pickle would carry; such a file is refused with one line.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from posenc.config import paste
from posenc.runtime.files import replacing
from posenc.runtime.untrusted import is_special

PREVIOUS = "previous.pt"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read; the message names the file and the way out."""


def save_atomic(obj: Any, path: Path, keep_previous: bool = False) -> None:
    """``torch.save(obj)`` to ``path`` so that readers see the old file or the new one, never half.

    With ``keep_previous``, the file being replaced first becomes ``previous.pt`` in the same
    directory (``path`` itself stays complete throughout).

    Raises:
        CheckpointError: the file could not be written (a full disk, say): one line naming it,
            the space it needed and had, and the last good checkpoint, which is kept.
    """
    try:
        with replacing(path, "wb") as handle:
            torch.save(obj, handle)
            if keep_previous and path.exists():
                link_over(path, path.with_name(PREVIOUS))
    except (OSError, RuntimeError) as err:  # torch reports a short write as a RuntimeError
        raise CheckpointError(_unwritten(path, obj, err)) from err


def _unwritten(path: Path, obj: Any, err: BaseException) -> str:
    """Why ``obj`` could not be saved to ``path`` and what is left, in one line."""
    needed = tensor_bytes(obj)
    free = shutil.disk_usage(path.parent).free if path.parent.is_dir() else 0
    cause = str(err).splitlines()[0] if str(err) else type(err).__name__
    why = "the disk is full" if free < needed else cause
    kept = (
        f"the last good checkpoint {path} is kept"
        if path.exists()
        else "no earlier checkpoint of this name exists"
    )
    return (
        f"could not write checkpoint {path}: {why} (it needs about {needed / 1e6:,.1f} MB, "
        f"{free / 1e6:,.1f} MB are free); {kept}; free some space and run the same command "
        "again to resume"
    )


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in ``obj`` (nested dicts, lists and tuples): what saving it needs,
    give or take the pickled plain values."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(value) for value in obj)
    return 0


def link_over(source: Path, target: Path) -> None:
    """Make ``target`` the same file as ``source`` (a hard link, or a copy where links are not
    supported), replacing ``target`` atomically."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def all_finite(weights: Mapping[str, Any]) -> bool:
    """Whether every floating-point tensor among the values of ``weights`` (a state dict) is
    finite (no NaN, no inf); other values are ignored."""
    return all(
        bool(torch.isfinite(value).all())
        for value in weights.values()
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    )


def saved_state(path: Path) -> dict[str, Any] | None:
    """The training state (``state``) recorded in the checkpoint ``path``, read cheaply (weights
    only, memory-mapped: no tensor is copied); None when the file is missing, unreadable or
    holds no state."""
    try:
        check_uncompressed(path)
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # missing, truncated, foreign or refused: no state to read
        return None
    state = payload.get("state") if isinstance(payload, dict) else None
    return state if isinstance(state, dict) else None


def best_checkpoint(checkpoints: Path) -> Path:
    """The checkpoint of the best validation in ``checkpoints``: ``best.pt`` when it holds the
    step that ``last.pt`` records as the best (``best_step``); ``last.pt`` when that is its own
    step while ``best.pt`` holds another or is missing (a kill between writing ``last.pt`` and
    linking ``best.pt``). Without a recorded best step (no validation yet, a run saved before
    ``best_step``, an unreadable ``last.pt``): ``best.pt``, else ``last.pt``.

    Raises:
        CheckpointError: no checkpoint holds the recorded best step (one line).
    """
    best, last = checkpoints / "best.pt", checkpoints / "last.pt"
    recorded = saved_state(last) or {}
    best_step = _step(recorded, "best_step")
    if best_step is None:
        return best if best.exists() else last
    held = saved_step(best)
    if held == best_step:
        return best
    if _step(recorded, "step") == best_step:
        return last
    holds = "is missing or unreadable" if held is None else f"holds step {held}"
    raise CheckpointError(
        f"{best} {holds}, but {last} records the best validation at step {best_step} and no "
        "checkpoint of that step is left (was best.pt replaced by hand?); evaluate with "
        f"eval.checkpoint=last, or put the checkpoint of step {best_step} back as {best.name}"
    )


def saved_step(path: Path) -> int | None:
    """The step recorded in the checkpoint ``path``, read cheaply (:func:`saved_state`); None
    when the file is missing or unreadable."""
    return _step(saved_state(path) or {}, "step")


def _step(state: Mapping[str, Any], key: str) -> int | None:
    """``state[key]`` when it is an integer (a file may hold anything), else None."""
    value = state.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    check_uncompressed(path)  # first: it refuses a FIFO or device by name
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


def check_uncompressed(path: Path) -> None:
    """Refuse a checkpoint whose zip entries are compressed before anything is unpacked: torch
    writes them stored as they are, so every tensor takes on disk the bytes it takes in memory,
    and a deflated entry (3.5 MB of file declaring 3 GB of zeros) could take any memory. A file
    that is no zip archive is left to ``torch.load`` to judge. A FIFO or device is refused
    before it is opened (reading it could block for ever)."""
    if is_special(path):
        raise CheckpointError(
            f"checkpoint {path} is not a regular file (a FIFO, socket or device); posenc reads "
            "checkpoints it wrote: remove it"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError):
        return
    for info in entries:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise CheckpointError(
                f"checkpoint {path} refused: its entry {info.filename} is compressed "
                f"({info.compress_size:,} bytes unpacking to {info.file_size:,}); posenc writes "
                "checkpoints uncompressed, and unpacking this one could take any memory"
            )


def model_weights(payload: dict[str, Any], path: Path, ema: bool = False) -> dict[str, Any]:
    """The model state of the checkpoint ``payload`` (read from ``path``): its trained weights,
    or with ``ema`` their EMA (``eval.weights=ema``).

    Raises:
        CheckpointError: ``ema`` and the checkpoint holds no EMA (one line naming the fix).
    """
    if not ema:
        return payload["model"]
    if not isinstance(payload.get("ema"), dict):
        raise CheckpointError(
            f"checkpoint {path} holds no EMA weights (eval.weights=ema): its run was trained "
            "without trainer.ema_decay; score its own weights (eval.weights=raw), or train a run "
            "with trainer.ema_decay=0.999 to keep them"
        )
    return payload["ema"]


def step_checkpoints(directory: Path) -> list[Path]:
    """The ``step_<step>.pt`` weights in ``directory`` (see :func:`save_step`), oldest first."""
    found = []
    for path in directory.glob("step_*.pt"):
        match = re.fullmatch(r"step_(\d+)\.pt", path.name)
        if match is not None:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def save_step(payload: dict[str, Any], directory: Path, keep: int) -> Path:
    """The model weights (and their EMA, ``ema``, when training keeps one), training state and
    settings of ``payload`` (a training checkpoint) as ``directory/step_<step>.pt``, written
    atomically, for checkpoint averaging; then only the newest ``keep`` of these files are kept.
    They hold no optimizer state: resume from ``last.pt``. Returns the path written."""
    path = directory / f"step_{payload['state']['step']}.pt"
    kept = {key: payload[key] for key in ("model", "ema", "state", "config") if key in payload}
    save_atomic(kept, path)
    for old in step_checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path
