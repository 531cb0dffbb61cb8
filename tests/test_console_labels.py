"""In a sweep, every console line of a job names its run (jobs run side by side under
``hydra/launcher=parallel``); the run's own log file is left as it is."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from posenc.runtime.console import label_console


@pytest.fixture
def handlers(tmp_path: Path):
    root = logging.getLogger()
    console = logging.StreamHandler(io.StringIO())
    console.setFormatter(logging.Formatter("[%(levelname)s] - %(message)s"))
    log_file = logging.FileHandler(tmp_path / "train.log")
    log_file.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(console)
    root.addHandler(log_file)
    level = root.level
    root.setLevel(logging.INFO)
    yield console, log_file, tmp_path / "train.log"
    label_console(None)
    root.removeHandler(console)
    root.removeHandler(log_file)
    root.setLevel(level)
    log_file.close()


def test_a_sweep_job_labels_its_console_lines_and_not_its_log(handlers):
    console, log_file, path = handlers
    label_console("pe=rope,seed=1")
    logging.getLogger("posenc").info("step 3/400")
    label_console("pe=nonepe")  # the next job of a sequential sweep: replaced, not stacked
    logging.getLogger("posenc").info("step 4/400")
    label_console(None)  # a single run: no label
    logging.getLogger("posenc").info("done")
    log_file.flush()
    assert console.stream.getvalue().splitlines() == [
        "[INFO] - pe=rope,seed=1 | step 3/400",
        "[INFO] - pe=nonepe | step 4/400",
        "[INFO] - done",
    ]
    assert path.read_text().splitlines() == ["step 3/400", "step 4/400", "done"]
