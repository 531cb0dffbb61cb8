"""What a training run reports and how it ends: ``train.log`` lines every ``log_every`` steps
(loss, NLL, perplexity, gradient norm, learning rate, speed) and at every validation; Ctrl-C and
SIGTERM stop after the step in progress with a checkpoint and one line; a full disk ends in one
line with the last good checkpoint kept; early stopping on validation loss; scalars in CSV."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, SMOKE, compose
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_faults import logged_steps, saved_step, wait_for

from posenc.config.settings import Settings
from posenc.job import run
from posenc.runtime import checkpoint
from posenc.runtime.cli import Terminated
from posenc.runtime.sinks import CsvSink
from posenc.training.interrupt import StopRequests

OVERRIDES = (*SMOKE, "pe=nonepe", "eval.enabled=false")


def scalars(run_dir: Path, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def log_text(run_dir: Path) -> str:
    log = run_dir / "train.log"
    return log.read_text() if log.exists() else ""


def train_py(run_dir: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python train.py ...`` writing to ``run_dir``, its console captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- train.log -------------------------------------------------------------------------------


def test_train_log_holds_every_report_and_validation_and_no_progress_bar(tmp_path):
    run_dir = tmp_path / "run"
    done = train_py(
        run_dir,
        *OVERRIDES,
        "trainer.max_steps=10",
        "trainer.log_every=5",
        "trainer.valid_every=5",
        "trainer.progress=true",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    log = (run_dir / "train.log").read_text()
    reports = re.findall(
        r"step (\d+)/10 \| loss ([\d.]+) \| nll ([\d.]+) \| ppl ([\d.]+) \| gnorm ([\d.]+) "
        r"\| lr ([\d.e+-]+) \| ([\d,]+) tok/s",
        log,
    )
    assert [int(r[0]) for r in reports] == [5, 10]
    assert re.findall(r"step (\d+): valid loss [\d.]+", log) == ["5", "10"]
    assert "\r" not in log and "it/s" not in log  # the progress bar stays on the console
    nll, ppl = scalars(run_dir, "train/nll"), scalars(run_dir, "train/ppl")
    assert sorted(nll) == [5, 10] and sorted(scalars(run_dir, "train/grad_norm")) == [5, 10]
    for step in (5, 10):
        assert ppl[step] == pytest.approx(math.exp(nll[step]), rel=1e-5)
    for step, *values in reports:  # the log line shows what TensorBoard holds
        assert float(values[1]) == pytest.approx(nll[int(step)], abs=1e-4)


# --- Ctrl-C and SIGTERM ----------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_after_the_step_with_a_checkpoint_and_one_line(tmp_path, signum):
    overrides = (
        *OVERRIDES,
        "trainer.max_steps=400",
        "trainer.log_every=1",
        "trainer.valid_every=1000",  # no checkpoint until the signal
    )
    run_dir = tmp_path / "run"
    output = tmp_path / "console.txt"
    with output.open("w") as console:
        job = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
            cwd=tmp_path,
            stdout=console,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: "step 3/400 |" in log_text(run_dir), job)
        job.send_signal(signum)
        job.wait(timeout=120)
    assert job.returncode == 128 + signum
    text = output.read_text()
    assert "Traceback" not in text
    (line,) = [line for line in text.splitlines() if "interrupted by" in line]
    step = saved_step(run_dir / "checkpoints" / "last.pt")
    assert f"interrupted by {signal.Signals(signum).name} at step {step}: checkpoint saved" in line
    assert "resume with: python" in line and "pe=nonepe" in line
    assert not (run_dir / "failed.json").exists()

    run(compose(*overrides), run_dir)  # the same command resumes: every step logged once
    assert logged_steps(run_dir) == list(range(1, 401))


def test_while_steps_run_the_first_signal_asks_and_a_second_ctrl_c_stops_at_once():
    """Before the first step there is nothing to finish: a signal stops at once."""
    stop = StopRequests()
    before = signal.getsignal(signal.SIGINT)
    with stop.installed(), pytest.raises(Terminated):
        os.kill(os.getpid(), signal.SIGTERM)
    stop.deferring = True  # the training steps have begun
    with stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGTERM  # the first signal is the one reported
    assert signal.getsignal(signal.SIGINT) is before
    with stop.installed(), pytest.raises(KeyboardInterrupt):
        stop.signum = None
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)


# --- a full disk -----------------------------------------------------------------------------

FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes beyond the limit fail (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
"""


def test_a_checkpoint_that_cannot_be_written_names_the_file_and_keeps_the_last_good(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save_atomic({"model": torch.zeros(10)}, path)
    script = FILE_SIZE_LIMIT.format(limit=200_000) + textwrap.dedent(f"""
        import torch
        from pathlib import Path
        from posenc.runtime.checkpoint import CheckpointError, save_atomic
        try:
            save_atomic({{"model": torch.zeros(1_000_000)}}, Path({str(path)!r}))
        except CheckpointError as err:
            print(err)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (message,) = done.stdout.splitlines()
    assert message.startswith(f"could not write checkpoint {path}:")
    assert "it needs about 4.0 MB" in message
    assert f"the last good checkpoint {path} is kept" in message
    assert torch.load(path, weights_only=True)["model"].shape == (10,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary file left


def test_a_full_disk_says_so(tmp_path, monkeypatch):
    def no_space(obj, handle):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", no_space)
    monkeypatch.setattr(
        checkpoint.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0)
    )
    with pytest.raises(checkpoint.CheckpointError, match="the disk is full"):
        checkpoint.save_atomic({"model": torch.zeros(1000)}, tmp_path / "last.pt")


def test_a_run_on_a_full_disk_ends_in_one_line_and_failed_json(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*OVERRIDES, "trainer.max_steps=4", "trainer.valid_every=2")
    first = train_py(run_dir, *overrides, "trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    size = (run_dir / "checkpoints" / "last.pt").stat().st_size
    wrapper = FILE_SIZE_LIMIT.format(limit=size // 2) + textwrap.dedent(f"""
        import runpy
        sys.argv = [{str(ROOT / "train.py")!r}, *sys.argv[1:]]
        runpy.run_path(sys.argv[0], run_name="__main__")
        """)
    done = subprocess.run(
        [sys.executable, "-c", wrapper, *overrides, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    console = done.stdout + done.stderr
    assert "Traceback" not in console
    (line,) = [line for line in console.splitlines() if "could not write checkpoint" in line]
    assert "last.pt" in line and "is kept" in line
    recorded = json.loads((run_dir / "failed.json").read_text())["message"]
    assert recorded.startswith("could not write checkpoint")
    assert saved_step(run_dir / "checkpoints" / "last.pt") == 2  # the last good one


# --- early stopping --------------------------------------------------------------------------


def test_early_stopping_ends_after_patience_validations_without_improvement(tmp_path):
    # lr 0: the validation loss never improves on the first one
    overrides = (*OVERRIDES, "trainer.lr=0", "trainer.max_steps=30", "trainer.valid_every=2")
    run_dir = tmp_path / "run"
    summary = run(compose(*overrides, "trainer.patience=2"), run_dir)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["stopped_early"]  # validations at 2 (best), 4, 6
    run(compose(*overrides, "trainer.patience=2"), run_dir)  # the same command: nothing to do
    assert json.loads((run_dir / "train_summary.json").read_text())["steps"] == 6
    run(compose(*overrides, "trainer.patience=4"), run_dir)  # more patience: it goes on
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 10 and summary["stopped_early"]


def test_a_run_evaluated_at_an_earlier_best_checkpoint_is_done_when_run_again(tmp_path, caplog):
    # lr 0: the first validation (step 2) stays the best, so evaluation scores step 2 of 6
    overrides = (
        *SMOKE,
        "pe=nonepe",
        "trainer.lr=0",
        "trainer.max_steps=6",
        "trainer.valid_every=2",
        "eval.checkpoint=best",
    )
    run_dir = tmp_path / "run"
    first = run(compose(*overrides), run_dir)
    assert first["step"] == 2 and first["train"]["steps"] == 6
    caplog.set_level("INFO", logger="posenc")
    assert run(compose(*overrides), run_dir) == first  # not decoded again (its times would differ)
    assert "already trained and evaluated; nothing to do" in caplog.text


def test_without_patience_training_runs_to_the_budget(tmp_path):
    overrides = (*OVERRIDES, "trainer.lr=0", "trainer.max_steps=8", "trainer.valid_every=2")
    run(compose(*overrides), tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 8 and not summary["stopped_early"]


# --- CSV -------------------------------------------------------------------------------------


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_csv_logger_holds_what_tensorboard_holds(tmp_path):
    run_dir = tmp_path / "run"
    overrides = (*OVERRIDES, "trainer.max_steps=10", "trainer.log_every=5", "logger.csv=true")
    run(compose(*overrides), run_dir)
    rows = csv_rows(run_dir / "scalars.csv")
    for tag in (
        "train/loss",
        "train/nll",
        "train/grad_norm",
        "valid/loss",
        "vs_train_seconds/train_loss",
    ):
        logged = {int(r["step"]): float(r["value"]) for r in rows if r["tag"] == tag}
        assert logged == pytest.approx(scalars(run_dir, tag)), tag


def test_a_resumed_csv_drops_the_rows_after_the_checkpoint(tmp_path):
    path = tmp_path / "scalars.csv"
    sink = CsvSink(path)
    for step in range(1, 11):
        sink.add("train/loss", 1.0 / step, step)
        sink.add("vs_train_seconds/train_loss", 1.0 / step, step * 2)
    sink.close()
    with path.open("a") as handle:
        handle.write("train/loss,11")  # a row cut short by a kill
    CsvSink(path, resume_step=4, resume_seconds=5).close()
    rows = csv_rows(path)
    assert [int(r["step"]) for r in rows if r["tag"] == "train/loss"] == [1, 2, 3, 4]
    assert [int(r["step"]) for r in rows if r["tag"] == "vs_train_seconds/train_loss"] == [2, 4]


# --- MLflow ----------------------------------------------------------------------------------


def test_an_unreachable_tracking_server_stops_the_run_in_seconds_in_one_line(tmp_path):
    """MLflow's client retried for 252 s before the first step; nothing listens on port 1."""
    pytest.importorskip("mlflow")
    from posenc.runtime.sinks import MlflowSink

    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        MlflowSink("http://127.0.0.1:1", "exp", "run", {}, tmp_path / "mlflow.json")
    message = str(refused.value)
    assert "logger.mlflow_uri=http://127.0.0.1:1 cannot be reached" in message
    assert "\n" not in message and time.monotonic() - started < 10
    assert not (tmp_path / "mlflow.json").exists()


def test_mlflow_gets_the_settings_and_every_scalar_in_a_local_store(tmp_path):
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    run_dir = tmp_path / "run"
    overrides = (
        *OVERRIDES,
        "trainer.max_steps=10",
        "trainer.log_every=5",
        "logger.mlflow=true",
        f"logger.mlflow_uri={store}",
    )
    run(compose(*overrides), run_dir)
    client = MlflowClient(tracking_uri=str(store))
    experiment = client.get_experiment_by_name("smoke")
    (logged,) = client.search_runs([experiment.experiment_id])
    assert logged.info.run_name == "run" and logged.info.status == "FINISHED"
    assert logged.data.params["pe.name"] == "nonepe"
    assert "logger.mlflow_uri" not in logged.data.params and "data.dir" not in logged.data.params
    history = client.get_metric_history(logged.info.run_id, "train/loss")
    assert {m.step: m.value for m in history} == pytest.approx(scalars(run_dir, "train/loss"))

    run(compose(*overrides, "trainer.max_steps=15"), run_dir)  # continued: the same MLflow run
    (continued,) = client.search_runs([experiment.experiment_id])
    assert continued.info.run_id == logged.info.run_id
    steps = [m.step for m in client.get_metric_history(logged.info.run_id, "train/loss")]
    assert sorted(steps) == [5, 10, 15]


def test_what_set_up_builds_stays_as_built_and_only_the_step_state_changes(tmp_path):
    from dataclasses import FrozenInstanceError

    from posenc.runtime.rundir import RunDir
    from posenc.training.setup import set_up

    training = set_up(Settings.of(compose(*OVERRIDES)), RunDir(tmp_path / "run"), start=None)
    with pytest.raises(FrozenInstanceError):
        training.model = torch.nn.Linear(1, 1)
    assert training.steps.saved_step == training.state.step == 0
    training.steps.skipped_in_a_row += 1  # the bookkeeping of the steps is the mutable part
    training.progress.close()
    training.logger.close()
