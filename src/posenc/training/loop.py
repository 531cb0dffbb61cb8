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
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from posenc.config import (
    EvalConfig,
    LoggerConfig,
    TrainerConfig,
    check_types,
    reported_settings,
)
from posenc.data.batching import collate
from posenc.data.pools import PooledBatcher
from posenc.data.tokenizer import Tokenizer
from posenc.model.factory import build_model
from posenc.model.seq2seq import Seq2Seq, count_parameters
from posenc.runtime import checkpoint, distributed
from posenc.runtime.device import (
    autocast_dtype,
    keep_freed_memory,
    machine,
    memory_mb,
    release_freed_memory,
    resolve_device,
    seed_everything,
)
from posenc.runtime.files import write_json
from posenc.runtime.rundir import RunDir, as_run_dir
from posenc.runtime.sinks import open_sinks
from posenc.runtime.tblog import RunLogger
from posenc.runtime.version import code_version
from posenc.training import advice
from posenc.training.advice import TrainingError
from posenc.training.ema import WeightEMA, start_ema
from posenc.training.inputs import EncodedData, prepare
from posenc.training.interrupt import StopRequests, TrainingInterrupted, resume_command
from posenc.training.losses import token_loss
from posenc.training.optim import lr_factor, make_optimizer
from posenc.training.start import (
    Start,
    TrainState,
    begin,
    find_start,
    rank_seed,
    repair_best,
)
from posenc.training.steplog import StepWindow, log_line
from posenc.training.validation import (
    Scorer,
    ValidBleu,
    check_best_metric,
    save,
    validate,
    validated_at,
)

log = logging.getLogger("posenc.training.loop")


def check_config(cfg: DictConfig) -> None:
    """Refuse wrong types and impossible settings before any data is read: check the types and
    ranges of :mod:`posenc.config`, then build a throw-away model and run it on three tokens."""
    check_types(OmegaConf.to_container(cfg, resolve=True))
    TrainerConfig.of(cfg.trainer)  # unknown keys (+trainer.KEY=...), with the closest known one
    EvalConfig.of(cfg.eval)
    LoggerConfig.of(cfg.get("logger") or {})
    t = cfg.trainer
    if t.max_steps is None and t.max_time is None:
        raise ValueError("set a budget: trainer.max_steps and/or trainer.max_time (seconds)")
    lr_factor(t.schedule, t.warmup_steps, t.max_steps or 100_000, t.min_lr_ratio)
    if cfg.eval.get("weights") == "ema" and t.get("ema_decay") is None:
        raise ValueError(
            "eval.weights=ema scores the EMA of the weights, which training keeps only with "
            "trainer.ema_decay: set it (e.g. trainer.ema_decay=0.999) or drop eval.weights=ema"
        )
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
    batcher: PooledBatcher
    logger: RunLogger | None  # rank 0 only
    progress: tqdm
    world: int
    saved_step: int  # the step of the newest checkpoint
    valid_bleu: ValidBleu | None = None  # trainer.valid_bleu's subset and scorer
    window: StepWindow = field(default_factory=StepWindow)
    skipped_in_a_row: int = 0  # batches skipped in a row since the last step (nan_policy=skip)
    memory_base_mb: float = 0.0  # memory held once the data was loaded (own_memory_mb's zero)
    ema: WeightEMA | None = None  # trainer.ema_decay's EMA of the weights (rank 0 only)

    def budget_spent(self) -> bool:
        """The step or time budget is spent, or early stopping ended the run."""
        return self.state.stopped_early or self.trainer.budget_spent(
            self.state.step, self.state.train_seconds
        )


def train(
    cfg: DictConfig,
    run_dir: Path | RunDir,
    start: Start | None = None,
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns the training summary. ``start`` is
    :func:`find_start`'s answer when the caller has it already; ``scorer`` decodes and scores
    the validation subset of ``trainer.valid_bleu`` (:mod:`posenc.training.validation`).

    Under torchrun every rank calls this; rank 0 alone writes to ``run_dir``; the caller of a
    :class:`RunDir` closes its logger.

    Raises:
        TrainingInterrupted: SIGINT or SIGTERM arrived; the step in progress was finished and
            checkpointed (see :mod:`posenc.training.interrupt`).
    """
    directory = as_run_dir(run_dir)
    stop = StopRequests()
    try:
        with stop.installed(), logging_redirect_tqdm():
            return _train(cfg, directory, start, stop, scorer)
    finally:
        if directory is not run_dir:  # opened here: its logger closes here
            directory.close()


def _train(
    cfg: DictConfig,
    directory: RunDir,
    start: Start | None,
    stop: StopRequests,
    scorer: Scorer | None,
) -> dict:
    run = set_up(cfg, directory, start, scorer)
    for group in step_groups(run):
        if take_step(run, group) and run.state.step % run.trainer.valid_every == 0:
            validate(run)
        signum = int(distributed.all_reduce([float(stop.signum or 0)], run.device, "max")[0])
        if signum:  # every rank stops after the same step
            raise interrupted(run, signum)
    unvalidated = run.logger is not None and not validated_at(run.state, run.state.step)
    if distributed.all_reduce([float(unvalidated)], run.device, "max")[0]:  # rank 0 decides
        validate(run)
    return finish(run)


def interrupted(run: Training, signum: int) -> TrainingInterrupted:
    """Checkpoint the steps taken since the last checkpoint (rank 0) and say how to resume."""
    state = run.state
    saved = state.step > run.saved_step
    if saved and run.logger is not None:
        save(run, best=False)
    distributed.barrier()
    where = (
        f"checkpoint saved to {run.run_dir.last}"
        if saved
        else f"no step since the checkpoint {run.run_dir.last}"
        if state.step
        else "no step taken, nothing to save"
    )
    return TrainingInterrupted(
        signum,
        f"interrupted by {signal.Signals(signum).name} at step {state.step}: {where}; "
        f"resume with: {resume_command()}",
    )


def set_up(
    cfg: DictConfig, run_dir: RunDir, start: Start | None, scorer: Scorer | None = None
) -> Training:
    """Check the config, then build everything a run needs, restored from ``start`` (found here
    when None): device, data, tokenizer, model, optimizer and schedule, batches, logger."""
    check_config(cfg)
    trainer = TrainerConfig.of(cfg.trainer)
    check_best_metric(trainer, scorer)
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
    else:  # the run's own peak, not an earlier job's in a reused sweep worker
        torch.cuda.reset_peak_memory_stats(device)
    tokenizer, data = prepare(cfg, run_dir)
    memory_base_mb = release_freed_memory(device)
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
    ema = start_ema(trainer, model, start) if main else None
    if main:
        repair_best(start, state, run_dir)
    if rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, rank, state.step))
    trained = model
    if distributed.is_distributed():
        trained = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if trainer.compile:
        trained = torch.compile(trained)
    batcher = PooledBatcher(
        data.train,
        trainer.max_tokens,
        trainer.max_positions,
        trainer.max_source_tokens,
        seed=cfg.seed,
        rank=rank,
        world_size=world,
        pool=trainer.batch_pool,
    )
    if batcher.dropped:
        log.info(
            "dropped %d training pairs over the length limits (max_positions=%s, "
            "max_source_tokens=%s)",
            batcher.dropped,
            trainer.max_positions,
            trainer.max_source_tokens,
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
        ema=ema,
        state=state,
        batcher=batcher,
        logger=_open_logger(cfg, run_dir, state) if main else None,
        progress=progress,
        world=world,
        saved_step=state.step,
        memory_base_mb=memory_base_mb,
        valid_bleu=ValidBleu.of(scorer, data.valid_src, data.valid_refs, trainer.valid_bleu)
        if scorer is not None and trainer.valid_bleu
        else None,
    )


def _open_logger(cfg: DictConfig, run_dir: RunDir, state: TrainState) -> RunLogger:
    """The run's TensorBoard logger with the sinks ``logger.*`` switches on."""
    sinks = open_sinks(
        LoggerConfig.of(cfg.get("logger") or {}),
        run_dir.path,
        cfg.name,
        reported_settings(cfg),
        state.step,
        state.train_seconds,
    )
    return run_dir.logger(state.step, state.train_seconds, sinks)


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
                [run.data.train.src[i] for i in indices],
                [run.data.train.tgt[i] for i in indices],
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
    loss_sum = nll_sum = 0.0
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        synced = last or not distributed.is_distributed()
        with contextlib.nullcontext() if synced else run.trained.no_sync():
            with torch.autocast(
                device.type, dtype=run.amp or torch.float32, enabled=run.amp is not None
            ):
                loss, nll, _ = token_loss(run.trained, batch, pad_id, trainer.label_smoothing)
            if state.step % trainer.log_every == 0:  # activations are alive: near the peak
                now = memory_mb(device)
                state.peak_memory_mb = max(state.peak_memory_mb, now)
                state.own_memory_mb = max(state.own_memory_mb, now - run.memory_base_mb)
            (loss * run.world / n_tokens).backward()
        loss_sum += float(loss.detach())
        nll_sum += float(nll.detach())
    loss_sum, nll_sum = distributed.all_reduce([loss_sum, nll_sum], device)
    step_loss = loss_sum / n_tokens
    if not math.isfinite(step_loss):
        skip_or_stop(run, step_loss, "loss")
        return False
    # the norm before clipping (inf clips nothing); a finite loss can still give gradients that
    # are not (a kernel's backward), and one such step would write NaN into every weight
    grad_norm = float(
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), trainer.clip_norm or math.inf)
    )
    if not math.isfinite(grad_norm):
        skip_or_stop(run, grad_norm, "the gradient norm")
        return False
    run.skipped_in_a_row = 0
    reporting = (state.step + 1) % trainer.log_every == 0
    run.optimizer.step()
    run.scheduler.step()
    if run.ema is not None:
        run.ema.update(state.step + 1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = distributed.all_reduce([time.perf_counter() - started], device, "max")[0]
    state.step += 1
    state.train_seconds += elapsed
    state.tokens += n_tokens
    run.window.add(loss_sum, nll_sum, n_tokens, elapsed)
    if run.logger is not None:
        run.logger.against_time("train_loss", step_loss, state.train_seconds, n_tokens)
    if reporting:
        _report(run, grad_norm)
    run.progress.update(1)
    return True


def skip_or_stop(run: Training, value: float, what: str) -> None:
    """Skip and count a batch whose ``what`` (the loss, the gradient norm) is ``value``, not
    finite, before the optimizer step (``trainer.nan_policy=skip``); raise
    :class:`TrainingError` under ``nan_policy=stop`` or once ``trainer.nan_skip_limit`` batches
    in a row were skipped (naming the step and the newest finite checkpoint)."""
    trainer, step, checkpoints = run.trainer, run.state.step + 1, run.run_dir.checkpoints
    if trainer.nan_policy != "skip":
        raise TrainingError(advice.nan_loss(value, step, checkpoints, what))
    run.state.skipped_batches += 1
    run.skipped_in_a_row += 1
    run.optimizer.zero_grad(set_to_none=True)
    if run.skipped_in_a_row >= trainer.nan_skip_limit:
        raise TrainingError(advice.skip_limit(value, step, run.skipped_in_a_row, checkpoints, what))
    log.warning("step %d: %s is %s; batch skipped", step, what, value)


def _report(run: Training, grad_norm: float) -> None:
    """The window's means to ``train.log``, TensorBoard and the progress bar."""
    values = run.window.report(run.scheduler.get_last_lr()[0], grad_norm)
    run.window = StepWindow()
    if run.logger is not None:
        run.logger.scalars(run.state.step, values)
        log.info(log_line(run.state.step, run.trainer.max_steps, values))
    run.progress.set_postfix(
        loss=f"{values['train/loss']:.3f}", tok_s=f"{values['train/tokens_per_s']:,.0f}"
    )


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
        "best_valid_bleu": state.best_valid_bleu,
        "final_valid_loss": state.history[-1]["valid_loss"] if state.history else None,
        "skipped_batches": state.skipped_batches,
        "stopped_early": state.stopped_early,
        "validations_since_best": state.validations_since_best,
        "parameters": count_parameters(run.model),
        "peak_memory_mb": round(state.peak_memory_mb, 1),
        "own_memory_mb": round(state.own_memory_mb, 1),
        "device": str(run.device),
        "processes": run.world,
        "train_pairs": run.batcher.pairs,
        "code": code_version(),
        "machine": machine(run.device),
    }
    if run.logger is not None:
        for warning in advice.sanity_warnings(state, run.trainer):
            log.warning(warning)
        save(run, best=False)
        write_json(run.run_dir.summary_file, summary)
        run.logger.writer.flush()
    distributed.barrier()  # the others leave once rank 0 has saved the final checkpoint
    return summary
