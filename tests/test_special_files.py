"""A FIFO or device planted in a run directory under a name posenc reads (a TensorBoard event
file, a checkpoint, a hypotheses file) is refused or left out at once, never waited on: a
resumed training, translate and evaluate, the HParams summary and the report all go on or stop
with one line."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from posenc.analysis.report.runs import _event_points
from posenc.analysis.report.stats import read_lines
from posenc.runtime.checkpoint import CheckpointError, load, saved_state
from posenc.runtime.hparams import _event_files
from posenc.runtime.tblog import truncate_events
from posenc.runtime.untrusted import UntrustedFileError, is_special

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail the test instead of hanging when the block has not ended after ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_a_fifo_is_special_and_a_file_or_folder_is_not(tmp_path):
    (tmp_path / "file").write_text("x")
    assert is_special(fifo(tmp_path / "pipe"))
    assert not is_special(tmp_path / "file") and not is_special(tmp_path)
    assert not is_special(tmp_path / "absent")
    assert is_special(Path("/dev/null"))


def test_a_resumed_training_refuses_a_fifo_named_like_an_event_file(tmp_path):
    planted = fifo(tmp_path / "tb" / "events.out.tfevents.1.host.1.0")
    with within(10), pytest.raises(UntrustedFileError, match="not a regular file") as caught:
        truncate_events(tmp_path / "tb", 100, 100)
    assert str(planted) in str(caught.value) and "\n" not in str(caught.value)


def test_a_fifo_checkpoint_is_refused_by_name(tmp_path):
    planted = fifo(tmp_path / "checkpoints" / "best.pt")
    with within(10):
        with pytest.raises(CheckpointError, match="not a regular file"):
            load(planted)
        assert saved_state(planted) is None


def test_the_report_and_the_hparams_summary_leave_a_fifo_event_file_out(tmp_path):
    planted = fifo(tmp_path / "run" / "tb" / "events.out.tfevents.1.host.1.0")
    with within(10):
        assert _event_points(planted.parent) == {}
        assert list(_event_files(tmp_path)) == []


def test_a_fifo_hypotheses_file_leaves_its_run_out_with_a_warning(tmp_path, caplog):
    planted = fifo(tmp_path / "hypotheses.test.txt")
    with within(10), caplog.at_level(logging.WARNING):
        assert read_lines(planted) is None
    assert "not a regular file" in caplog.text and str(planted) in caplog.text
