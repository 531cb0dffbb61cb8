"""Where a run's scalars go besides TensorBoard (``logger.*`` in ``configs/train.yaml``).

- ``logger.csv=true``: ``RUN/scalars.csv``, one row per scalar TensorBoard receives (``tag,
  step, value, wall_time``; ``time/...`` tags count whole seconds of training as their step), so
  curves can be read with any CSV reader. A resumed run first drops the rows after its checkpoint,
  as TensorBoard's events are truncated, so no step appears twice.
- ``logger.mlflow=true``: one MLflow run per training run in the experiment ``name``, at
  ``logger.mlflow_uri`` (a local directory works offline); the settings as parameters, every
  scalar as a metric. A resumed run continues its MLflow run (its id is kept in
  ``RUN/mlflow.json``); MLflow cannot delete values, so steps between the checkpoint and an
  interruption appear twice there (the later value is the one that continued).
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Any, Protocol

from posenc.config import LoggerConfig
from posenc.runtime.files import open_append, read_json, replacing, write_json

TIME_PREFIX = "time/"
CSV_FIELDS = ("tag", "step", "value", "wall_time")


class ScalarSink(Protocol):
    """Receives every scalar the run logs to TensorBoard."""

    def add(self, tag: str, value: float, step: int) -> None: ...

    def close(self) -> None: ...


def keeps(tag: str, step: int, resume_step: int, resume_seconds: int) -> bool:
    """Whether a scalar logged before a resume survives it (the rule TensorBoard's truncation
    follows: ``time/`` tags up to the checkpoint's second, the others up to its step)."""
    return step <= (resume_seconds if tag.startswith(TIME_PREFIX) else resume_step)


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


def open_sinks(
    settings: LoggerConfig,
    run_dir: Path,
    experiment: str,
    params: dict[str, Any],
    resume_step: int = 0,
    resume_seconds: float = 0.0,
) -> list[ScalarSink]:
    """The sinks ``settings`` (``logger.*``) switch on for the run in ``run_dir``."""
    sinks: list[ScalarSink] = []
    if settings.csv:
        sinks.append(CsvSink(run_dir / "scalars.csv", resume_step, int(resume_seconds)))
    if settings.mlflow:
        sinks.append(
            MlflowSink(
                settings.mlflow_uri, experiment, run_dir.name, params, run_dir / "mlflow.json"
            )
        )
    return sinks
