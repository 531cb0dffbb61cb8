"""Checkpoint averaging, as WMT systems report it: with ``eval.average_last=N`` > 1 training
keeps the weights of its last N validations (``RUN/checkpoints/step_<step>.pt``, see
:func:`posenc.runtime.checkpoint.save_step`) and evaluation uses their average.

Every floating-point tensor of the model state is averaged (summed in float64, then cast back
to its own dtype); other tensors (integer buffers) are the newest checkpoint's. With
``eval.weights=ema`` the checkpoints' EMA weights (``trainer.ema_decay``) are averaged instead,
the same way: the mean of the EMA at each of the last N validations.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from posenc.runtime import checkpoint
from posenc.runtime.checkpoint import CheckpointError


def last_step_checkpoints(directory: Path, count: int) -> list[Path]:
    """The newest ``count`` step checkpoints in ``directory``, oldest first.

    Raises:
        CheckpointError: fewer than ``count`` exist (one line naming those found and the fix).
    """
    found = checkpoint.step_checkpoints(directory)
    if len(found) < count:
        names = ", ".join(path.name for path in found) or "none"
        raise CheckpointError(
            f"eval.average_last={count} needs {count} step checkpoints in {directory}, found "
            f"{len(found)} ({names}); average fewer (eval.average_last={max(len(found), 1)}) or "
            f"train with eval.average_last={count} through at least {count} validations"
        )
    return found[-count:]


def averaged_weights(paths: list[Path], ema: bool = False) -> dict[str, Tensor]:
    """The model state averaged over the checkpoints ``paths`` (oldest first), reading one at a
    time; with ``ema``, their EMA weights.

    Raises:
        CheckpointError: a checkpoint is unreadable, holds no EMA when ``ema``, or its tensors
            differ in name or shape from the others'.
    """
    sums: dict[str, Tensor] = {}
    newest: dict[str, Tensor] = {}
    for path in paths:
        newest = checkpoint.model_weights(checkpoint.load(path), path, ema)
        _check_alike(path, paths[0], newest, sums)
        for name, tensor in newest.items():
            if tensor.is_floating_point():
                sums[name] = sums[name] + tensor.double() if name in sums else tensor.double()
    return {
        name: (sums[name] / len(paths)).to(tensor.dtype) if name in sums else tensor
        for name, tensor in newest.items()
    }


def _check_alike(
    path: Path, first: Path, state: dict[str, Tensor], sums: dict[str, Tensor]
) -> None:
    """CheckpointError unless the floating tensors of ``state`` match ``sums`` in name and
    shape (nothing to match for the first checkpoint)."""
    if not sums:
        return
    floating = {name: t.shape for name, t in state.items() if t.is_floating_point()}
    if floating != {name: t.shape for name, t in sums.items()}:
        raise CheckpointError(
            f"checkpoint {path} holds other tensors than {first}, so they cannot be averaged; "
            "average checkpoints of one run (eval.average_last)"
        )
