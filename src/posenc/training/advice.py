"""What a run tells its user about a step that went wrong or a finished run that is hard to read:
each message names the problem and the setting that fixes it."""

from __future__ import annotations

import math
from pathlib import Path

from posenc.config import TrainerConfig, paste
from posenc.runtime import checkpoint
from posenc.training.start import TrainState

#: the checkpoints a run can resume from after a NaN, newest first on the same step
RESUMABLE = ("last.pt", "previous.pt", "best.pt")


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, say); the message names the step and the way out."""


def nan_loss(value: float, step: int, checkpoints: Path, what: str = "loss") -> str:
    """What to do when the ``what`` of optimizer step ``step`` (its loss, or its gradient norm
    under a finite loss) is ``value``, not finite (``trainer.nan_policy=stop``)."""
    return nan_message(
        f"{what} became {value} at step {step}",
        "lower trainer.lr or set trainer.nan_policy=skip",
        checkpoints,
    )


def skip_limit(value: float, step: int, skipped: int, checkpoints: Path, what: str = "loss") -> str:
    """What to do when ``skipped`` batches in a row, the last at step ``step``, had a ``what``
    (loss, gradient norm) that is not finite, the last ``value`` (``trainer.nan_policy=skip``
    reached ``trainer.nan_skip_limit``)."""
    return nan_message(
        f"{what} was {value} in {skipped} batches in a row at step {step} "
        f"(trainer.nan_skip_limit={skipped})",
        "lower trainer.lr",
        checkpoints,
    )


def nan_validation(loss: float, step: int, checkpoints: Path) -> str:
    """What to do when the validation loss at step ``step`` is not finite (nothing saved)."""
    return nan_message(
        f"validation loss became {loss} at step {step}", "lower trainer.lr", checkpoints
    )


def nan_weights(step: int, checkpoints: Path) -> str:
    """What to do when the weights at step ``step`` are not all finite (nothing saved)."""
    return nan_message(
        f"the weights are not all finite at step {step}, so they are not saved",
        "lower trainer.lr",
        checkpoints,
    )


def nan_message(problem: str, fixes: str, checkpoints: Path) -> str:
    """``problem`` (what went non-finite, and at which step) and ``fixes`` (the settings to
    change), then where to go on from: the checkpoint of :func:`finite_checkpoint`, as an
    override to paste, or that there is none."""
    if not any((checkpoints / name).exists() for name in RESUMABLE):
        return f"{problem}, before any checkpoint; {fixes}"
    path = finite_checkpoint(checkpoints)
    if path is None:
        return (
            f"{problem}; no checkpoint in {checkpoints} is finite to resume from: {fixes} and "
            f"start over (delete {checkpoints}, or train under another name=)"
        )
    return (
        f"{problem}; {fixes}, with {paste('trainer.resume', path)} to go on from the newest "
        "finite checkpoint"
    )


def finite_checkpoint(checkpoints: Path) -> Path | None:
    """The newest (highest step; in the order of :data:`RESUMABLE` on a tie) of the
    checkpoints in ``checkpoints`` whose weights are all finite and whose recorded validation
    losses are finite; None when none is. Loads each one in full: for error paths only."""
    found = []
    for rank, name in enumerate(RESUMABLE):
        step = _finite_step(checkpoints / name)
        if step is not None:
            found.append((step, -rank, checkpoints / name))
    return max(found)[2] if found else None


def _finite_step(path: Path) -> int | None:
    """The step of the checkpoint ``path`` when it loads and is finite, else None."""
    try:
        payload = checkpoint.load(path)
        state, weights = payload["state"], dict(payload["model"])
        losses = [float(point["valid_loss"]) for point in state["history"]]
        step = int(state["step"])
    except (checkpoint.CheckpointError, KeyError, TypeError, ValueError):
        return None
    finite = checkpoint.all_finite(weights) and all(map(math.isfinite, losses))
    return step if finite else None


def sanity_warnings(state: TrainState, trainer: TrainerConfig) -> list[str]:
    """What makes a finished run's curves or scores hard to read: training that ended inside
    the warmup (the learning rate never reached ``trainer.lr``) or a single validation point."""
    warnings = []
    if state.step <= trainer.warmup_steps:
        peak = trainer.lr * state.step / max(trainer.warmup_steps, 1)
        warnings.append(
            f"training ended at step {state.step}, inside the {trainer.warmup_steps}-step warmup: "
            f"the learning rate peaked at {peak:.2g}, never trainer.lr={trainer.lr:g}; lower "
            "trainer.warmup_steps or raise the budget"
        )
    if len(state.history) < 2:
        warnings.append(
            f"only {len(state.history)} validation point(s): no learning curve to compare; lower "
            f"trainer.valid_every (now {trainer.valid_every}) or raise the budget"
        )
    return warnings
