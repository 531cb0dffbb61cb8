"""Setting a training run up: its config checked, then everything it needs built, restored from
where it starts (:func:`set_up`), into :class:`Training`, what the steps of
:mod:`posenc.training.loop` share."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from posenc.config import TrainerConfig, reported_settings
from posenc.config.settings import Settings
from posenc.data.pools import PooledBatcher
from posenc.data.tokenizer import Tokenizer
from posenc.model.factory import build_model, token_ids
from posenc.model.seq2seq import Seq2Seq, count_parameters
from posenc.runtime import checkpoint, distributed
from posenc.runtime.device import (
    autocast_dtype,
    keep_freed_memory,
    release_freed_memory,
    resolve_device,
    seed_everything,
)
from posenc.runtime.progress import bar_disabled
from posenc.runtime.rundir import RunDir
from posenc.runtime.sinks import open_sinks
from posenc.runtime.tblog import RunLogger
from posenc.training.ema import WeightEMA, start_ema
from posenc.training.inputs import EncodedData, prepare
from posenc.training.optim import lr_factor, make_optimizer
from posenc.training.start import (
    Start,
    TrainState,
    begin,
    find_start,
    rank_seed,
    repair_best,
)
from posenc.training.steplog import StepWindow
from posenc.training.validation import (
    Scorer,
    ValidBleu,
    check_best_metric,
)

log = logging.getLogger("posenc.training.loop")


def check_config(settings: Settings) -> None:
    """Refuse impossible settings before any data is read (their types and ranges were checked
    when ``settings`` were read): a budget, a schedule and an EMA that exist, and a throw-away
    model built and run on three tokens."""
    t = settings.trainer
    if t.max_steps is None and t.max_time is None:
        raise ValueError("set a budget: trainer.max_steps and/or trainer.max_time (seconds)")
    lr_factor(t.schedule, t.warmup_steps, t.max_steps or 100_000, t.min_lr_ratio)
    if settings.eval.weights == "ema" and t.ema_decay is None:
        raise ValueError(
            "eval.weights=ema scores the EMA of the weights, which training keeps only with "
            "trainer.ema_decay: set it (e.g. trainer.ema_decay=0.999) or drop eval.weights=ema"
        )
    try:
        model = build_model(settings.model, settings.pe, 8, pad_id=0, bos_id=1, eos_id=2)
        with torch.no_grad():
            model(torch.tensor([[3, 4, 2]]), torch.tensor([[1, 5, 6]]))
    except (ValueError, TypeError) as err:
        raise ValueError(f"invalid configuration: {err}") from err


@dataclass
class StepBookkeeping:
    """What the steps keep between reports and checkpoints, beyond :class:`TrainState` (never
    saved: a resumed run starts it afresh)."""

    saved_step: int  # the step of the newest checkpoint
    window: StepWindow = field(default_factory=StepWindow)  # sums since the last report
    skipped_in_a_row: int = 0  # batches skipped in a row since the last step (nan_policy=skip)


@dataclass(frozen=True)
class Training:
    """Everything one training run's functions share, built once by :func:`set_up`; what
    changes as it trains is in ``state`` (saved in checkpoints) and ``steps``."""

    settings: Settings
    run_dir: RunDir
    device: torch.device
    tokenizer: Tokenizer
    data: EncodedData
    model: Seq2Seq
    trained: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: TrainState
    steps: StepBookkeeping
    batcher: PooledBatcher
    logger: RunLogger | None  # rank 0 only
    progress: tqdm
    valid_bleu: ValidBleu | None = None  # trainer.valid_bleu's subset and scorer
    memory_base_mb: float = 0.0  # memory held once the data was loaded (own_memory_mb's zero)
    ema: WeightEMA | None = None  # trainer.ema_decay's EMA of the weights (rank 0 only)

    @property
    def trainer(self) -> TrainerConfig:
        """The run's ``trainer`` settings."""
        return self.settings.trainer

    @property
    def amp(self) -> torch.dtype | None:
        """The autocast dtype of the forward passes (None: the model's own)."""
        return autocast_dtype(self.trainer.precision, self.device)

    @property
    def world(self) -> int:
        """The processes that train together (1 outside torchrun)."""
        return distributed.world_size()

    def budget_spent(self) -> bool:
        """The step or time budget is spent, or early stopping ended the run."""
        return self.state.stopped_early or self.trainer.budget_spent(
            self.state.step, self.state.train_seconds
        )


def set_up(
    settings: Settings, run_dir: RunDir, start: Start | None, scorer: Scorer | None = None
) -> Training:
    """Check the settings, then build everything a run needs, restored from ``start`` (found
    here when None): device, data, tokenizer, model, optimizer and schedule, batches, logger."""
    check_config(settings)
    trainer = settings.trainer
    check_best_metric(trainer, scorer)
    start = find_start(settings, run_dir) if start is None else start
    _clear_stale(run_dir)
    device = _process_for_run(settings)
    tokenizer, data = prepare(settings, run_dir)
    memory_base_mb = release_freed_memory(device)
    model = build_model(settings.model, settings.pe, *token_ids(tokenizer)).to(device)
    optimizer, scheduler = _optimizer(model, trainer)
    state = _state(settings, run_dir, start, (model, optimizer, scheduler))
    _log_setup(settings, model, device)
    model.train()
    main = distributed.is_main()
    return Training(
        settings=settings,
        run_dir=run_dir,
        device=device,
        tokenizer=tokenizer,
        data=data,
        model=model,
        trained=_trained_form(model, device, trainer),
        optimizer=optimizer,
        scheduler=scheduler,
        ema=start_ema(trainer, model, start) if main else None,
        state=state,
        batcher=_batcher(settings, data),
        logger=_open_logger(settings, run_dir, state) if main else None,
        progress=_progress(settings, state, main),
        steps=StepBookkeeping(saved_step=state.step),
        memory_base_mb=memory_base_mb,
        valid_bleu=_valid_bleu(scorer, data, trainer),
    )


def _state(settings: Settings, run_dir: RunDir, start: Start, trained: tuple) -> TrainState:
    """Where training begins (:func:`~posenc.training.start.begin`) for ``trained = (model,
    optimizer, scheduler)``, the best checkpoint repaired on rank 0, the other ranks' dropout
    seeded apart."""
    rank, world = distributed.rank(), distributed.world_size()
    state = begin(start, *trained, settings.trainer, world)
    if rank == 0:
        repair_best(start, state, run_dir)
    else:
        torch.manual_seed(rank_seed(settings.run.seed, rank, state.step))
    return state


def _valid_bleu(
    scorer: Scorer | None, data: EncodedData, trainer: TrainerConfig
) -> ValidBleu | None:
    """``trainer.valid_bleu``'s subset and its scorer (None when it is off)."""
    if scorer is None or not trainer.valid_bleu:
        return None
    return ValidBleu.of(scorer, data.valid_src, data.valid_refs, trainer.valid_bleu)


def _clear_stale(run_dir: RunDir) -> None:
    """On rank 0: create the run directory, and remove what a killed save left in it."""
    if not distributed.is_main():
        return
    run_dir.path.mkdir(parents=True, exist_ok=True)
    for stale in checkpoint.remove_stale(run_dir.checkpoints):
        log.info("removed %s, left by a save that was killed", stale.name)


def _process_for_run(settings: Settings) -> torch.device:
    """Seed the process and set its threads; the run's device, its memory accounting reset (on
    CPU glibc keeps freed memory, a training step's temporaries; on CUDA the peak is this
    run's, not an earlier job's in a reused sweep worker)."""
    seed_everything(settings.run.seed)
    if settings.run.threads:
        torch.set_num_threads(settings.run.threads)
    device = distributed.local_device(resolve_device(settings.run.device))
    if device.type == "cpu":
        keep_freed_memory()
    else:
        torch.cuda.reset_peak_memory_stats(device)
    return device


def _optimizer(
    model: Seq2Seq, trainer: TrainerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model`` and its learning-rate schedule."""
    optimizer = make_optimizer(model, trainer.lr, trainer.betas, trainer.weight_decay)
    factor = lr_factor(
        trainer.schedule, trainer.warmup_steps, trainer.max_steps or 100_000, trainer.min_lr_ratio
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _trained_form(model: Seq2Seq, device: torch.device, trainer: TrainerConfig) -> torch.nn.Module:
    """What the steps call: the model, wrapped for data-parallel training under torchrun and
    compiled with ``trainer.compile``."""
    trained: torch.nn.Module = model
    if distributed.is_distributed():
        trained = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    return torch.compile(trained) if trainer.compile else trained


def _batcher(settings: Settings, data: EncodedData) -> PooledBatcher:
    """This process's token-bucketed training batches; logs the pairs over the length limits."""
    rank, world, trainer = distributed.rank(), distributed.world_size(), settings.trainer
    batcher = PooledBatcher(
        data.train,
        trainer.max_tokens,
        trainer.max_positions,
        trainer.max_source_tokens,
        seed=settings.run.seed,
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
    return batcher


def _log_setup(settings: Settings, model: Seq2Seq, device: torch.device) -> None:
    """One line: the model's size, encoding, device and effective batch."""
    world, trainer = distributed.world_size(), settings.trainer
    log.info(
        "model: %s parameters; pe=%s; device=%s; effective batch <= %d tokens "
        "(max_tokens %d x accumulate %d x %d processes)",
        f"{count_parameters(model):,}",
        settings.pe["name"],
        device,
        trainer.max_tokens * trainer.accumulate * world,
        trainer.max_tokens,
        trainer.accumulate,
        world,
    )


def _progress(settings: Settings, state: TrainState, main: bool) -> tqdm:
    """The progress bar (shown with ``trainer.progress`` on rank 0)."""
    return tqdm(
        total=settings.trainer.max_steps,
        initial=state.step,
        disable=bar_disabled(settings.trainer.progress and main),
        desc=f"{settings.pe['name']}",
        dynamic_ncols=True,
    )


def _open_logger(settings: Settings, run_dir: RunDir, state: TrainState) -> RunLogger:
    """The run's TensorBoard logger with the sinks ``logger.*`` switches on."""
    sinks = open_sinks(
        settings.logger,
        run_dir.path,
        settings.run.name,
        reported_settings(settings.composed),
        state.step,
        state.train_seconds,
    )
    return run_dir.logger(state.step, state.train_seconds, sinks)
