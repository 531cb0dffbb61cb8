"""Where a run's scalars go besides TensorBoard (``logger.*`` in ``configs/train.yaml``).

- ``logger.csv=true``: ``RUN/scalars.csv``, one row per scalar TensorBoard receives (``tag, step,
  value, wall_time``; ``vs_train_seconds/...`` tags count whole seconds of training as their step),
  so curves can be read with any CSV reader. A resumed run first drops the rows after its
  checkpoint, as TensorBoard's events are truncated, so no step appears twice.
- ``logger.mlflow=true``: one MLflow run per training run in the experiment ``name``, at
  ``logger.mlflow_uri`` (a local directory works offline); the settings as parameters, every
  scalar as a metric. A resumed run continues its MLflow run (its id is kept in
  ``RUN/mlflow.json``); MLflow cannot delete values, so steps between the checkpoint and an
  interruption appear twice there (the later value is the one that continued).
- ``logger.wandb=true``: one Weights & Biases run per training run in the project
  ``logger.wandb_project`` (default: ``name``), offline unless ``logger.wandb_mode=online``
  (``wandb sync`` uploads an offline run later). W&B's files go where W&B puts them, ``wandb/``
  in the working directory or ``WANDB_DIR``, never into the run directory (W&B links its core's
  debug log there from its cache: a link leading out, which posenc refuses). The settings are its
  config; every scalar goes into its history with its step under ``global_step``
  (``train_seconds`` for ``vs_train_seconds/`` tags), the x-axis each tag is plotted against. A
  resumed run continues its W&B run (its id is kept in ``RUN/wandb.json`` and passed with
  ``resume="allow"``); as with MLflow, steps logged again after a resume appear twice.
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import socket
import string
import time
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from posenc.config import LoggerConfig
from posenc.runtime.files import open_append, read_json, replacing, write_json

#: the group of the curves whose step is whole seconds of training time, named so that the unit
#: shows where TensorBoard labels the x axis "Step" (and its cards follow the loss curves)
TIME_PREFIX = "vs_train_seconds/"
#: the same group as runs logged it before it was renamed; read as seconds too
LEGACY_TIME_PREFIX = "time/"

#: the CSV sink's file in the run directory (``logger.csv``)
CSV_FILE = "scalars.csv"


def is_time_tag(tag: str) -> bool:
    """Whether ``tag``'s step counts whole seconds of training (:data:`TIME_PREFIX`, or the
    :data:`LEGACY_TIME_PREFIX` of older runs) rather than optimizer steps."""
    return tag.startswith((TIME_PREFIX, LEGACY_TIME_PREFIX))


CSV_FIELDS = ("tag", "step", "value", "wall_time")
#: the W&B history keys holding a scalar's step: training steps, and seconds for ``time/`` tags
WANDB_STEP, WANDB_SECONDS = "global_step", "train_seconds"
#: a W&B run id as posenc makes them (and W&B does): lowercase letters and digits
WANDB_ID = re.compile(r"[0-9a-z]{8,64}")


class ScalarSink(Protocol):
    """Receives every scalar the run logs to TensorBoard."""

    def add(self, tag: str, value: float, step: int) -> None: ...

    def close(self) -> None: ...


def keeps(tag: str, step: int, resume_step: int, resume_seconds: int) -> bool:
    """Whether a scalar logged before a resume survives it (the rule TensorBoard's truncation
    follows: seconds tags up to the checkpoint's second, the others up to its step)."""
    return step <= (resume_seconds if is_time_tag(tag) else resume_step)


class CsvSink:
    """``RUN/scalars.csv``, appended to and flushed at every row."""

    def __init__(self, path: Path, resume_step: int = 0, resume_seconds: int = 0) -> None:
        self.path = path
        kept = self._rows_to_keep(resume_step, resume_seconds)
        if kept is not None:
            with replacing(path, "w") as handle:
                writer = csv.writer(handle)
                writer.writerow(CSV_FIELDS)
                writer.writerows(kept)
        self._handle = open_append(path)
        self._writer = csv.writer(self._handle)
        if kept is None:
            self._writer.writerow(CSV_FIELDS)

    def _rows_to_keep(self, resume_step: int, resume_seconds: int) -> list[list[str]] | None:
        """The rows of an existing file logged up to the checkpoint; None when there is none."""
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return None
        with self.path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))[1:]
        return [
            row
            for row in rows
            if len(row) == len(CSV_FIELDS)  # a row cut short by a kill is dropped
            and resume_step > 0
            and keeps(row[0], int(row[1]), resume_step, resume_seconds)
        ]

    def add(self, tag: str, value: float, step: int) -> None:
        self._writer.writerow([tag, step, repr(float(value)), f"{time.time():.3f}"])
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


#: seconds a tracking server has to accept a connection before the run stops
CONNECT_SECONDS = 5.0


def check_reachable(uri: str) -> None:
    """Raise ValueError (one line naming ``uri``) when an ``http(s)://`` tracking server does
    not accept a connection within :data:`CONNECT_SECONDS`: MLflow's client would retry for
    minutes before the first step. Other URIs (a directory, a database) are left to MLflow."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_SECONDS).close()
    except OSError as err:
        raise ValueError(
            f"logger.mlflow_uri={uri} cannot be reached ({err.strerror or err}); start the "
            "tracking server, use a local directory, or set logger.mlflow=false"
        ) from None


class MlflowSink:
    """One MLflow run, through ``MlflowClient`` (no global MLflow state: a Hydra multirun runs
    its jobs in one process)."""

    def __init__(
        self, uri: str, experiment: str, run_name: str, params: dict[str, Any], id_file: Path
    ) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise ValueError(
                "logger.mlflow=true needs MLflow: pip install mlflow (or set logger.mlflow=false)"
            ) from err
        if "://" not in uri:  # a local directory: MLflow's file store, opted into (MLflow 3
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # wants a database URI)
        check_reachable(uri)
        self.client = MlflowClient(tracking_uri=uri)
        known = read_json(id_file) or {}
        if known.get("tracking_uri") == uri and known.get("run_id"):
            self.run_id = known["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.client.log_batch(
            self.run_id, params=[Param(key, str(value)[:6000]) for key, value in params.items()]
        )
        write_json(id_file, {"tracking_uri": uri, "run_id": self.run_id})

    def add(self, tag: str, value: float, step: int) -> None:
        self.client.log_metric(self.run_id, tag, float(value), step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def wandb_run_id(id_file: Path) -> str:
    """The W&B run id of a run directory: the one ``id_file`` keeps, or a new one written there
    before W&B hears of it (so a run whose first ``wandb.init`` failed still gets no second id).

    Raises:
        ValueError: one line when ``id_file`` exists but holds no valid id.
    """
    if id_file.exists():
        run_id = (read_json(id_file) or {}).get("run_id")
        if not isinstance(run_id, str) or not WANDB_ID.fullmatch(run_id):
            raise ValueError(
                f"{id_file} holds no valid W&B run id; delete it to start a new W&B run"
            )
        return run_id
    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    write_json(id_file, {"run_id": run_id})
    return run_id


class WandbSink:
    """One W&B run, through its own run object (``reinit="create_new"``: the jobs of a Hydra
    multirun in one process never share W&B's global run). The scalars of one step go into one
    history row with that step under :data:`WANDB_STEP` (:data:`WANDB_SECONDS` for seconds tags,
    :func:`is_time_tag`), which ``define_metric`` makes each tag's x-axis; W&B's own ``_step`` only
    counts rows, so steps logged again after a resume are kept, never dropped as out of order."""

    def __init__(
        self,
        project: str,
        mode: str,
        run_name: str,
        params: dict[str, Any],
        id_file: Path,
    ) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ValueError(
                "logger.wandb=true needs W&B: pip install -e '.[wandb]' (or set logger.wandb=false)"
            ) from err
        run_id = wandb_run_id(id_file)
        if mode == "offline":  # nothing leaves the machine: no crash reports to W&B either
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            self.run = wandb.init(
                project=project,
                name=run_name,
                id=run_id,
                resume="allow",
                mode=mode,
                config=params,
                allow_val_change=True,  # a continued run may report a larger budget
                reinit="create_new",
                settings=wandb.Settings(console="off"),  # train.log has the console
            )
        except wandb.Error as err:
            message = (str(err).splitlines() or [type(err).__name__])[0]
            raise ValueError(f"W&B could not start run {run_id} of {project}: {message}") from err
        for key in (WANDB_STEP, WANDB_SECONDS):
            self.run.define_metric(key, hidden=True)
        self._defined: set[str] = set()
        self._row: dict[str, float] = {}
        self._at: tuple[str, int] = (WANDB_STEP, -1)

    def add(self, tag: str, value: float, step: int) -> None:
        key = WANDB_SECONDS if is_time_tag(tag) else WANDB_STEP
        if tag not in self._defined:
            self.run.define_metric(tag, step_metric=key)
            self._defined.add(tag)
        if self._at != (key, step) or tag in self._row:
            self._flush()
            self._at = (key, step)
        self._row[tag] = float(value)

    def _flush(self) -> None:
        """Log the row of the scalars gathered at one step."""
        if self._row:
            key, step = self._at
            self.run.log({**self._row, key: step})
            self._row = {}

    def close(self) -> None:
        """Finish the run and end W&B's service process, which writes the run's files and may
        still be writing after ``run.finish()`` returns (W&B 0.31: an offline run's file was left
        with its header alone); ``wandb.teardown()`` waits for it, so the files are complete
        here, not only at the process's exit (which a joblib worker may never reach cleanly)."""
        import wandb

        self._flush()
        self.run.finish()
        wandb.teardown()


def open_sinks(
    settings: LoggerConfig,
    run_dir: Path,
    experiment: str,
    params: dict[str, Any],
    resume_step: int = 0,
    resume_seconds: float = 0.0,
) -> list[ScalarSink]:
    """The sinks ``settings`` (``logger.*``) switch on for the run in ``run_dir``; when one
    cannot open (a missing package: one line naming the fix), those already open are closed."""
    sinks: list[ScalarSink] = []
    try:
        if settings.csv:
            sinks.append(CsvSink(run_dir / CSV_FILE, resume_step, int(resume_seconds)))
        if settings.mlflow:
            sinks.append(
                MlflowSink(
                    settings.mlflow_uri, experiment, run_dir.name, params, run_dir / "mlflow.json"
                )
            )
        if settings.wandb:
            sinks.append(
                WandbSink(
                    settings.wandb_project or experiment,
                    settings.wandb_mode,
                    run_dir.name,
                    params,
                    run_dir / "wandb.json",
                )
            )
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
