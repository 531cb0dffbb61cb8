"""Where training starts: from scratch, from a checkpoint to resume (checked to be the same
encoding, model and tokenizer), or from weights to fine-tune; and what a checkpoint holds so a
resume continues exactly where the run stopped (weights, optimizer, schedule, RNG states)."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posenc.config import TrainerConfig, paste
from posenc.config.identity import differences
from posenc.config.settings import Settings
from posenc.runtime import checkpoint
from posenc.runtime.rundir import RunDir, as_run_dir

log = logging.getLogger("posenc.training")


class RunMismatchError(checkpoint.CheckpointError):
    """The checkpoint to resume from was trained with other ``pe``, ``model`` or ``tokenizer``
    settings; nothing is written (the run directory may belong to that other run)."""


@dataclass
class Start:
    """Where training starts: a checkpoint to resume (``resume``), weights to fine-tune from
    (``init_from``), or neither (from scratch). ``payload`` is the loaded checkpoint."""

    path: Path | None = None
    payload: dict[str, Any] | None = None
    fine_tune: bool = False


def checkpoint_payload(
    model, optimizer, scheduler, state: TrainState, settings: Settings, ema=None
) -> dict:
    """Everything a resume needs, as tensors and plain values only (weights-only loadable),
    the run's composed config among them; with ``ema`` (a
    :class:`posenc.training.ema.WeightEMA`) its weights too, as ``ema``."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "state": asdict(state),
        "rng": {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": [name, keys.tolist(), int(position), int(has_gauss), float(cached_gaussian)],
        },
        "config": dict(settings.composed),
    }
    if ema is not None:
        payload["ema"] = ema.state_dict()
    return payload


def does_not_fit(path: Path, err: Exception) -> checkpoint.CheckpointError:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    detail = lines[1] if len(lines) > 1 and lines[0].endswith(":") else str(err)
    return checkpoint.CheckpointError(
        f"checkpoint {path} does not fit this run ({type(err).__name__}: {detail[:200]}); "
        "point trainer.resume or trainer.init_from elsewhere"
    )


def restore(path: Path, payload: dict[str, Any], model, optimizer, scheduler) -> TrainState:
    try:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        torch.set_rng_state(payload["rng"]["torch"])
        random.setstate(payload["rng"]["python"])
        name, keys, position, has_gauss, cached_gaussian = payload["rng"]["numpy"]
        np.random.set_state(
            (name, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached_gaussian)
        )
        return TrainState(**payload["state"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise does_not_fit(path, err) from err


def find_start(settings: Settings, run_dir: Path | RunDir) -> Start:
    """The checkpoint this run resumes (``trainer.resume``, else ``RUN/checkpoints/last.pt``),
    checked to be the same encoding, model and tokenizer; else the weights of
    ``trainer.init_from`` to fine-tune from; else a start from scratch.

    Raises:
        RunMismatchError: the checkpoint to resume was trained with other settings.
        CheckpointError: a checkpoint is missing, corrupt or unsafe.
    """
    trainer = settings.trainer
    path = _resume_path(trainer, as_run_dir(run_dir))
    if path is not None:
        payload = checkpoint.load(path)
        changed = differences(payload.get("config") or {}, dict(settings.composed))
        if changed:
            raise RunMismatchError(
                f"checkpoint {path} was trained with {'; '.join(changed[:3])}"
                f"{' and more' if len(changed) > 3 else ''}; resume it with its own settings, "
                f"start a new run (another name=), or fine-tune from its weights with "
                f"{paste('trainer.init_from', path)}"
            )
        return Start(path, payload)
    if trainer.init_from:
        path = Path(trainer.init_from).expanduser()
        return Start(path, checkpoint.load(path), fine_tune=True)
    return Start()


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The torch seed of rank ``rank`` > 0 from ``step`` on, so ranks draw different dropout."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def _resume_path(trainer: TrainerConfig, run_dir: RunDir) -> Path | None:
    if trainer.resume:
        return Path(trainer.resume).expanduser()
    return run_dir.last if run_dir.last.exists() else None


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    train_seconds: float = 0.0
    tokens: int = 0
    best_valid_loss: float = math.inf
    skipped_batches: int = 0
    peak_memory_mb: float = 0.0
    # the most memory the run itself held: on CPU the resident set above its base once its data
    # was loaded (runtime.device.release_freed_memory), on CUDA the allocator's peak
    own_memory_mb: float = 0.0
    finished: bool = False
    validations_since_best: int = 0  # validations in a row that did not improve on the best
    stopped_early: bool = False  # trainer.patience ended the run
    world_size: int = 1  # processes that trained together (batch_in_epoch counts one's batches)
    best_step: int | None = None  # the step of the best validation (None: none yet, or older run)
    best_valid_bleu: float | None = None  # trainer.valid_bleu's best BLEU (None: off, none yet)
    history: list[dict[str, float]] = field(default_factory=list)


def begin(
    start: Start, model, optimizer, scheduler, trainer: TrainerConfig, world: int
) -> TrainState:
    """The state training begins in: a fresh one (from scratch, or fine-tuning from
    ``start``'s weights with a fresh optimizer, schedule and step count) or the resumed one,
    carried over to ``world`` processes and reopened when the budget was raised since."""
    state = TrainState()
    if start.fine_tune:
        try:
            model.load_state_dict(start.payload["model"])
        except (KeyError, RuntimeError) as err:
            raise does_not_fit(start.path, err) from err
        trained_as = (start.payload.get("config") or {}).get("pe", {}).get("name", "?")
        log.info(
            "fine-tuning from the weights of %s (trained with pe=%s); optimizer, schedule and "
            "step count start afresh",
            start.path,
            trained_as,
        )
    elif start.path is not None:
        state = restore(start.path, start.payload, model, optimizer, scheduler)
        log.info(
            "resumed from %s at step %d (%.0f s of training)",
            start.path,
            state.step,
            state.train_seconds,
        )
        _peak_lr(scheduler, trainer.lr)
    if state.world_size != world:  # resumed with another number of processes: same place
        state.batch_in_epoch = state.batch_in_epoch * state.world_size // world
        state.world_size = world
    if state.stopped_early and not (
        trainer.patience and state.validations_since_best >= trainer.patience
    ):
        state.stopped_early = False  # trainer.patience was raised or switched off: go on
    if (
        state.finished
        and not state.stopped_early
        and not trainer.budget_spent(state.step, state.train_seconds)
    ):
        state.finished = False  # the budget was raised: go on
    return state


def _peak_lr(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """Go on under the peak learning rate ``lr`` (``trainer.lr``): a restored schedule keeps the
    one it was saved with, which would ignore a ``trainer.lr`` lowered to resume after a NaN."""
    if all(base == lr for base in scheduler.base_lrs):
        return
    log.info(
        "trainer.lr is %g now (%g in the checkpoint): the schedule goes on from it",
        lr,
        scheduler.base_lrs[0],
    )
    scheduler.base_lrs = [lr] * len(scheduler.base_lrs)
    for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def repair_best(start: Start, state: TrainState, run_dir: RunDir) -> None:
    """Link ``best.pt`` to ``last.pt`` again when the run resumes from its own ``last.pt``, which
    records its step as the best, while ``best.pt`` holds another step or is missing: a kill
    between writing ``last.pt`` and linking ``best.pt`` (rank 0 only)."""
    resumed_last = (
        start.path is not None
        and not start.fine_tune
        and start.path.resolve() == run_dir.last.resolve()
    )
    if not resumed_last or state.best_step != state.step:
        return
    held = checkpoint.saved_step(run_dir.best)
    if held != state.step:
        checkpoint.link_over(run_dir.last, run_dir.best)
        log.info(
            "%s held step %s, but the best validation was at step %d: linked it to %s again",
            run_dir.best,
            held,
            state.step,
            run_dir.last,
        )
