"""What ``python train.py ...`` does for one Hydra job: prepare the run directory, train (or
resume), evaluate, and record the outcome. Errors a user can fix end the job with one line.

Under ``torchrun --nproc_per_node=N train.py ...`` every rank runs this: all train together,
rank 0 alone writes the run directory and evaluates (see :mod:`posenc.runtime.distributed`)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import sys
import threading
import traceback
from contextlib import ExitStack
from math import inf
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf, open_dict

from posenc.config import TrainerConfig, paste, reported_settings
from posenc.config.identity import differences, evaluation_identity, training_identity
from posenc.config.metrics import METRICS, VALIDATION_METRICS
from posenc.config.settings import Settings
from posenc.data.corpus import DataError
from posenc.data.fetch import DataFetchError, use_local_mix
from posenc.evaluation.decode import DecodeSettings, decode_sources
from posenc.evaluation.evaluate import archive_evaluation, evaluate
from posenc.evaluation.metrics import corpus_scores
from posenc.runtime import distributed
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.cli import Terminated, raise_terminated
from posenc.runtime.console import label_console
from posenc.runtime.device import resolve_device
from posenc.runtime.files import LinkRefused, refuse_links_leaving
from posenc.runtime.lock import RunLockedError, run_lock
from posenc.runtime.rundir import RunDir, check_run_name, run_dir_name
from posenc.runtime.untrusted import UntrustedFileError, read_config
from posenc.training.advice import TrainingError
from posenc.training.interrupt import TrainingInterrupted
from posenc.training.loop import train
from posenc.training.setup import check_config
from posenc.training.start import RunMismatchError, Start, find_start
from posenc.training.validation import Scorer

log = logging.getLogger("posenc")

USER_ERRORS = (
    DataError,
    CheckpointError,
    TrainingError,
    ValueError,
    FileNotFoundError,
    RunLockedError,
    LinkRefused,
)
#: errors about a directory that is not this run's (another run's, another process's, or no
#: posenc run at all): nothing is written into it, failed.json included
NOT_OURS = (RunMismatchError, RunLockedError, LinkRefused)

#: Hydra's files in a run directory, written before a job starts; any other file in a directory
#: without a config.yaml means it is no posenc run
HYDRA_FILES = frozenset({".hydra", "train.log"})


def _run_name(name: str) -> str:
    try:
        return check_run_name(name)
    except ValueError as err:  # raised in a resolver, Hydra would print pages of traceback
        raise SystemExit(str(err)) from None


def _dirname(overrides: str, *, _root_: DictConfig) -> str:
    settings = OmegaConf.masked_copy(_root_, [key for key in _root_ if key != "hydra"])
    return run_dir_name(overrides, OmegaConf.to_container(settings, resolve=True))


OmegaConf.register_new_resolver("run_name", _run_name, replace=True)
OmegaConf.register_new_resolver("dirname", _dirname, replace=True)


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


def finished_metrics(trainer: TrainerConfig, run_dir: RunDir) -> dict[str, Any] | None:
    """The metrics of a run in ``run_dir`` that is trained to the budget of ``trainer`` and
    evaluated at its last step, or None when something is missing or unfinished."""
    metrics, summary = run_dir.metrics(), run_dir.summary()
    if metrics is None or summary is None or not evaluated_after_training(metrics, summary):
        return None
    spent = trainer.budget_spent(summary.get("steps", 0), summary.get("train_seconds", 0.0))
    stopped = bool(
        summary.get("stopped_early")
        and trainer.patience
        and summary.get("validations_since_best", 0) >= trainer.patience
    )
    return metrics if spent or stopped else None


def evaluated_after_training(metrics: dict[str, Any], summary: dict[str, Any]) -> bool:
    """Whether ``metrics`` were made once training had reached ``summary``'s last step (the
    checkpoint they score may be an earlier best one: their ``step`` is that checkpoint's)."""
    trained = (metrics.get("train") or {}).get("steps", metrics.get("step"))
    return trained == summary.get("steps")


def objective(cfg: DictConfig, run_dir: Path) -> float | None:
    """What ``train.py`` returns to an optimising sweeper (Optuna), per ``cfg.objective``:
    ``valid_loss`` = the run's best validation loss (``inf`` for a run that failed, so the
    search moves away from it); None when ``cfg.objective`` is null."""
    if cfg.get("objective") is None:
        return None
    run = RunDir(run_dir)
    try:
        loss = (run.summary() or {}).get("best_valid_loss")
    except UntrustedFileError:  # logged by the job already; the search moves away
        return inf
    return float(loss) if loss is not None and not run.failure_file.exists() else inf


def claim(cfg: DictConfig, run_dir: RunDir) -> DictConfig | None:
    """Check that ``run_dir`` may hold the run of ``cfg`` before anything is written there;
    returns the config saved there (None for a new run).

    Raises:
        RunMismatchError: the directory holds a run that trains another model, a config.yaml
            that cannot be read, or files of something that is no posenc run.
        LinkRefused: it holds symbolic links leading out of it.
    """
    path = run_dir.path
    refuse_links_leaving(path)
    if not run_dir.config.exists():
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        foreign = [name for name in present if name not in HYDRA_FILES | {".lock"}]
        if foreign:
            raise RunMismatchError(
                f"{path} holds {foreign[0]} but no config.yaml: it is no posenc run; give this "
                "run another directory"
            )
        return None
    try:
        saved = read_config(run_dir.config)
    except UntrustedFileError as err:
        raise RunMismatchError(f"{err}; give this run another directory") from None
    changed = differences(saved, cfg, of=training_identity)
    if changed:
        weights = run_dir.last if run_dir.last.exists() else None
        raise RunMismatchError(
            f"{path} holds a run trained with {'; '.join(changed[:3])}"
            f"{' and more' if len(changed) > 3 else ''}; run it with its own settings, or give "
            "this run another directory (outputs/ names keep them apart)"
            + (
                f", fine-tuning from its weights with {paste('trainer.init_from', weights)}"
                if weights
                else ""
            )
        )
    return saved


def run(cfg: DictConfig, run_dir: Path, multirun: bool = False) -> dict[str, Any] | None:
    """Train and evaluate one configuration in ``run_dir``.

    A run that is already trained and evaluated with the same settings returns its metrics at
    once; an unfinished one resumes; a failed one is tried again; one trained to the budget but
    evaluated under other ``eval`` settings is evaluated again (the earlier evaluation moves to
    ``RUN/evals/``). A directory that holds another run or is no posenc run is refused before
    anything is written, and so is one another process trains in (``RUN/.lock``). A user error
    (bad data, corrupt checkpoint, NaN loss, impossible config) is logged as one line and
    recorded in ``failed.json``; any other exception too, its traceback in ``failed.json``. A
    single run then exits with status 1, while a multirun goes on with its other jobs. Under
    torchrun the ranks train together and rank 0 returns the metrics (the others return None).
    """
    directory = RunDir(run_dir)
    label_console(run_dir.name.split("@")[0] if multirun else None)
    completed = False  # a rank that fails leaves the process group without waiting for others
    main = threading.current_thread() is threading.main_thread()
    # SIGTERM outside the training steps (preparing data, decoding the test sets) is said in one
    # line like Ctrl-C; the training loop catches it itself while it trains
    previous = signal.signal(signal.SIGTERM, raise_terminated) if main else None
    try:
        metrics = _run(cfg, directory, multirun)
        completed = True
        return metrics
    except TrainingInterrupted as stop:
        log.error("%s", stop)
        sys.exit(stop.exit_code)
    except Terminated:
        log.error(
            "stopped (SIGTERM) outside the training steps; what was saved stays: run the same "
            "command again to go on from the last checkpoint"
        )
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        log.error(
            "interrupted (Ctrl-C) outside the training steps; what was saved stays: run the same "
            "command again to go on from the last checkpoint"
        )
        sys.exit(130)
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        directory.close()
        distributed.teardown(wait=completed)


def _run(cfg: DictConfig, run_dir: RunDir, multirun: bool) -> dict[str, Any] | None:
    _absolute_paths(cfg)
    try:
        use_local_mix(cfg)
    except DataFetchError as err:  # no job can run without the data: nothing is written
        log.error("DataFetchError: %s", err)
        _remove_hydras_start(run_dir)
        sys.exit(1)
    settings = None  # a single run's read here, a sweep job's below (its failure recorded)
    if not multirun:
        try:  # a refused setting of a single run writes nothing (a sweep's job is recorded
            settings = Settings.of(cfg)  # below, in failed.json, so that its report lists it)
            check_config(settings)
            resolve_device(settings.run.device)  # a device this machine lacks, likewise
        except ValueError as err:
            log.error("ValueError: %s", str(err).splitlines()[0] if str(err) else "invalid")
            _remove_hydras_start(run_dir)
            sys.exit(1)
    with ExitStack() as held:
        try:
            settings = settings or Settings.of(cfg)  # from here on, typed settings only
            distributed.setup(resolve_device(settings.run.device))
            if distributed.is_main():
                saved = claim(cfg, run_dir)
                run_dir.path.mkdir(parents=True, exist_ok=True)
                held.enter_context(run_lock(run_dir.path, "training"))
            start = find_start(settings, run_dir)  # before anything is written: may be another's
            if distributed.is_main():
                _archive_other_evaluation(cfg, run_dir, saved)
                OmegaConf.save(cfg, run_dir.config, resolve=True)
                run_dir.failure_file.unlink(missing_ok=True)
            return _train_and_evaluate(settings, run_dir, start)
        except USER_ERRORS as err:
            message = str(err).splitlines()[0] if str(err) else type(err).__name__
            log.error("%s: %s", type(err).__name__, message)
            if not isinstance(err, NOT_OURS):
                _record_failure(run_dir, type(err).__name__, message)
        except TrainingInterrupted:
            raise
        except Exception as err:  # a fault nobody foresaw: one line, the traceback kept
            message = (str(err).splitlines() or [""])[0]
            log.error(
                "unexpected %s: %s (the traceback is in %s)",
                type(err).__name__,
                message,
                run_dir.failure_file,
            )
            _record_failure(run_dir, type(err).__name__, message, traceback.format_exc())
    if multirun:
        return None  # the sweep goes on; the report lists this run as failed
    sys.exit(1)


def _remove_hydras_start(run_dir: RunDir) -> None:
    """Remove a run directory that holds only what Hydra wrote for this job (its ``.hydra/``
    copy of the settings and the log), and the folders above it under the working directory
    that it leaves empty: a refused configuration leaves nothing behind. A directory with
    anything else in it (an earlier run) is left as it is."""
    path = run_dir.path
    if path.is_dir() and not path.is_symlink() and {p.name for p in path.iterdir()} <= HYDRA_FILES:
        shutil.rmtree(path, ignore_errors=True)
        here = Path.cwd().resolve()
        for parent in path.resolve().parents:  # the folders Hydra made for it, left empty
            if parent == here or here not in parent.parents:
                break
            try:
                parent.rmdir()  # only an empty folder
            except OSError:
                break


def _record_failure(run_dir: RunDir, error: str, message: str, trace: str | None = None) -> None:
    """``failed.json`` (rank 0), unless the disk is full: then only the log says it."""
    if not distributed.is_main():
        return
    try:
        run_dir.record_failure(error, message, trace)
    except OSError as unwritten:
        log.error("could not record the failure in %s: %s", run_dir.failure_file, unwritten)


def _archive_other_evaluation(cfg: DictConfig, run_dir: RunDir, saved: DictConfig | None) -> None:
    """Move the run's own evaluation to ``RUN/evals/`` when it was made under other ``eval``
    settings than ``cfg``'s (``saved``, the config it was made with), so it is neither
    returned as this job's answer nor replaced."""
    if saved is None or run_dir.metrics() is None:
        return
    changed = differences(saved, cfg, of=evaluation_identity)
    if changed:
        target = archive_evaluation(run_dir, saved)
        log.info("evaluated before with %s: that evaluation moved to %s", changed[0], target)


def validation_scorer(settings: Settings) -> Scorer:
    """Training's validation BLEU (``trainer.valid_bleu``) as evaluation computes BLEU: greedy
    decoding with the run's ``eval`` decoding settings, detokenised, the sacreBLEU metrics of
    :data:`~posenc.config.metrics.VALIDATION_METRICS`."""
    decoding = dataclasses.replace(DecodeSettings.of(settings.eval), beam_size=1)

    def score(model, tokenizer, sources: list[list[int]], references: list[str]) -> dict:
        device = next(model.parameters()).device
        ids, _ = decode_sources(model, tokenizer, sources, decoding, device)
        hypotheses = tokenizer.decode_batch(ids)
        scores = corpus_scores(hypotheses, references, VALIDATION_METRICS)
        return scores | {"hypotheses": hypotheses}

    return score


def _train_and_evaluate(settings: Settings, run_dir: RunDir, start: Start) -> dict[str, Any] | None:
    """Train from ``start`` to the budget (at once when done), then evaluate unless the
    evaluation at the last step is there; returns the metrics (rank 0)."""
    done = finished_metrics(settings.trainer, run_dir)
    if done is not None:
        log.info("%s is already trained and evaluated; nothing to do", run_dir.path)
        return done if distributed.is_main() else None
    summary = train(settings, run_dir, start, scorer=validation_scorer(settings))
    if not distributed.is_main():
        return None
    metrics = run_dir.metrics()
    if metrics is not None and evaluated_after_training(metrics, summary):
        log.info("%s is already trained and evaluated; nothing to do", run_dir.path)
        return metrics
    if not settings.eval.enabled:
        return None
    metrics = evaluate(settings, run_dir)
    _log_hparams(settings, run_dir, metrics)
    first = next(iter(metrics["splits"].values()), {})
    log.info(
        "done: %s  BLEU %s  chrF %s  -> %s",
        settings.pe["name"],
        first.get("bleu"),
        first.get("chrf"),
        run_dir.path,
    )
    return metrics


def _log_hparams(settings: Settings, run_dir: RunDir, metrics: dict[str, Any]) -> None:
    """The run's session in TensorBoard's HParams tab (its settings, final scores and best
    validation loss); in a multirun, then the sweep's experiment summary at the sweep's root,
    rewritten from every session under it (:mod:`posenc.runtime.hparams`)."""
    from posenc.runtime.hparams import (
        hydra_sweep_root,
        sweeps_parent,
        write_all_sweeps_experiment,
        write_sweep_experiment,
    )

    train_info = metrics.get("train", {})
    values = {"hparam/valid_loss": train_info.get("best_valid_loss")}
    for split, scores in metrics["splits"].items():
        for metric in METRICS:
            values[f"hparam/{split}_{metric.name}"] = scores.get(metric.name)
    values = {k: float(v) for k, v in values.items() if v is not None}
    step = metrics["step"]
    run_dir.logger(resume_step=step, resume_seconds=1e12).hparams(
        reported_settings(settings.composed), values, step
    )
    root = hydra_sweep_root(run_dir.path)
    if root is not None:
        try:
            write_sweep_experiment(root)
            if (parent := sweeps_parent(root)) is not None:
                write_all_sweeps_experiment(parent)
        except OSError as err:  # the run is done; a full disk must not fail it here
            log.warning("TensorBoard's HParams summary of %s not written: %s", root, err)
