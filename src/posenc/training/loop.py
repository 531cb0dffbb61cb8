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
from pathlib import Path
from typing import Any

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from posenc.config.settings import Settings
from posenc.data.batching import collate
from posenc.model.seq2seq import count_parameters
from posenc.runtime import distributed
from posenc.runtime.device import (
    machine,
    memory_mb,
)
from posenc.runtime.files import write_json
from posenc.runtime.rundir import RunDir, as_run_dir
from posenc.runtime.version import code_version
from posenc.training import advice
from posenc.training.advice import TrainingError
from posenc.training.interrupt import StopRequests, TrainingInterrupted, resume_command
from posenc.training.losses import summed_losses
from posenc.training.setup import Training, set_up
from posenc.training.start import (
    Start,
)
from posenc.training.steplog import StepWindow, log_line
from posenc.training.validation import (
    Scorer,
    save,
    validate,
    validated_at,
)

log = logging.getLogger("posenc.training.loop")


def train(
    settings: Settings,
    run_dir: Path | RunDir,
    start: Start | None = None,
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """Train (or resume) the run of ``settings`` in ``run_dir``; returns the training summary.
    ``start`` is :func:`find_start`'s answer when the caller has it already; ``scorer`` decodes
    and scores the validation subset of ``trainer.valid_bleu`` (:mod:`posenc.training.validation`).

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
            return _train(settings, directory, start, stop, scorer)
    finally:
        if directory is not run_dir:  # opened here: its logger closes here
            directory.close()


def _train(
    settings: Settings,
    directory: RunDir,
    start: Start | None,
    stop: StopRequests,
    scorer: Scorer | None,
) -> dict:
    run = set_up(settings, directory, start, scorer)
    stop.deferring = True  # from here a signal waits for the step in progress
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
    saved = state.step > run.steps.saved_step
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
    # each pair's target ids and its EOS (collate's tgt_out), counted on the host: no device
    # round trip before the forward pass
    local_tokens = sum(len(run.data.train.tgt[i]) + 1 for indices in group for i in indices)
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
                loss, nll = summed_losses(run.trained, batch, pad_id, trainer.label_smoothing)
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
    # the norm before clipping; a finite loss can still give gradients that are not (a kernel's
    # backward), and one such step would write NaN into every weight. Read before clipping,
    # which would scale every gradient by a NaN norm
    trained = [p for p in run.model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in trained])
    grad_norm = float(norm)
    if not math.isfinite(grad_norm):
        log.warning("step %d: %s", state.step + 1, nonfinite_gradients(run.model))
        skip_or_stop(run, grad_norm, "the gradient norm")
        return False
    if trainer.clip_norm:
        torch.nn.utils.clip_grads_with_norm_(trained, trainer.clip_norm, norm)
    run.steps.skipped_in_a_row = 0
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
    run.steps.window.add(loss_sum, nll_sum, n_tokens, elapsed)
    if run.logger is not None:
        run.logger.against_time("train_loss", step_loss, state.train_seconds, n_tokens)
    if reporting:
        _report(run, grad_norm)
    run.progress.update(1)
    return True


def nonfinite_gradients(model: torch.nn.Module) -> str:
    """Which of ``model``'s parameters hold gradients that are not all finite, as one line: their
    count and the first and last of them in the model's order (a NaN born in one layer's
    backward reaches every parameter before that layer, none after it, so the last names where
    it began)."""
    names = [
        name
        for name, parameter in model.named_parameters()
        if parameter.grad is not None and not bool(parameter.grad.isfinite().all())
    ]
    total = sum(1 for parameter in model.parameters() if parameter.grad is not None)
    if not names:
        return f"every gradient of the {total} parameter tensors is finite"
    return (
        f"gradients not finite in {len(names)} of {total} parameter tensors, from {names[0]} "
        f"to {names[-1]}"
    )


def skip_or_stop(run: Training, value: float, what: str) -> None:
    """Skip and count a batch whose ``what`` (the loss, the gradient norm) is ``value``, not
    finite, before the optimizer step (``trainer.nan_policy=skip``); raise
    :class:`TrainingError` under ``nan_policy=stop`` or once ``trainer.nan_skip_limit`` batches
    in a row were skipped (naming the step and the newest finite checkpoint)."""
    trainer, step, checkpoints = run.trainer, run.state.step + 1, run.run_dir.checkpoints
    if trainer.nan_policy != "skip":
        raise TrainingError(advice.nan_loss(value, step, checkpoints, what))
    run.state.skipped_batches += 1
    run.steps.skipped_in_a_row += 1
    run.optimizer.zero_grad(set_to_none=True)
    if run.steps.skipped_in_a_row >= trainer.nan_skip_limit:
        raise TrainingError(
            advice.skip_limit(value, step, run.steps.skipped_in_a_row, checkpoints, what)
        )
    log.warning("step %d: %s is %s; batch skipped", step, what, value)


def _report(run: Training, grad_norm: float) -> None:
    """The window's means to ``train.log``, TensorBoard and the progress bar."""
    values = run.steps.window.report(run.scheduler.get_last_lr()[0], grad_norm)
    run.steps.window = StepWindow()
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
