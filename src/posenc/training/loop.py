"""The training loop: data -> tokenizer -> token-bucketed batches -> model -> loss -> logs and
checkpoints. A run directory holds everything a run needs to resume or be evaluated:
``config.yaml``, ``tokenizer/``, ``checkpoints/{last,previous,best}.pt``, ``tb/`` and
``train_summary.json``.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from posenc.config import check_types, paste
from posenc.data.batching import TokenBatcher, collate
from posenc.data.corpora import load_corpora
from posenc.data.corpus import Corpus
from posenc.data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer
from posenc.model.factory import build_model
from posenc.model.seq2seq import count_parameters
from posenc.runtime import checkpoint, distributed
from posenc.runtime.device import autocast_dtype, memory_mb, resolve_device, seed_everything
from posenc.runtime.files import write_json
from posenc.runtime.tblog import RunLogger
from posenc.training.losses import token_loss, validation_loss
from posenc.training.optim import lr_factor, make_optimizer
from posenc.training.start import (
    Start,
    TrainState,
    checkpoint_payload,
    does_not_fit,
    find_start,
    rank_seed,
    restore,
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
class EncodedData:
    """Token ids of the training and validation pairs."""

    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]


def encode_pairs(
    tokenizer: Tokenizer,
    corpus: Corpus,
    max_positions: int | None = None,
    max_source_tokens: int | None = None,
) -> tuple[list[list[int]], list[list[int]], int]:
    """Ids of both sides. When limits are given, pairs with a side longer than
    ``max_positions`` tokens (EOS included) or a source longer than ``max_source_tokens``
    tokens (EOS excluded) are dropped. Returns ``(src_ids, tgt_ids, dropped)``."""
    src = tokenizer.encode_batch(corpus.src)
    tgt = tokenizer.encode_batch(corpus.tgt)
    longest = max_positions or float("inf")
    longest_source = max_source_tokens or float("inf")
    keep = [
        i
        for i in range(len(src))
        if max(len(src[i]), len(tgt[i])) + 1 <= longest and len(src[i]) <= longest_source
    ]
    return [src[i] for i in keep], [tgt[i] for i in keep], len(src) - len(keep)


def prepare(cfg: DictConfig, run_dir: Path) -> tuple[Tokenizer, EncodedData]:
    """Load and clean the corpora, build (or reuse) the tokenizer, encode train and valid.

    Under torchrun rank 0 builds the tokenizer and saves it in ``run_dir/tokenizer``; the other
    ranks wait for it there and load it."""
    corpora = load_corpora(cfg.data)
    if distributed.is_main():
        cache_dir = Path(cfg.cache_dir).expanduser()
        tokenizer = build_tokenizer(cfg.tokenizer, corpora["train"], cache_dir)
        tokenizer.save(run_dir / "tokenizer")
    distributed.barrier()
    if not distributed.is_main():
        tokenizer = load_tokenizer(run_dir / "tokenizer")
    t = cfg.trainer
    train_src, train_tgt, dropped = encode_pairs(
        tokenizer, corpora["train"], t.max_positions, t.max_source_tokens
    )
    if dropped:
        log.info(
            "dropped %d training pairs over the length limits (max_positions=%s, "
            "max_source_tokens=%s)",
            dropped,
            t.max_positions,
            t.max_source_tokens,
        )
    if not train_src:
        raise ValueError("no training pairs left after tokenisation; raise trainer.max_positions")
    valid_src, valid_tgt, _ = encode_pairs(tokenizer, corpora["valid"])
    return tokenizer, EncodedData(train_src, train_tgt, valid_src, valid_tgt)


def _collate(indices, src, tgt, tokenizer: Tokenizer):
    return collate(
        [src[i] for i in indices],
        [tgt[i] for i in indices],
        tokenizer.pad_id,
        tokenizer.bos_id,
        tokenizer.eos_id,
    )


def _to_device(batch, device: torch.device):
    return tuple(t.to(device, non_blocking=True) for t in batch)


def budget_spent(steps: int, seconds: float, trainer: DictConfig) -> bool:
    """Whether ``steps`` optimizer steps and ``seconds`` of training spend the budget of
    ``trainer`` (``max_steps`` or ``max_time``, whichever comes first)."""
    return (trainer.max_steps is not None and steps >= trainer.max_steps) or (
        trainer.max_time is not None and seconds >= trainer.max_time
    )


def _budget_spent(state: TrainState, cfg: DictConfig) -> bool:
    return budget_spent(state.step, state.train_seconds, cfg.trainer)


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


def sanity_warnings(state: TrainState, trainer: DictConfig) -> list[str]:
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


def train(cfg: DictConfig, run_dir: Path, start: Start | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; returns the training summary. ``start`` is
    :func:`find_start`'s answer when the caller has it already.

    Under torchrun every rank calls this; rank 0 alone writes to ``run_dir``."""
    check_config(cfg)
    if start is None:
        start = find_start(cfg, run_dir)
    main, rank, world = distributed.is_main(), distributed.rank(), distributed.world_size()
    ckpt_dir = run_dir / "checkpoints"
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in checkpoint.remove_stale(ckpt_dir):
            log.info("removed %s, left by a save that was killed", stale.name)
    seed_everything(cfg.seed)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = distributed.local_device(resolve_device(cfg.device))
    amp = autocast_dtype(cfg.trainer.precision, device)
    tokenizer, data = prepare(cfg, run_dir)
    model = build_model(
        cfg, tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    model.to(device)
    t = cfg.trainer
    optimizer = make_optimizer(model, t.lr, t.betas, t.weight_decay)
    total_steps = t.max_steps or 100_000
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_factor(t.schedule, t.warmup_steps, total_steps, t.min_lr_ratio)
    )
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
    if state.world_size != world:  # resumed with another number of processes: same place
        state.batch_in_epoch = state.batch_in_epoch * state.world_size // world
        state.world_size = world
    if state.finished and not _budget_spent(state, cfg):
        state.finished = False  # the budget was raised: go on
    if rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, rank, state.step))
    trained = model
    if world > 1:
        trained = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    logger = RunLogger(run_dir / "tb", state.step, state.train_seconds) if main else None
    batcher = TokenBatcher(
        [len(s) for s in data.train_src],
        [len(t_) for t_ in data.train_tgt],
        t.max_tokens,
        seed=cfg.seed,
        rank=rank,
        world_size=world,
    )
    n_params = count_parameters(model)
    log.info(
        "model: %s parameters; pe=%s; device=%s; effective batch <= %d tokens "
        "(max_tokens %d x accumulate %d x %d processes)",
        f"{n_params:,}",
        cfg.pe.name,
        device,
        t.max_tokens * t.accumulate * world,
        t.max_tokens,
        t.accumulate,
        world,
    )

    def save(best: bool) -> None:
        payload = checkpoint_payload(model, optimizer, scheduler, state, cfg)
        checkpoint.save_atomic(payload, ckpt_dir / "last.pt", keep_previous=True)
        if best:
            checkpoint.save_atomic(payload, ckpt_dir / "best.pt")

    def validate() -> None:
        """Rank 0 computes the validation loss, logs it and checkpoints; the others wait."""
        if logger is not None:
            loss = validation_loss(
                model, data.valid_src, data.valid_tgt, tokenizer, t.max_tokens, device, amp
            )
            best = loss < state.best_valid_loss
            state.best_valid_loss = min(loss, state.best_valid_loss)
            state.history.append(
                {"step": state.step, "seconds": state.train_seconds, "valid_loss": loss}
            )
            logger.scalars(state.step, {"valid/loss": loss})
            logger.against_time("valid_loss", loss, state.train_seconds)
            logger.writer.flush()
            save(best)
            bar.write(f"step {state.step}: valid loss {loss:.4f}{' (best)' if best else ''}")
        distributed.barrier()  # so no rank counts this wait as training time

    model.train()
    bar = tqdm(
        total=t.max_steps,
        initial=state.step,
        disable=not (t.progress and main),
        desc=f"{cfg.pe.name}",
        dynamic_ncols=True,
    )
    window_tokens, window_time = 0, 0.0
    while not state.finished and not _budget_spent(state, cfg):
        batches = batcher.batches(state.epoch)
        while state.batch_in_epoch < len(batches) and not _budget_spent(state, cfg):
            group = batches[state.batch_in_epoch : state.batch_in_epoch + t.accumulate]
            state.batch_in_epoch += len(group)
            started = time.perf_counter()
            micro = [
                _to_device(_collate(ix, data.train_src, data.train_tgt, tokenizer), device)
                for ix in group
            ]
            local_tokens = sum(int(b[2].ne(tokenizer.pad_id).sum()) for b in micro)
            n_tokens = int(distributed.all_reduce([local_tokens], device)[0])
            optimizer.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for i, batch in enumerate(micro):
                # DDP averages gradients over ranks: scale by world / global tokens, and
                # all-reduce once per step (after the last micro-batch) only.
                last = i == len(micro) - 1
                with contextlib.nullcontext() if last or world == 1 else trained.no_sync():
                    with torch.autocast(
                        device.type, dtype=amp or torch.float32, enabled=amp is not None
                    ):
                        loss, _, _ = token_loss(trained, batch, tokenizer.pad_id, t.label_smoothing)
                    if state.step % t.log_every == 0:  # activations are alive: near the peak
                        state.peak_memory_mb = max(state.peak_memory_mb, memory_mb(device))
                    (loss * world / n_tokens).backward()
                loss_sum += float(loss.detach())
            step_loss = distributed.all_reduce([loss_sum], device)[0] / n_tokens
            if not math.isfinite(step_loss):
                if t.nan_policy == "skip":
                    state.skipped_batches += 1
                    optimizer.zero_grad(set_to_none=True)
                    log.warning("step %d: loss is %s; batch skipped", state.step + 1, step_loss)
                    continue
                raise TrainingError(_nan_message(step_loss, state.step + 1, ckpt_dir / "last.pt"))
            if t.clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
            optimizer.step()
            scheduler.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = distributed.all_reduce([time.perf_counter() - started], device, "max")[0]
            state.step += 1
            state.train_seconds += elapsed
            state.tokens += n_tokens
            window_tokens += n_tokens
            window_time += elapsed
            if logger is not None:
                logger.against_time("train_loss", step_loss, state.train_seconds)
            if state.step % t.log_every == 0:
                lr = scheduler.get_last_lr()[0]
                speed = window_tokens / max(window_time, 1e-9)
                if logger is not None:
                    logger.scalars(
                        state.step,
                        {"train/loss": step_loss, "train/lr": lr, "train/tokens_per_s": speed},
                    )
                bar.set_postfix(loss=f"{step_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{speed:,.0f}")
                window_tokens, window_time = 0, 0.0
            bar.update(1)
            if state.step % t.valid_every == 0:
                validate()
        if state.batch_in_epoch >= len(batches):
            state.epoch += 1
            state.batch_in_epoch = 0
    unvalidated = main and (not state.history or state.history[-1]["step"] != state.step)
    if distributed.all_reduce([float(unvalidated)], device, "max")[0]:  # rank 0 decides
        validate()
    state.finished = True
    bar.close()
    if main:
        for warning in sanity_warnings(state, t):
            log.warning(warning)
    summary = {
        "steps": state.step,
        "epochs": state.epoch + state.batch_in_epoch / max(len(batcher), 1),
        "train_seconds": round(state.train_seconds, 3),
        "train_tokens": state.tokens,
        "train_tokens_per_s": round(state.tokens / max(state.train_seconds, 1e-9), 1),
        "best_valid_loss": state.best_valid_loss,
        "final_valid_loss": state.history[-1]["valid_loss"] if state.history else None,
        "skipped_batches": state.skipped_batches,
        "parameters": n_params,
        "peak_memory_mb": round(state.peak_memory_mb, 1),
        "device": str(device),
        "processes": world,
        "train_pairs": len(data.train_src),
    }
    if logger is not None:
        save(best=False)
        write_json(run_dir / "train_summary.json", summary)
        logger.close()
    distributed.barrier()  # the others leave once rank 0 has saved the final checkpoint
    return summary
