"""What a run tells its user about a step that went wrong or a finished run that is hard to read:
each message names the problem and the setting that fixes it."""

from __future__ import annotations

from pathlib import Path

from posenc.config import TrainerConfig, paste
from posenc.training.start import TrainState


def nan_message(step_loss: float, step: int, last: Path) -> str:
    """What to do when the loss of optimizer step ``step`` is not finite."""
    if last.exists():
        return (
            f"loss became {step_loss} at step {step}; lower trainer.lr or set "
            f"trainer.nan_policy=skip, with {paste('trainer.resume', last)} to go on from the "
            "last good checkpoint"
        )
    return (
        f"loss became {step_loss} at step {step}, before any checkpoint; lower trainer.lr or "
        "set trainer.nan_policy=skip"
    )


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
