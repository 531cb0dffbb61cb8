"""What ``python train.py ...`` does for one Hydra job: prepare the run directory, train (or
resume), evaluate, and record the outcome. Errors a user can fix end the job with one line.

Under ``torchrun --nproc_per_node=N train.py ...`` every rank runs this: all train together,
rank 0 alone writes the run directory and evaluates (see :mod:`posenc.runtime.distributed`)."""

from __future__ import annotations

import logging
import sys
from math import inf
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict

from posenc.config import TrainerConfig, reported_settings
from posenc.data.corpus import DataError
from posenc.evaluation.evaluate import evaluate
from posenc.runtime import distributed
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.device import resolve_device
from posenc.runtime.rundir import RunDir
from posenc.training.interrupt import TrainingInterrupted
from posenc.training.loop import TrainingError, train
from posenc.training.start import RunMismatchError, find_start

log = logging.getLogger("posenc")

USER_ERRORS = (DataError, CheckpointError, TrainingError, ValueError, FileNotFoundError)

OmegaConf.register_new_resolver("dirname", lambda overrides: overrides or "default", replace=True)


def _absolute_paths(cfg: DictConfig) -> None:
    """Make path settings absolute so the saved config works from any directory."""
    with open_dict(cfg):
        if cfg.data.get("dir"):
            cfg.data.dir = to_absolute_path(cfg.data.dir)
        if cfg.tokenizer.get("vocab_file"):
            cfg.tokenizer.vocab_file = to_absolute_path(cfg.tokenizer.vocab_file)
        cfg.cache_dir = to_absolute_path(str(Path(cfg.cache_dir).expanduser()))
        uri = cfg.get("logger", {}).get("mlflow_uri")
        if uri and "://" not in uri:  # a local directory, not a server
            cfg.logger.mlflow_uri = to_absolute_path(str(Path(uri).expanduser()))
        for key in ("resume", "init_from"):
            if cfg.trainer.get(key):
                cfg.trainer[key] = to_absolute_path(cfg.trainer[key])


def hydra_job() -> tuple[Path, bool]:
    """The current Hydra job's output directory and whether it is part of a multirun."""
    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.runtime.output_dir), hydra_cfg.mode == RunMode.MULTIRUN


def finished_metrics(cfg: DictConfig, run_dir: RunDir) -> dict[str, Any] | None:
    """The metrics of a run in ``run_dir`` that is trained to the budget of ``cfg`` and
    evaluated at its last step, or None when something is missing or unfinished."""
    metrics, summary = run_dir.metrics(), run_dir.summary()
    if metrics is None or summary is None or metrics.get("step") != summary.get("steps"):
        return None
    trainer = TrainerConfig.of(cfg.trainer)
    spent = trainer.budget_spent(summary.get("steps", 0), summary.get("train_seconds", 0.0))
    stopped = bool(
        summary.get("stopped_early")
        and trainer.patience
        and summary.get("validations_since_best", 0) >= trainer.patience
    )
    return metrics if spent or stopped else None


def objective(cfg: DictConfig, run_dir: Path) -> float | None:
    """What ``train.py`` returns to an optimising sweeper (Optuna), per ``cfg.objective``:
    ``valid_loss`` = the run's best validation loss (``inf`` for a run that failed, so the
    search moves away from it); None when ``cfg.objective`` is null."""
    if cfg.get("objective") is None:
        return None
    run = RunDir(run_dir)
    loss = (run.summary() or {}).get("best_valid_loss")
    return float(loss) if loss is not None and not run.failure_file.exists() else inf


def run(cfg: DictConfig, run_dir: Path, multirun: bool = False) -> dict[str, Any] | None:
    """Train and evaluate one configuration in ``run_dir``.

    A run that is already trained and evaluated returns its metrics at once; an unfinished
    one resumes; a failed one is tried again. A user error (bad data, corrupt checkpoint, NaN
    loss, impossible config) is logged as one line and recorded in ``failed.json``; a single run
    then exits with status 1, while a multirun goes on with its other jobs. Under torchrun the
    ranks train together and rank 0 returns the metrics (the others return None).
    """
    directory = RunDir(run_dir)
    try:
        return _run(cfg, directory, multirun)
    except TrainingInterrupted as stop:
        log.error("%s", stop)
        sys.exit(stop.exit_code)
    except KeyboardInterrupt:
        log.error(
            "interrupted (Ctrl-C) outside the training steps; what was saved stays: run the same "
            "command again to go on from the last checkpoint"
        )
        sys.exit(130)
    finally:
        directory.close()
        distributed.teardown()


def _run(cfg: DictConfig, run_dir: RunDir, multirun: bool) -> dict[str, Any] | None:
    _absolute_paths(cfg)
    try:
        distributed.setup(resolve_device(cfg.device))
        start = find_start(cfg, run_dir)  # before anything is written: the run may be another's
        if distributed.is_main():
            run_dir.path.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(cfg, run_dir.config, resolve=True)
            run_dir.failure_file.unlink(missing_ok=True)
        done = finished_metrics(cfg, run_dir)
        if done is not None:
            log.info("%s is already trained and evaluated; nothing to do", run_dir.path)
            return done if distributed.is_main() else None
        summary = train(cfg, run_dir, start)
        if not distributed.is_main():
            return None
        metrics = run_dir.metrics()
        if metrics is not None and metrics.get("step") == summary["steps"]:
            log.info("%s is already trained and evaluated; nothing to do", run_dir.path)
            return metrics
        if not cfg.eval.enabled:
            return None
        metrics = evaluate(cfg, run_dir)
    except USER_ERRORS as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        log.error("%s: %s", type(err).__name__, message)
        if distributed.is_main() and not isinstance(err, RunMismatchError):
            try:
                run_dir.record_failure(type(err).__name__, message)
            except OSError as unwritten:  # the disk may be full
                log.error("could not record the failure in %s: %s", run_dir.failure_file, unwritten)
        if multirun:
            return None  # the sweep goes on; the report lists this run as failed
        sys.exit(1)
    _log_hparams(cfg, run_dir, metrics)
    first = next(iter(metrics["splits"].values()), {})
    log.info(
        "done: %s  BLEU %s  chrF %s  -> %s",
        cfg.pe.name,
        first.get("bleu"),
        first.get("chrf"),
        run_dir.path,
    )
    return metrics


def _log_hparams(cfg: DictConfig, run_dir: RunDir, metrics: dict[str, Any]) -> None:
    """The run's session in TensorBoard's HParams tab (its settings, final scores and best
    validation loss); in a multirun, then the sweep's experiment summary at the sweep's root,
    rewritten from every session under it (:mod:`posenc.runtime.hparams`)."""
    from posenc.runtime.hparams import hydra_sweep_root, write_sweep_experiment

    train_info = metrics.get("train", {})
    values = {"hparam/valid_loss": train_info.get("best_valid_loss")}
    for split, m in metrics["splits"].items():
        values[f"hparam/{split}_bleu"] = m["bleu"]
        values[f"hparam/{split}_chrf"] = m["chrf"]
        if m.get("bertscore_f1") is not None:
            values[f"hparam/{split}_bertscore_f1"] = m["bertscore_f1"]
    values = {k: float(v) for k, v in values.items() if v is not None}
    step = metrics["step"]
    run_dir.logger(resume_step=step, resume_seconds=1e12).hparams(
        reported_settings(cfg), values, step
    )
    root = hydra_sweep_root(run_dir.path)
    if root is not None:
        try:
            write_sweep_experiment(root)
        except OSError as err:  # the run is done; a full disk must not fail it here
            log.warning("TensorBoard's HParams summary of %s not written: %s", root, err)
