"""The run directory: where each of a run's files lives, and its one TensorBoard logger.

``RUN/config.yaml`` the resolved configuration; ``tokenizer/``; ``checkpoints/{last,previous,
best}.pt``; ``tb/`` TensorBoard events (``scalars.csv`` too with ``logger.csv``);
``train_summary.json``; ``metrics.json`` with the hypothesis and reference files beside it;
``failed.json`` when the run ended in an error; ``evals/`` earlier and standalone evaluations,
each a folder of the same result files and its ``eval_config.yaml``; ``.lock`` while a process
trains there (:mod:`posenc.runtime.lock`). Code elsewhere names these files through
:class:`RunDir`. Files a reader may open at any moment are written atomically
(:mod:`posenc.runtime.files`).

A run directory's name (:func:`run_dir_name`) is its overrides and the digest of everything it
trains with, so runs that train different models never share one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc.config.identity import digest, training_identity
from posenc.runtime.files import write_json
from posenc.runtime.sinks import CSV_FILE, ScalarSink
from posenc.runtime.tblog import RunLogger
from posenc.runtime.untrusted import check_metrics, check_summary, read_json

#: an evaluation's result files, by what they hold (``{}``: the split, or ``split.VARIANT``)
HYPOTHESES, REFERENCES, LOSSES = "hypotheses.{}.txt", "references.{}.txt", "losses.{}.tsv"
METRICS_FILE = "metrics.json"
ATTENTION = "attention.{}"  #: its example attention map, ``npz`` and ``png``
#: the patterns of every file an evaluation writes (moved together when it is archived)
EVALUATION_FILES = tuple(
    name.format("*") for name in (METRICS_FILE, HYPOTHESES, REFERENCES, LOSSES, ATTENTION)
)


class RunDir:
    """One run directory (or one evaluation folder ``RUN/evals/NAME``, whose result files have
    the same names). ``logger()`` opens the run's TensorBoard writer once per process (and
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
    scalars = property(lambda self: self.path / CSV_FILE)
    eval_config = property(lambda self: self.path / "eval_config.yaml")  # an evaluation folder's
    summary_file = property(lambda self: self.path / "train_summary.json")
    metrics_file = property(lambda self: self.path / METRICS_FILE)
    failure_file = property(lambda self: self.path / "failed.json")
    evals = property(lambda self: self.path / "evals")
    #: the validation pairs' sentence losses at the best validation loss so far (training's,
    #: not an evaluation's: it stays when an evaluation is archived)
    valid_losses = property(lambda self: self.path / "valid_losses.tsv")

    def hypotheses(self, split: str) -> Path:
        """The detokenised translations of ``split`` (``split.VARIANT`` for a test-time
        variant), one a line."""
        return self.path / HYPOTHESES.format(split)

    def references(self, split: str) -> Path:
        """The references ``split`` was scored against, one a line."""
        return self.path / REFERENCES.format(split)

    def losses(self, split: str) -> Path:
        """The sentence losses of ``split`` (:mod:`posenc.runtime.sentence_losses`)."""
        return self.path / LOSSES.format(split)

    def attention(self, suffix: str) -> Path:
        """The example attention map's ``npz`` (the maps) or ``png`` (the figure)."""
        return self.path / ATTENTION.format(suffix)

    def summary(self) -> dict[str, Any] | None:
        """``train_summary.json``, or None when training has not finished (the file is missing).

        Raises:
            UntrustedFileError: the file is there but unreadable or not of posenc's types.
        """
        if not self.summary_file.exists():
            return None
        return check_summary(read_json(self.summary_file), self.summary_file)

    def metrics(self) -> dict[str, Any] | None:
        """``metrics.json``, or None when the run is not evaluated (the file is missing).

        Raises:
            UntrustedFileError: the file is there but unreadable or not of posenc's types.
        """
        if not self.metrics_file.exists():
            return None
        return check_metrics(read_json(self.metrics_file), self.metrics_file)

    def record_failure(self, error: str, message: str, trace: str | None = None) -> None:
        """``failed.json``: the error's type, its one-line message and, for an error nobody
        foresaw, its traceback."""
        self.path.mkdir(parents=True, exist_ok=True)
        failure = {"error": error, "message": message}
        if trace is not None:
            failure["traceback"] = trace
        write_json(self.failure_file, failure)

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


#: the longest run directory name in bytes (file systems refuse names over 255); a longer list of
#: overrides is cut, and the digest at the end keeps such runs apart
MAX_NAME_BYTES = 200


def check_run_name(name: Any) -> str:
    """``name`` when it can name a directory under ``outputs/runs/`` and ``outputs/sweeps/``.

    Raises:
        ValueError: one line: ``name`` is empty, has a path separator, is ``.``/``..``, has
            control characters or is too long.
    """
    text = str(name)
    if (
        not text
        or text in (".", "..")
        or "/" in text
        or any(ord(c) < 32 for c in text)
        or len(text.encode()) > MAX_NAME_BYTES // 2
    ):
        raise ValueError(
            f"name={text!r} cannot name a directory under outputs/: use letters, digits, '-', '_' "
            f"and '.' (no '/' or '..', at most {MAX_NAME_BYTES // 2} bytes)"
        )
    return text


def run_dir_name(overrides: str, config: Mapping[str, Any]) -> str:
    """A run's directory name: its command-line overrides (Hydra's ``override_dirname``, or
    ``default``), path separators escaped as ``%2F`` and cut to fit, then ``@`` and the
    :func:`digest` of its :func:`training_identity`: runs that train different models never share
    a directory, whatever the overrides spell (a setting left out of them, a changed default),
    and a rerun with a raised budget finds its own."""
    readable = (overrides or "default").replace("%", "%25").replace("/", "%2F")
    readable = "".join(c if ord(c) >= 32 else "_" for c in readable)
    return cut_name(readable, "@" + digest(training_identity(config)))


def cut_name(readable: str, suffix: str) -> str:
    """``readable + suffix`` within :data:`MAX_NAME_BYTES`; a longer ``readable`` is cut and
    marked ``+more`` and, when ``suffix`` is empty, the digest of the whole name follows it so
    that names cut alike stay apart."""
    if len(readable.encode()) + len(suffix) <= MAX_NAME_BYTES:
        return readable + suffix
    suffix = suffix or "@" + digest({"name": readable})
    room = MAX_NAME_BYTES - len(suffix) - len("+more")
    return readable.encode()[:room].decode(errors="ignore") + "+more" + suffix


def find_run_dirs(sweep: Path, out: Path) -> list[Path]:
    """Directories under ``sweep`` (itself included) with a ``config.yaml``, sorted, except
    Hydra's hidden ``.hydra/`` copies, standalone evaluations (``evals/``) and the report's own
    directory ``out``."""
    found = []
    for config in sorted(sweep.rglob("config.yaml")):
        parts = config.parent.relative_to(sweep).parts
        if any(p.startswith(".") or p == "evals" for p in parts) or out in config.parents:
            continue
        found.append(config.parent)
    return found
