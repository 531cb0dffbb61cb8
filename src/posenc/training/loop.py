"""The training loop: set up (data, tokenizer, model, optimizer, where to start), then step,
validate and checkpoint until the budget is spent, then finish (summary, final checkpoint).
:func:`train` reads top to bottom; :class:`Training` is everything the steps share.

Under torchrun (see :mod:`posenc.runtime.distributed`) every rank trains a
DistributedDataParallel copy of the model on its own share of the batches; the loss is
normalised by the target tokens of the whole step over all ranks, so an update equals one
process's update on the union of the ranks' batches. Rank 0 alone validates and writes files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from posenc.config import TrainerConfig, check_types, paste
from posenc.data.batching import TokenBatcher, collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.factory import build_model
from posenc.model.seq2seq import Seq2Seq, count_parameters
from posenc.runtime import checkpoint, distributed
from posenc.runtime.device import (
    autocast_dtype,
    keep_freed_memory,
    memory_mb,
    resolve_device,
    seed_everything,
)
from posenc.runtime.files import write_json
from posenc.runtime.rundir import RunDir, as_run_dir
from posenc.runtime.tblog import RunLogger
from posenc.training.inputs import EncodedData, prepare
from posenc.training.losses import token_loss, validation_loss
from posenc.training.optim import lr_factor, make_optimizer
from posenc.training.start import (
    Start,
    TrainState,
    begin,
    checkpoint_payload,
    find_start,
    rank_seed,
)

log = logging.getLogger("posenc.training.loop")


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, say); the message names the step and the way out."""


def check_config(cfg: DictConfig) -> None:
    """Refuse wrong types and impossible settings before any data is read: check the types and
    ranges of :mod:`posenc.config`, then build a throw-away model and run it on three tokens."""
    check_types(OmegaConf.to_container(cfg, resolve=True))
    t = cfg.trainer
    if t.max_steps is None and t.max_time is None:
        raise ValueError("set a budget: trainer.max_steps and/or trainer.max_time (seconds)")
    lr_factor(t.schedule, t.warmup_steps, t.max_steps or 100_000, t.min_lr_ratio)
    try:
        model = build_model(cfg, vocab_size=8, pad_id=0, bos_id=1, eos_id=2)
        with torch.no_grad():
            model(torch.tensor([[3, 4, 2]]), torch.tensor([[1, 5, 6]]))
    except (ValueError, TypeError) as err:
        raise ValueError(f"invalid configuration: {err}") from err


@dataclass
class Training:
    """Everything one training run's functions share (built by :func:`set_up`)."""

    cfg: DictConfig
    trainer: TrainerConfig
    run_dir: RunDir
    device: torch.device
    amp: torch.dtype | None
    tokenizer: Tokenizer
    data: EncodedData
    model: Seq2Seq
    trained: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: TrainState
    batcher: TokenBatcher
    logger: RunLogger | None  # rank 0 only
    progress: tqdm
    world: int
    window_tokens: int = 0
    window_seconds: float = 0.0

    def budget_spent(self) -> bool:
        return self.trainer.budget_spent(self.state.step, self.state.train_seconds)


def train(cfg: DictConfig, run_dir: Path | RunDir, start: Start | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns the training summary. ``start`` is
    :func:`find_start`'s answer when the caller has it already.

    Under torchrun every rank calls this; rank 0 alone writes to ``run_dir``; the caller of a
    :class:`RunDir` closes its logger."""
    directory = as_run_dir(run_dir)
    try:
        run = set_up(cfg, directory, start)
        for group in step_groups(run):
            if take_step(run, group) and run.state.step % run.trainer.valid_every == 0:
                validate(run)
        unvalidated = run.logger is not None and not _validated_at(run.state, run.state.step)
        if distributed.all_reduce([float(unvalidated)], run.device, "max")[0]:  # rank 0 decides
            validate(run)
        return finish(run)
    finally:
        if directory is not run_dir:  # opened here: its logger closes here
            directory.close()


def set_up(cfg: DictConfig, run_dir: RunDir, start: Start | None) -> Training:
    """Check the config, then build everything a run needs, restored from ``start`` (found here
    when None): device, data, tokenizer, model, optimizer and schedule, batches, logger."""
    check_config(cfg)
    trainer = TrainerConfig.of(cfg.trainer)
    if start is None:
        start = find_start(cfg, run_dir)
    main, rank, world = distributed.is_main(), distributed.rank(), distributed.world_size()
    if main:
        run_dir.path.mkdir(parents=True, exist_ok=True)
        for stale in checkpoint.remove_stale(run_dir.checkpoints):
            log.info("removed %s, left by a save that was killed", stale.name)
    seed_everything(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = distributed.local_device(resolve_device(cfg.device))
    if device.type == "cpu":
        keep_freed_memory()
    tokenizer, data = prepare(cfg, run_dir)
    model = build_model(
        cfg, tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    ).to(device)
    optimizer = make_optimizer(model, trainer.lr, trainer.betas, trainer.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_factor(
            trainer.schedule,
            trainer.warmup_steps,
            trainer.max_steps or 100_000,
            trainer.min_lr_ratio,
        ),
    )
    state = begin(start, model, optimizer, scheduler, trainer, world)
    if rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, rank, state.step))
    trained = model
    if world > 1:
        trained = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if trainer.compile:
        trained = torch.compile(trained)
    batcher = TokenBatcher(
        [len(s) for s in data.train_src],
        [len(t) for t in data.train_tgt],
        trainer.max_tokens,
        seed=cfg.seed,
        rank=rank,
        world_size=world,
    )
    log.info(
        "model: %s parameters; pe=%s; device=%s; effective batch <= %d tokens "
        "(max_tokens %d x accumulate %d x %d processes)",
        f"{count_parameters(model):,}",
        cfg.pe.name,
        device,
        trainer.max_tokens * trainer.accumulate * world,
        trainer.max_tokens,
        trainer.accumulate,
        world,
    )
    model.train()
    progress = tqdm(
        total=trainer.max_steps,
        initial=state.step,
        disable=not (trainer.progress and main),
        desc=f"{cfg.pe.name}",
        dynamic_ncols=True,
    )
    return Training(
        cfg=cfg,
        trainer=trainer,
        run_dir=run_dir,
        device=device,
        amp=autocast_dtype(trainer.precision, device),
        tokenizer=tokenizer,
        data=data,
        model=model,
        trained=trained,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        batcher=batcher,
        logger=run_dir.logger(state.step, state.train_seconds) if main else None,
        progress=progress,
        world=world,
    )


def step_groups(run: Training) -> Iterator[list[list[int]]]:
    """The batch groups of the coming optimizer steps (``accumulate`` batches each), epoch after
    epoch from where the state stands, until the budget is spent; the state's place advances
    as each group is handed out."""
    state = run.state
    while not run.budget_spent():
        batches = run.batcher.batches(state.epoch)
        while state.batch_in_epoch < len(batches) and not run.budget_spent():
            group = batches[state.batch_in_epoch : state.batch_in_epoch + run.trainer.accumulate]
            state.batch_in_epoch += len(group)
            yield group
        if state.batch_in_epoch >= len(batches):
            state.epoch += 1
            state.batch_in_epoch = 0


def take_step(run: Training, group: list[list[int]]) -> bool:
    """One optimizer step on the batches of ``group`` (indices of training pairs), accumulated
    and, under torchrun, averaged over the ranks; False when its loss was not finite and
    ``trainer.nan_policy=skip`` skipped it.

    The loss is normalised by the target tokens of the whole step over all ranks, so DDP's
    gradient average over ranks is scaled back by ``world``; gradients are all-reduced once per
    step (after the last micro-batch) only."""
    state, trainer, device, pad_id = run.state, run.trainer, run.device, run.tokenizer.pad_id
    started = time.perf_counter()
    micro = [
        tuple(
            (t.pin_memory() if device.type == "cuda" else t).to(device, non_blocking=True)
            for t in collate(
                [run.data.train_src[i] for i in indices],
                [run.data.train_tgt[i] for i in indices],
                pad_id,
                run.tokenizer.bos_id,
                run.tokenizer.eos_id,
            )
        )
        for indices in group
    ]
    local_tokens = sum(int(batch[2].ne(pad_id).sum()) for batch in micro)
    n_tokens = int(distributed.all_reduce([local_tokens], device)[0])
    run.optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        with contextlib.nullcontext() if last or run.world == 1 else run.trained.no_sync():
            with torch.autocast(
                device.type, dtype=run.amp or torch.float32, enabled=run.amp is not None
            ):
                loss, _, _ = token_loss(run.trained, batch, pad_id, trainer.label_smoothing)
            if state.step % trainer.log_every == 0:  # activations are alive: near the peak
                state.peak_memory_mb = max(state.peak_memory_mb, memory_mb(device))
            (loss * run.world / n_tokens).backward()
        loss_sum += float(loss.detach())
    step_loss = distributed.all_reduce([loss_sum], device)[0] / n_tokens
    if not math.isfinite(step_loss):
        if trainer.nan_policy != "skip":
            raise TrainingError(_nan_message(step_loss, state.step + 1, run.run_dir.last))
        state.skipped_batches += 1
        run.optimizer.zero_grad(set_to_none=True)
        log.warning("step %d: loss is %s; batch skipped", state.step + 1, step_loss)
        return False
    if trainer.clip_norm:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), trainer.clip_norm)
    run.optimizer.step()
    run.scheduler.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = distributed.all_reduce([time.perf_counter() - started], device, "max")[0]
    state.step += 1
    state.train_seconds += elapsed
    state.tokens += n_tokens
    _log_step(run, step_loss, n_tokens, elapsed)
    return True


def _log_step(run: Training, step_loss: float, n_tokens: int, elapsed: float) -> None:
    """Loss against time every step; loss, learning rate and speed every ``log_every`` steps."""
    state = run.state
    run.window_tokens += n_tokens
    run.window_seconds += elapsed
    if run.logger is not None:
        run.logger.against_time("train_loss", step_loss, state.train_seconds)
    if state.step % run.trainer.log_every == 0:
        lr = run.scheduler.get_last_lr()[0]
        speed = run.window_tokens / max(run.window_seconds, 1e-9)
        if run.logger is not None:
            run.logger.scalars(
                state.step, {"train/loss": step_loss, "train/lr": lr, "train/tokens_per_s": speed}
            )
        run.progress.set_postfix(loss=f"{step_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
        run.window_tokens, run.window_seconds = 0, 0.0
    run.progress.update(1)


def validate(run: Training) -> None:
    """Rank 0 computes the validation loss, logs it and checkpoints (``best.pt`` too when it is
    the best so far); the other ranks wait, so no rank counts this wait as training time."""
    state = run.state
    if run.logger is not None:
        loss = validation_loss(
            run.model,
            run.data.valid_src,
            run.data.valid_tgt,
            run.tokenizer,
            run.trainer.max_tokens,
            run.device,
            run.amp,
        )
        best = loss < state.best_valid_loss
        state.best_valid_loss = min(loss, state.best_valid_loss)
        state.history.append(
            {"step": state.step, "seconds": state.train_seconds, "valid_loss": loss}
        )
        run.logger.scalars(state.step, {"valid/loss": loss})
        run.logger.against_time("valid_loss", loss, state.train_seconds)
        run.logger.writer.flush()
        save(run, best)
        run.progress.write(f"step {state.step}: valid loss {loss:.4f}{' (best)' if best else ''}")
    distributed.barrier()


def save(run: Training, best: bool) -> None:
    """``last.pt`` (the one before kept as ``previous.pt``), and ``best.pt`` when ``best``."""
    payload = checkpoint_payload(run.model, run.optimizer, run.scheduler, run.state, run.cfg)
    checkpoint.save_atomic(payload, run.run_dir.last, keep_previous=True)
    if best:
        checkpoint.save_atomic(payload, run.run_dir.best)


def finish(run: Training) -> dict[str, Any]:
    """Mark the run finished, warn about what makes it hard to read, and (rank 0) save the
    final checkpoint and ``train_summary.json``; returns the summary."""
    state = run.state
    state.finished = True
    run.progress.close()
    summary = {
        "steps": state.step,
        "epochs": state.epoch + state.batch_in_epoch / max(len(run.batcher), 1),
        "train_seconds": round(state.train_seconds, 3),
        "train_tokens": state.tokens,
        "train_tokens_per_s": round(state.tokens / max(state.train_seconds, 1e-9), 1),
        "best_valid_loss": state.best_valid_loss,
        "final_valid_loss": state.history[-1]["valid_loss"] if state.history else None,
        "skipped_batches": state.skipped_batches,
        "parameters": count_parameters(run.model),
        "peak_memory_mb": round(state.peak_memory_mb, 1),
        "device": str(run.device),
        "processes": run.world,
        "train_pairs": len(run.data.train_src),
    }
    if run.logger is not None:
        for warning in sanity_warnings(state, run.trainer):
            log.warning(warning)
        save(run, best=False)
        write_json(run.run_dir.summary_file, summary)
        run.logger.writer.flush()
    distributed.barrier()  # the others leave once rank 0 has saved the final checkpoint
    return summary


def _validated_at(state: TrainState, step: int) -> bool:
    return bool(state.history) and state.history[-1]["step"] == step


def _nan_message(step_loss: float, step: int, last: Path) -> str:
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
