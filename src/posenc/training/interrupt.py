"""Stopping a run gracefully on Ctrl-C (SIGINT) or a cluster's pre-emption (SIGTERM).

While training, a signal only asks to stop: the loop finishes the step in progress, writes a
checkpoint when a step was taken since the last one, and ends with one line that names the
checkpoint and the command that resumes (:class:`TrainingInterrupted`, exit status 128 + the
signal's number, as a shell reports a killed command). A second Ctrl-C stops at once. Before
the first step (preparing the corpus, training the tokenizer, building the model) there is no
step to finish: a signal stops at once there (``KeyboardInterrupt``, or
:class:`~posenc.runtime.cli.Terminated` for SIGTERM), and the job says so in one line.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from posenc.runtime.cli import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training stopped on a signal; the message is the one line to show."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequests:
    """Remembers the first stop signal received while :meth:`installed` is active."""

    def __init__(self) -> None:
        self.signum: int | None = None
        #: whether a signal waits for the step in progress (True once training steps begin)
        self.deferring = False

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @contextmanager
    def installed(self) -> Iterator[StopRequests]:
        """Catch SIGINT and SIGTERM for the duration (only the main thread can); the handlers
        that were there before come back afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._receive)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _receive(self, signum: int, frame: FrameType | None) -> None:
        if not self.deferring:  # no step to finish: stop where the process is
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: stop now
        self.signum = self.signum or signum


def resume_command() -> str:
    """The command line this process was started with, ready to paste: running it again resumes
    the run from its last checkpoint (a sweep skips its finished runs)."""
    return shlex.join(["python", *sys.argv])
