"""TensorBoard logging of a run: curves against steps and against training seconds.

Tags under ``vs_train_seconds/`` use whole seconds of training time (evaluation excluded) as their
step, so loss-vs-time curves of different encodings compare directly. A resumed run first truncates
the event files to the checkpoint (steps after it, seconds after it), so no step is logged twice.
"""

from __future__ import annotations

import time
from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter
from torch.utils.tensorboard import SummaryWriter

from posenc.runtime.files import replacing
from posenc.runtime.hparams import session_summaries
from posenc.runtime.sinks import TIME_PREFIX, ScalarSink, keeps
from posenc.runtime.untrusted import UntrustedFileError, is_special

RECORD_OVERHEAD = 16  # bytes of a TFRecord around its data: length, its CRC, the data's CRC


def truncate_events(log_dir: Path, max_step: int, max_seconds: int) -> int:
    """Drop events logged after ``max_step`` (step tags) or ``max_seconds`` (seconds tags).

    An event file with something to drop, or with a record cut short by a kill at its end, is
    rewritten to a temporary file and renamed over the original (a truncation killed half-way
    leaves a temporary file, deleted here the next time); the others are only read. Returns how
    many scalar events were dropped. A FIFO or device named like an event file is refused
    (:class:`~posenc.runtime.untrusted.UntrustedFileError`), not opened.
    """
    for stale in log_dir.glob(".events.out.tfevents.*.tmp"):
        stale.unlink(missing_ok=True)
    dropped = 0
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        if is_special(path):
            raise UntrustedFileError(
                path, "it is not a regular file (a FIFO, socket or device)", "remove it"
            )
        kept: list[bytes] = []
        read = 0  # bytes of the whole records read
        for raw in RawEventFileLoader(str(path)).Load():
            read += len(raw) + RECORD_OVERHEAD
            event = event_pb2.Event.FromString(raw)
            tags = [v.tag for v in event.summary.value]
            if tags and not keeps(tags[0], event.step, max_step, max_seconds):
                dropped += 1
                continue
            kept.append(raw)
        if len(kept) * RECORD_OVERHEAD + sum(map(len, kept)) == read == path.stat().st_size:
            continue  # nothing dropped, no partial record at the end: leave the file alone
        with replacing(path, "wb") as handle:
            writer = RecordWriter(handle)
            for raw in kept:
                writer.write(raw)
            writer.flush()
    return dropped


def _file_second(path: Path) -> int:
    """The whole second in an event file's name (``events.out.tfevents.SECOND.host.pid.n``)."""
    try:
        return int(path.name.split(".")[3])
    except (IndexError, ValueError):
        return 0


def wait_for_a_later_second(log_dir: Path) -> None:
    """Return once the clock is past the second in every event file name in ``log_dir``.

    TensorBoard reads a directory's event files in name order and names start with the whole
    second the writer opened. A writer opened in the same second as an earlier one is ordered by
    process id instead, so a run resumed within a second of its start could be read before the
    steps it continues (at most a one-second wait, and only then).
    """
    latest = max((_file_second(p) for p in log_dir.glob("events.out.tfevents.*")), default=0)
    while int(time.time()) <= latest:
        time.sleep(0.05)


class RunLogger:
    """The TensorBoard writer of one run directory (``RUN/tb``); every scalar also goes to
    ``sinks`` (:mod:`posenc.runtime.sinks`: CSV, MLflow), which the logger closes."""

    def __init__(
        self,
        log_dir: Path,
        resume_step: int = 0,
        resume_seconds: float = 0.0,
        sinks: list[ScalarSink] | None = None,
    ) -> None:
        self.sinks = sinks or []
        log_dir.mkdir(parents=True, exist_ok=True)
        truncate_events(log_dir, resume_step, int(resume_seconds))
        wait_for_a_later_second(log_dir)
        self.writer = SummaryWriter(log_dir=str(log_dir))
        # seconds already logged before a resume (kept by the truncation); -1 for a new run
        done = int(resume_seconds) if resume_step > 0 else -1
        self._last_second = {"train_loss": done, "valid_loss": done}
        self._pending: dict[str, tuple[float, float]] = {}  # name -> (weighted sum, weights)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``values`` (tag -> value) at training ``step``."""
        for tag, value in values.items():
            self.add(tag, value, step)

    def add(self, tag: str, value: float, step: int) -> None:
        """One scalar, to TensorBoard and every sink."""
        self.writer.add_scalar(tag, value, step)
        for sink in self.sinks:
            sink.add(tag, value, step)

    def against_time(self, name: str, value: float, seconds: float, weight: float = 1.0) -> None:
        """Log ``vs_train_seconds/NAME`` at whole training seconds, at most once a second each:
        the ``weight``-weighted mean of every value given since the previous point (a step's
        loss weighted by its tokens), not the value that happens to cross into a new second,
        which is one step's loss, picked more often the longer its step took. A value given
        within the second of the previous point waits for the next one; a resumed run starts
        its mean afresh."""
        total, weights = self._pending.get(name, (0.0, 0.0))
        total += value * weight
        weights += weight
        second = int(seconds)
        if second > self._last_second.get(name, -1):
            self.add(TIME_PREFIX + name, total / weights, second)
            self._last_second[name] = second
            total = weights = 0.0
        self._pending[name] = (total, weights)

    def image(self, tag: str, image, step: int) -> None:
        """An ``(H, W, 3)`` uint8 array or figure rendered elsewhere."""
        self.writer.add_image(tag, image, step, dataformats="HWC")

    def hparams(self, params: dict, metrics: dict[str, float], step: int) -> None:
        """This run's session in the HParams tab, in its own event file: its settings
        ``params`` (session start and end) and its final ``metrics`` (``hparam/*`` scalars at
        ``step``). No experiment summary: a sweep's is written at its root
        (:mod:`posenc.runtime.hparams`). Flushed, so that summary can read this session."""
        file_writer = self.writer._get_file_writer()
        for summary in session_summaries(params):
            file_writer.add_summary(summary, step)
        for tag, value in metrics.items():
            self.add(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
        for sink in self.sinks:
            sink.close()
