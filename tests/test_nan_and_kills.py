"""What a run directory holds stays trustworthy when training diverges or is killed: a run whose
loss stays NaN stops instead of skipping batches forever, a NaN never becomes a checkpoint and
the advice names a finite one, ``best.pt`` and ``last.pt`` agree after a kill at any point, and
one process at a time holds a run directory (:mod:`posenc.runtime.lock`)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import SMOKE, compose, tiny_model

from posenc.config import paste
from posenc.config.settings import Settings
from posenc.job import run
from posenc.model.factory import checkpoint_path, load_run_model
from posenc.runtime import checkpoint
from posenc.runtime.lock import RunLockedError, run_lock
from posenc.runtime.rundir import RunDir
from posenc.training import advice
from posenc.training import loop as train_module
from posenc.training import validation as validation_module
from posenc.training.start import TrainState

OVERRIDES = (*SMOKE, "pe=nonepe", "trainer.valid_every=2", "eval.enabled=false")
NAN = float("nan")


def failure(run_dir: Path) -> str:
    return json.loads((run_dir / "failed.json").read_text())["message"]


def saved_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["state"]["step"]


def nan_training_losses(monkeypatch, is_nan, give_up_after: int = 60) -> None:
    """The training loss of the n-th batch (from 1) is NaN where ``is_nan(n)``; a run that
    asks for more than ``give_up_after`` batches fails the test instead of running forever."""
    real_loss = train_module.summed_losses
    batches = iter(range(1, give_up_after + 1))

    def loss(*args, **kwargs):
        value, nll = real_loss(*args, **kwargs)
        batch = next(batches, None)
        assert batch is not None, f"still training after {give_up_after} batches"
        return (value * NAN if is_nan(batch) else value), nll

    monkeypatch.setattr(train_module, "summed_losses", loss)


def nan_gradients(monkeypatch, is_nan) -> None:
    """The training loss of the n-th batch (from 1) stays finite, but the gradient flowing back
    from it is NaN where ``is_nan(n)``: a kernel's backward gone wrong."""
    real_loss = train_module.summed_losses
    batches = iter(range(1, 61))

    def loss(*args, **kwargs):
        value, nll = real_loss(*args, **kwargs)
        if torch.is_grad_enabled() and is_nan(next(batches)):
            value.register_hook(lambda grad: grad * NAN)
        return value, nll

    monkeypatch.setattr(train_module, "summed_losses", loss)


def validation_losses(monkeypatch, *losses: float) -> None:
    """The validations of the run return ``losses``, in order (no model is run; every pair's
    sentence loss 1 nat on 1 token)."""
    returned: Iterator[float] = iter(losses)

    def validation_loss(model, sources, *args):
        return next(returned), [1.0] * len(sources), [1] * len(sources)

    monkeypatch.setattr(validation_module, "validation_loss", validation_loss)


# --- nan_policy=skip ----------------------------------------------------------------------------


def test_a_run_whose_loss_stays_nan_stops_after_nan_skip_limit_batches_in_a_row(
    tmp_path, monkeypatch
):
    nan_training_losses(monkeypatch, lambda batch: batch >= 3)  # steps 1, 2 train, then NaN
    skip = ("trainer.nan_policy=skip", "trainer.nan_skip_limit=3", "trainer.max_steps=4")
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, *skip), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    assert failure(tmp_path) == (
        "loss was nan in 3 batches in a row at step 3 (trainer.nan_skip_limit=3); lower "
        f"trainer.lr, with {paste('trainer.resume', last)} to go on from the newest finite "
        "checkpoint"
    )
    assert saved_step(last) == 2

    monkeypatch.undo()  # as the message says; a lower lr trains another run, in its own directory
    lower = tmp_path / "lower"
    run(compose(*OVERRIDES, *skip, "trainer.lr=1e-3", f"trainer.resume={last}"), lower)
    assert saved_step(lower / "checkpoints" / "last.pt") == 4


def test_skips_in_a_row_are_counted_afresh_after_every_step_taken(tmp_path, monkeypatch):
    nan_training_losses(monkeypatch, lambda batch: batch % 2 == 1)  # every other batch
    skip = ("trainer.nan_policy=skip", "trainer.nan_skip_limit=2", "trainer.max_steps=4")
    run(compose(*OVERRIDES, *skip), tmp_path)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["steps"] == 4 and summary["skipped_batches"] == 4


def test_gradients_that_are_not_finite_under_a_finite_loss_stop_the_run_before_the_update(
    tmp_path, monkeypatch
):
    """One such step would write NaN into every weight, and the next loss would be NaN with the
    cause a step behind it."""
    nan_gradients(monkeypatch, lambda batch: batch == 3)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    assert failure(tmp_path) == (
        "the gradient norm became nan at step 3; lower trainer.lr or set "
        f"trainer.nan_policy=skip, with {paste('trainer.resume', last)} to go on from the "
        "newest finite checkpoint"
    )


def test_nan_policy_skip_skips_a_batch_whose_gradients_are_not_finite(
    tmp_path, monkeypatch, caplog
):
    nan_gradients(monkeypatch, lambda batch: batch == 3)
    skip = ("trainer.nan_policy=skip", "trainer.max_steps=4")
    with caplog.at_level(logging.WARNING, logger="posenc.training.loop"):
        run(compose(*OVERRIDES, *skip), tmp_path)
    said = [r.getMessage() for r in caplog.records if "not finite in" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 3: gradients not finite in ")
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["steps"] == 4 and summary["skipped_batches"] == 1
    weights = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(tensor.isfinite().all() for tensor in weights.values())


def test_the_warning_names_only_the_parameters_whose_gradients_are_not_finite(
    tmp_path, monkeypatch, caplog
):
    """Read before clipping, which would scale every gradient by the NaN norm: a NaN born in
    one parameter's gradient is named there alone."""
    real_loss = train_module.summed_losses
    batches = iter(range(1, 61))

    def loss(model, *args, **kwargs):
        value, nll = real_loss(model, *args, **kwargs)
        if torch.is_grad_enabled() and next(batches) == 3:
            name, parameter = next(iter(model.named_parameters()))
            handle = None

            def poison(grad):
                handle.remove()
                return grad * NAN

            handle = parameter.register_hook(poison)
            poisoned.append(name)
        return value, nll

    poisoned: list[str] = []
    monkeypatch.setattr(train_module, "summed_losses", loss)
    with caplog.at_level(logging.WARNING, logger="posenc.training.loop"):
        run(compose(*OVERRIDES, "trainer.nan_policy=skip", "trainer.max_steps=4"), tmp_path)
    said = [r.getMessage() for r in caplog.records if "not finite in" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 3: gradients not finite in 1 of "), said
    assert said[0].endswith(f"from {poisoned[0]} to {poisoned[0]}")


def test_resuming_with_a_lower_trainer_lr_trains_with_it(tmp_path):
    """The way out of a NaN that the messages name: a lowered ``trainer.lr`` on resume is the
    peak rate from then on, not the one the checkpoint was saved with."""
    constant = ("trainer.schedule=constant", "trainer.warmup_steps=0")
    run(compose(*OVERRIDES, *constant, "trainer.max_steps=2"), tmp_path / "run")
    resume = f"trainer.resume={tmp_path / 'run' / 'checkpoints' / 'last.pt'}"
    lower = ("trainer.max_steps=4", "trainer.lr=1e-5", resume)
    run(compose(*OVERRIDES, *constant, *lower), tmp_path / "lower")
    payload = torch.load(tmp_path / "lower" / "checkpoints" / "last.pt", weights_only=True)
    assert payload["scheduler"]["base_lrs"] == [1e-5, 1e-5]
    assert [group["lr"] for group in payload["optimizer"]["param_groups"]] == [1e-5, 1e-5]


# --- a NaN never becomes a checkpoint -----------------------------------------------------------


def test_a_nan_validation_loss_saves_nothing_and_names_the_finite_checkpoint(tmp_path, monkeypatch):
    validation_losses(monkeypatch, 5.0, NAN, 4.0)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "trainer.max_steps=6"), tmp_path)
    checkpoints = tmp_path / "checkpoints"
    assert failure(tmp_path) == (
        "validation loss became nan at step 4; lower trainer.lr, with "
        f"{paste('trainer.resume', checkpoints / 'last.pt')} to go on from the newest finite "
        "checkpoint"
    )
    assert [saved_step(checkpoints / name) for name in ("last.pt", "best.pt")] == [2, 2]


def fake_checkpoint(path: Path, step: int, weight: float = 1.0, valid_loss: float = 3.0) -> None:
    history = [{"step": step, "seconds": 1.0, "valid_loss": valid_loss}]
    payload = {
        "model": {"w": torch.full((2,), weight)},
        "state": {"step": step, "history": history},
    }
    checkpoint.save_atomic(payload, path)


def test_the_advice_after_a_nan_names_the_newest_finite_checkpoint_or_none(tmp_path):
    fake_checkpoint(tmp_path / "last.pt", 6, weight=NAN)  # NaN weights
    fake_checkpoint(tmp_path / "previous.pt", 4, valid_loss=float("inf"))  # diverged validation
    fake_checkpoint(tmp_path / "best.pt", 2)
    assert advice.finite_checkpoint(tmp_path) == tmp_path / "best.pt"
    assert advice.nan_loss(NAN, 7, tmp_path) == (
        "loss became nan at step 7; lower trainer.lr or set trainer.nan_policy=skip, with "
        f"{paste('trainer.resume', tmp_path / 'best.pt')} to go on from the newest finite "
        "checkpoint"
    )

    fake_checkpoint(tmp_path / "best.pt", 2, weight=float("inf"))
    assert advice.finite_checkpoint(tmp_path) is None
    assert advice.nan_loss(NAN, 7, tmp_path) == (
        f"loss became nan at step 7; no checkpoint in {tmp_path} is finite to resume from: "
        f"lower trainer.lr or set trainer.nan_policy=skip and start over (delete {tmp_path}, "
        "or train under another name=)"
    )


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    """An interrupt (or a finish) after the weights became NaN writes no checkpoint."""
    model = tiny_model("nonepe")
    with torch.no_grad():
        next(model.parameters()).fill_(NAN)
    training = SimpleNamespace(model=model, state=TrainState(step=5), run_dir=RunDir(tmp_path))
    with pytest.raises(train_module.TrainingError) as err:
        train_module.save(training, best=False)
    assert str(err.value) == (
        "the weights are not all finite at step 5, so they are not saved, before any "
        "checkpoint; lower trainer.lr"
    )
    assert not (tmp_path / "checkpoints").exists()


# --- best.pt and last.pt agree after a kill -----------------------------------------------------


class Killed(BaseException):
    """Stands for ``kill -9``: nothing of the run catches it."""


def test_a_kill_between_last_pt_and_best_pt_is_repaired_and_the_best_step_evaluated(
    tmp_path, monkeypatch
):
    validation_losses(monkeypatch, 5.0, 4.0)  # step 4 is the best
    real_link = checkpoint.link_over
    best_links = iter(range(1, 3))

    def killed_at_the_second_best(source: Path, target: Path) -> None:
        if target.name == "best.pt" and next(best_links) == 2:
            raise Killed
        real_link(source, target)

    monkeypatch.setattr(checkpoint, "link_over", killed_at_the_second_best)
    with pytest.raises(Killed):
        run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    checkpoints = tmp_path / "checkpoints"
    assert [saved_step(checkpoints / name) for name in ("last.pt", "best.pt")] == [4, 2]
    assert checkpoint_path(tmp_path, "best") == checkpoints / "last.pt"  # step 4, not best.pt

    monkeypatch.undo()
    metrics = run(compose(*OVERRIDES, "trainer.max_steps=4", "eval.enabled=true"), tmp_path)
    assert saved_step(checkpoints / "best.pt") == 4
    assert (metrics["step"], metrics["checkpoint"]) == (4, "best.pt")


def test_evaluation_redirects_or_refuses_a_best_pt_that_is_not_the_best_step(tmp_path, monkeypatch):
    validation_losses(monkeypatch, 5.0, 4.0, 6.0)  # the best is step 4
    run(compose(*OVERRIDES, "trainer.max_steps=2"), tmp_path)
    checkpoints = tmp_path / "checkpoints"
    step_2 = (checkpoints / "best.pt").read_bytes()
    run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    (checkpoints / "best.pt").write_bytes(step_2)  # stale, and last.pt is the best step
    cfg = Settings.of(compose(*OVERRIDES))
    *_, step, path = load_run_model(tmp_path, cfg, "best", torch.device("cpu"))
    assert (step, path) == (4, checkpoints / "last.pt")

    run(compose(*OVERRIDES, "trainer.max_steps=6"), tmp_path)  # repairs best.pt, then step 6
    assert saved_step(checkpoints / "best.pt") == 4
    (checkpoints / "best.pt").write_bytes(step_2)  # stale, and no checkpoint holds step 4
    with pytest.raises(checkpoint.CheckpointError) as err:
        load_run_model(tmp_path, cfg, "best", torch.device("cpu"))
    assert str(err.value).startswith(
        f"{checkpoints / 'best.pt'} holds step 2, but {checkpoints / 'last.pt'} records the best "
        "validation at step 4"
    )
    assert "\n" not in str(err.value) and "eval.checkpoint=last" in str(err.value)


# --- one process at a time in a run directory ---------------------------------------------------

HOLD = """
import sys
from pathlib import Path
from posenc.runtime.lock import run_lock
with run_lock(Path(sys.argv[1]), "training"):
    print("locked", flush=True)
    sys.stdin.read()
"""


def holder(directory: Path) -> subprocess.Popen:
    """Another process that holds the lock of ``directory`` (once this returns) until its
    standard input is closed."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "locked\n"
    return process


def test_a_run_directory_held_by_another_process_is_refused_in_one_line(tmp_path):
    process = holder(tmp_path)
    try:
        with pytest.raises(RunLockedError) as err, run_lock(tmp_path, "evaluation"):
            pass
    finally:
        process.stdin.close()
        process.wait()
    message = str(err.value)
    assert message.startswith(f"{tmp_path} is in use by training (pid {process.pid} on ")
    assert ", since " in message and message.endswith(
        "; wait for it to end, or stop that process, then run again"
    )
    assert "\n" not in message
    with run_lock(tmp_path, "evaluation"):  # released by its holder
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, caplog):
    process = holder(tmp_path)
    process.send_signal(signal.SIGKILL)
    process.stdin.close()
    process.wait()
    with caplog.at_level(logging.INFO, "posenc.runtime.lock"), run_lock(tmp_path, "eval") as path:
        record = json.loads(path.read_text())
        assert (record["pid"], record["purpose"]) != (process.pid, "training")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"took over {path}, left by training (pid {process.pid} on ")
    assert path.read_text() == ""  # released: no holder recorded


def test_a_lock_file_is_untrusted_a_link_is_refused_and_garbage_ignored(tmp_path, caplog):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (tmp_path / ".lock").symlink_to(target)
    refused = pytest.raises(RunLockedError, match=r"\.lock is a symbolic link, not a lock file")
    with refused, run_lock(tmp_path, "training"):
        pass
    assert target.read_text() == "keep"

    (tmp_path / ".lock").unlink()
    (tmp_path / ".lock").write_text('{"pid": "1\\n2", "purpose": "\\u001b[2J"}' + "x" * 10_000)
    with caplog.at_level(logging.INFO, "posenc.runtime.lock"), run_lock(tmp_path, "training"):
        pass  # not JSON (trailing garbage): nothing to report
    (tmp_path / ".lock").write_text('{"pid": "1\\n2", "purpose": "\\u001b[2J"}')
    with caplog.at_level(logging.INFO, "posenc.runtime.lock"), run_lock(tmp_path, "training"):
        pass
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\x1b" not in line and "pid 1?2" in line


def test_sigterm_while_the_test_sets_are_decoded_is_one_line_and_keeps_the_training(
    tmp_path, monkeypatch, caplog
):
    """Once exited with status 143 and no word; now said like Ctrl-C, the checkpoints kept."""
    import os

    import posenc.job

    def killed_while_decoding(cfg, run_dir):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the evaluation")

    monkeypatch.setattr(posenc.job, "evaluate", killed_while_decoding)
    before = signal.getsignal(signal.SIGTERM)
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stopped:
        run(compose(*SMOKE, "trainer.max_steps=4", "trainer.valid_every=2"), run_dir)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert "stopped (SIGTERM) outside the training steps; what was saved stays" in caplog.text
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert signal.getsignal(signal.SIGTERM) == before  # put back afterwards


@pytest.mark.parametrize(
    ("signum", "line"),
    [(signal.SIGTERM, "stopped (SIGTERM)"), (signal.SIGINT, "interrupted (Ctrl-C)")],
)
def test_a_signal_before_the_first_step_stops_at_once(tmp_path, monkeypatch, caplog, signum, line):
    """Preparing the corpus and training the tokenizer once went on for 35 s after SIGTERM
    (the signal waited for a training step); with no step to finish it now stops there."""
    import os
    import time

    def preparing_for_long(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(30)  # a long preparation: the signal must cut it short
        raise AssertionError("the signal did not stop the preparation")

    monkeypatch.setattr(train_module, "set_up", preparing_for_long)
    started = time.perf_counter()
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as stopped:
        run(compose(*SMOKE, "trainer.max_steps=4"), tmp_path / "run")
    assert time.perf_counter() - started < 10
    assert stopped.value.code == 128 + signum
    assert f"{line} outside the training steps; what was saved stays" in caplog.text


WORKERS_HOLD = """
import fcntl, sys, time
from posenc.data.prepare import _workers
lock = open(sys.argv[1], "w")
fcntl.flock(lock, fcntl.LOCK_EX)
with _workers(2) as pool:
    pending = [pool.apply_async(time.sleep, (60,)) for _ in range(2)]
    time.sleep(1)  # the workers are asleep in their tasks
    print("working", flush=True)
    time.sleep(60)
"""


def test_workers_of_a_killed_preparation_end_with_it_and_free_the_run_lock(tmp_path):
    """A forked tokenising worker shares its parent's open files, the run lock among them:
    after ``kill -9`` of the preparing process, orphans once held the lock for 6-9 s (the rerun
    was refused, naming a dead pid)."""
    import fcntl
    import time

    path = tmp_path / ".lock"
    process = subprocess.Popen(
        [sys.executable, "-c", WORKERS_HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "working\n"
    process.send_signal(signal.SIGKILL)
    process.wait()
    with open(path) as handle:
        deadline = time.monotonic() + 5
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "an orphaned worker still holds the lock"
                time.sleep(0.05)
