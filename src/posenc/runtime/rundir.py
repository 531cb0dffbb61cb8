"""The run directory: where each of a run's files lives, and its one TensorBoard logger.

``RUN/config.yaml`` the resolved configuration; ``tokenizer/``; ``checkpoints/{last,previous,
best}.pt``; ``tb/`` TensorBoard events; ``train_summary.json``; ``metrics.json`` with the
hypothesis and reference files beside it; ``failed.json`` when the run ended in an error a user
can fix; ``evals/`` earlier and standalone evaluations. Files a reader may open at any moment are
written atomically (:mod:`posenc.runtime.files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.runtime.files import read_json, write_json
from posenc.runtime.sinks import ScalarSink
from posenc.runtime.tblog import RunLogger


class RunDir:
    """One run directory. ``logger()`` opens the run's TensorBoard writer once per process (and
    only then truncates events left beyond a resumed step); every later caller (training,
    evaluation, the HParams entry) shares it until :meth:`close`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._logger: RunLogger | None = None

    config = property(lambda self: self.path / "config.yaml")
    tokenizer = property(lambda self: self.path / "tokenizer")
    checkpoints = property(lambda self: self.path / "checkpoints")
    last = property(lambda self: self.checkpoints / "last.pt")
    best = property(lambda self: self.checkpoints / "best.pt")
    tb = property(lambda self: self.path / "tb")
    summary_file = property(lambda self: self.path / "train_summary.json")
    metrics_file = property(lambda self: self.path / "metrics.json")
    failure_file = property(lambda self: self.path / "failed.json")
    evals = property(lambda self: self.path / "evals")

    def summary(self) -> dict[str, Any] | None:
        """``train_summary.json``, or None when training has not finished."""
        return read_json(self.summary_file)

    def metrics(self) -> dict[str, Any] | None:
        """``metrics.json``, or None when the run is not evaluated."""
        return read_json(self.metrics_file)

    def record_failure(self, error: str, message: str) -> None:
        """``failed.json``: the error's type and its one-line message."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.failure_file, {"error": error, "message": message})

    def logger(
        self,
        resume_step: int = 0,
        resume_seconds: float = 0.0,
        sinks: list[ScalarSink] | None = None,
    ) -> RunLogger:
        """The run's TensorBoard logger; the first call in this process opens it (with
        ``sinks``, see :mod:`posenc.runtime.sinks`), keeping the events up to ``resume_step``
        and ``resume_seconds`` of training time."""
        if self._logger is None:
            self._logger = RunLogger(self.tb, resume_step, resume_seconds, sinks)
        return self._logger

    def close(self) -> None:
        """Flush and close the logger (a later :meth:`logger` call opens it again)."""
        if self._logger is not None:
            self._logger.close()
            self._logger = None


def as_run_dir(run_dir: Path | RunDir) -> RunDir:
    """``run_dir`` itself, or a :class:`RunDir` of a path."""
    return run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
