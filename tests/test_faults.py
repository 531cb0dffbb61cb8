"""Faults a run survives or refuses clearly: ``kill -9`` at any moment (during a checkpoint save
too), corrupt or truncated checkpoints, a NaN loss, and wrong or impossible settings, which stop
the run with one line before any data is read."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SMOKE, compose
from omegaconf import open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc.config import paste
from posenc.job import run
from posenc.runtime import checkpoint
from posenc.training import loop as train_module

OVERRIDES = (
    *SMOKE,
    "pe=nonepe",
    "trainer.valid_every=2",
    "trainer.log_every=1",
    "eval.enabled=false",
)


def logged_steps(run_dir: Path, tag: str = "train/loss") -> list[int]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    """``python train.py ...`` in the background, writing to ``run_dir``."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
        cwd=run_dir.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(done: Callable[[], bool], job: subprocess.Popen, timeout: float = 300) -> None:
    """Poll until ``done()``; fail if ``job`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not done():
        assert job.poll() is None, f"the job ended (status {job.returncode}) too early"
        assert time.monotonic() < deadline, f"still waiting after {timeout} s"
        time.sleep(0.01)


def starts(run_dir: Path) -> int:
    """How many times training has started in ``run_dir`` (lines of its log)."""
    log = run_dir / "train.log"
    return log.read_text().count("effective batch") if log.exists() else 0


def kill(job: subprocess.Popen) -> None:
    job.send_signal(signal.SIGKILL)
    job.wait()


def saved_step(path: Path) -> int:
    return torch.load(path, weights_only=True)["state"]["step"]


def pasted(message: str, key: str, path: Path) -> str:
    """The override ``key=path`` exactly as ``message`` prints it, read back the way a shell
    reads a pasted command line."""
    word = paste(key, path)
    assert word in message, message
    (override,) = shlex.split(word)
    return override


def failure(run_dir: Path) -> str:
    return json.loads((run_dir / "failed.json").read_text())["message"]


# --- kill -9 ---------------------------------------------------------------------------------


def test_a_run_killed_by_sigkill_resumes_with_every_step_logged_once(tmp_path):
    # enough steps that a loaded machine cannot finish the run between the poll and the kill
    overrides = (*OVERRIDES, "trainer.max_steps=300", "trainer.valid_every=10")
    run_dir = tmp_path / "run"
    job = start(run_dir, *overrides)
    wait_for((run_dir / "checkpoints" / "last.pt").exists, job)
    kill(job)
    assert not (run_dir / "train_summary.json").exists(), "the run ended before it was killed"

    run(compose(*overrides), run_dir)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 300
    assert logged_steps(run_dir) == list(range(1, 301))
    assert logged_steps(run_dir, "valid/loss") == list(range(10, 301, 10))
    seconds = logged_steps(run_dir, "vs_train_seconds/train_loss")
    assert seconds == sorted(set(seconds))


@pytest.mark.slow
def test_repeated_kills_at_random_moments_change_nothing(tmp_path):
    """Killed five times at random moments (before, between and during checkpoint saves), the
    run still ends with the weights of a run that was never interrupted."""
    overrides = (*OVERRIDES, "trainer.max_steps=60", "trainer.valid_every=1")
    killed = tmp_path / "killed"
    rng = random.Random(0)
    for attempt in range(5):
        job = start(killed, *overrides)
        wait_for(lambda n=attempt: starts(killed) > n, job)  # training starts
        time.sleep(rng.uniform(0.0, 1.5))
        kill(job)
    run(compose(*overrides), killed)
    straight = tmp_path / "straight"
    run(compose(*overrides), straight)
    assert logged_steps(killed) == logged_steps(straight) == list(range(1, 61))
    expected = torch.load(straight / "checkpoints" / "last.pt", weights_only=True)["model"]
    final = torch.load(killed / "checkpoints" / "last.pt", weights_only=True)["model"]
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, msg=name)
    assert not list((killed / "checkpoints").glob(".*.tmp"))


def test_the_temporary_file_of_a_killed_save_is_ignored_and_removed(tmp_path):
    run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    stray = tmp_path / "checkpoints" / ".last.pt.k1ll3d.tmp"
    stray.write_bytes((tmp_path / "checkpoints" / "last.pt").read_bytes()[:1000])  # half-written
    run(compose(*OVERRIDES, "trainer.max_steps=6"), tmp_path)
    assert not stray.exists()
    assert saved_step(tmp_path / "checkpoints" / "last.pt") == 6
    assert logged_steps(tmp_path) == list(range(1, 7))


def test_save_atomic_never_leaves_a_partial_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save_atomic({"model": {}, "state": {"step": 1}}, path)
    checkpoint.save_atomic({"model": {}, "state": {"step": 2}}, path, keep_previous=True)

    def crash_half_way(obj, handle):
        handle.write(b"PK\x03\x04 half a zip archive")
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", crash_half_way)
    with pytest.raises(checkpoint.CheckpointError, match="could not write checkpoint"):
        checkpoint.save_atomic({"model": {}, "state": {"step": 3}}, path, keep_previous=True)
    monkeypatch.undo()
    assert checkpoint.load(path)["state"]["step"] == 2  # untouched
    assert checkpoint.load(tmp_path / "previous.pt")["state"]["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "previous.pt"]


# --- corrupt checkpoints ---------------------------------------------------------------------


def test_a_truncated_checkpoint_names_the_file_and_the_previous_one_resumes(tmp_path):
    run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    previous = tmp_path / "checkpoints" / "previous.pt"
    assert saved_step(previous) == 4  # the final save: the same step, another file
    last.write_bytes(last.read_bytes()[:5000])
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "trainer.max_steps=6"), tmp_path)
    message = failure(tmp_path)
    assert message.startswith(f"checkpoint {last} is corrupt or truncated")

    resume = pasted(message, "trainer.resume", previous)
    run(compose(*OVERRIDES, "trainer.max_steps=6", resume), tmp_path)
    assert saved_step(last) == 6
    assert not (tmp_path / "failed.json").exists()


def test_garbage_and_foreign_checkpoints_are_refused_with_the_file_name(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(2000))
    with pytest.raises(checkpoint.CheckpointError, match="garbage.pt is corrupt or truncated"):
        checkpoint.load(garbage)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(checkpoint.CheckpointError, match="foreign.pt holds no posenc model"):
        checkpoint.load(foreign)


def test_a_checkpoint_with_a_compressed_tensor_is_refused_before_it_is_unpacked(tmp_path):
    """A small file whose deflated storage unpacks to far more (a zip bomb) never reaches
    torch.load: posenc's checkpoints are stored uncompressed, byte for byte."""
    plain = tmp_path / "plain.pt"
    torch.save({"model": {"w": torch.zeros(1_000_000)}}, plain)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info))
    assert bomb.stat().st_size < plain.stat().st_size / 50
    with pytest.raises(
        checkpoint.CheckpointError, match="bomb.pt refused: its entry .* compressed"
    ):
        checkpoint.load(bomb)
    assert checkpoint.saved_state(bomb) is None
    assert checkpoint.load(plain)["model"]["w"].shape == (1_000_000,)


def test_a_checkpoint_of_another_model_is_refused_in_one_line(tmp_path, caplog):
    run(compose(*OVERRIDES, "trainer.max_steps=2"), tmp_path / "small")
    other = tmp_path / "small" / "checkpoints" / "last.pt"
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "model.d_model=64", f"trainer.resume={other}"), tmp_path / "big")
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"checkpoint {other} was trained with model.d_model=32 (now 64)" in message
    with pytest.raises(SystemExit):  # a deliberate fine-tune still needs weights that fit
        run(compose(*OVERRIDES, "model.d_model=64", f"trainer.init_from={other}"), tmp_path / "b")
    message = failure(tmp_path / "b")
    assert f"checkpoint {other} does not fit this run" in message and "size mismatch" in message


def test_resuming_under_another_encoding_stops_and_leaves_the_run_untouched(tmp_path, caplog):
    """A ``pe=rope`` checkpoint resumed with ``pe=alibi`` would train on and label the results
    alibi: it stops with one line naming both, and writes nothing into the rope run."""
    run_dir = tmp_path / "run"
    run(compose(*OVERRIDES, "pe=rope", "trainer.max_steps=2"), run_dir)
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "pe=alibi", "trainer.max_steps=4"), run_dir)
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    last = run_dir / "checkpoints" / "last.pt"
    assert f"{run_dir} holds a run trained with pe.name=rope (now alibi)" in message
    assert "\n" not in message
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before

    fine_tune = pasted(message, "trainer.init_from", last)
    caplog.clear()
    with caplog.at_level("INFO"):
        run(compose(*OVERRIDES, "pe=alibi", "trainer.max_steps=2", fine_tune), tmp_path / "ft")
    assert any("fine-tuning from the weights of" in r.getMessage() for r in caplog.records)
    assert saved_step(tmp_path / "ft" / "checkpoints" / "last.pt") == 2  # its own step count


@pytest.mark.parametrize("key", ["model.n_heads=2", "tokenizer.vocab_size=512", "pe.base=500"])
def test_resuming_with_another_model_shape_or_tokenizer_stops(tmp_path, caplog, key):
    run(compose(*OVERRIDES, "pe=rope", "trainer.max_steps=2"), tmp_path)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "pe=rope", "trainer.max_steps=4", key), tmp_path)
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    name, value = key.split("=")
    assert f"{name}=" in message and f"(now {value})" in message
    assert saved_step(tmp_path / "checkpoints" / "last.pt") == 2


class RunsCode:
    """Pickles as a call of ``os.mkdir(marker)``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_checkpoint_whose_pickle_would_run_code_is_refused_and_nothing_runs(tmp_path, caplog):
    marker = tmp_path / "code-ran"
    crafted = tmp_path / "shared.pt"
    torch.save({"model": {}, "state": RunsCode(marker)}, crafted)
    assert not marker.exists()
    with pytest.raises(checkpoint.CheckpointError, match="refused: it names '.*mkdir'"):
        checkpoint.load(crafted)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, f"trainer.resume={crafted}"), tmp_path / "run")
    assert "refused" in failure(tmp_path / "run") and not marker.exists()


def test_a_checkpoint_holds_tensors_and_plain_values_only(tmp_path):
    run(compose(*OVERRIDES, "trainer.max_steps=2"), tmp_path)
    for name in ("last.pt", "best.pt", "previous.pt"):
        payload = torch.load(tmp_path / "checkpoints" / name, weights_only=True)
        assert payload["config"]["pe"]["name"] == "nonepe"


# --- NaN -------------------------------------------------------------------------------------


def test_a_nan_loss_before_any_checkpoint_says_so(tmp_path, monkeypatch):
    real_loss = train_module.summed_losses

    def nan_loss(*args, **kwargs):
        loss, nll = real_loss(*args, **kwargs)
        return loss * float("nan"), nll

    monkeypatch.setattr(train_module, "summed_losses", nan_loss)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    assert failure(tmp_path) == (
        "loss became nan at step 1, before any checkpoint; lower trainer.lr or set "
        "trainer.nan_policy=skip"
    )


def test_a_nan_loss_after_a_checkpoint_names_the_step_and_the_checkpoint(tmp_path, monkeypatch):
    real_loss = train_module.summed_losses
    calls = {"n": 0}

    def nan_from_step_3(*args, **kwargs):
        loss, nll = real_loss(*args, **kwargs)
        calls["n"] += torch.is_grad_enabled()  # training batches only
        return (loss * float("nan") if calls["n"] >= 3 else loss), nll

    monkeypatch.setattr(train_module, "summed_losses", nan_from_step_3)
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "trainer.max_steps=4"), tmp_path)
    message = failure(tmp_path)
    assert message.startswith("loss became nan at step 3; lower trainer.lr")
    resume = pasted(message, "trainer.resume", tmp_path / "checkpoints" / "last.pt")
    monkeypatch.undo()
    run(compose(*OVERRIDES, "trainer.max_steps=4", resume), tmp_path)  # pasted as printed
    assert saved_step(tmp_path / "checkpoints" / "last.pt") == 4


# --- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["trainer.max_stepz", "+trainer.max_stepz"])
def test_an_unknown_key_is_refused_in_one_line_with_the_closest_one(tmp_path, key):
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *SMOKE, f"{key}=5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr == (
        "train: trainer.max_stepz is not among the trainer settings; "
        "did you mean trainer.max_steps?\n"
    )
    assert not (tmp_path / "outputs").exists()  # stopped before any run directory


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "experiment=smok",
            "experiment=smok is no option of experiment; did you mean experiment=smoke?",
        ),
        ("pe=rop", "pe=rop is no option of pe; did you mean pe=rope?"),
        ("model=tny", "model=tny is no option of model; did you mean model=tiny?"),
        ("pe=rope,alibbi", "pe=alibbi is no option of pe; did you mean pe=alibi?"),
        (
            "pe.bas=100",
            "pe.bas is not among the pe settings of any pe option; did you mean pe.base?",
        ),
        (
            "data.dirr=/x",
            "data.dirr is not among the data settings of any data option; did you mean data.dir?",
        ),
    ],
)
def test_a_misspelt_option_or_key_of_any_group_is_refused_in_one_line_writing_nothing(
    tmp_path, override, message
):
    """A misspelt preset no longer falls back to the defaults and trains under the wrong name."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), override],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"train: {message}") and result.stderr.count("\n") == 1
    assert not (tmp_path / "outputs").exists()


def refused(tmp_path: Path, *overrides: str) -> str:
    """The one-line message of a run with ``overrides`` whose data cannot even be found (so the
    message proves the settings were checked before any data was read)."""
    cfg = compose(*SMOKE, *overrides)
    with open_dict(cfg):  # local files that do not exist: reading them would fail
        cfg.data = {"kind": "local", "dir": str(tmp_path / "no-such-dir"), "train": ["x"]}
    assert run(cfg, tmp_path / "run", multirun=True) is None  # a sweep's job records why
    return failure(tmp_path / "run")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.max_steps=abc", "trainer.max_steps='abc' must be an integer >= 1 or null"),
        ("model.d_model=1.5", "model.d_model=1.5 must be an integer >= 1"),
        ("trainer.lr=fast", "trainer.lr='fast' must be a number >= 0"),
        ("model.dropout=1.5", "model.dropout=1.5 must be a number in [0, 1)"),
        ("trainer.precision=fp16", "trainer.precision='fp16' must be one of auto, fp32, bf16"),
        ("trainer.progress=maybe", "trainer.progress='maybe' must be true or false"),
        ("trainer.betas=[0.9]", "trainer.betas=[0.9] must be a list of two numbers in [0, 1)"),
        ("trainer.accumulate=0", "trainer.accumulate=0 must be an integer >= 1"),
        ("model.n_heads=true", "model.n_heads=True must be an integer >= 1"),
        ("model.activation=swish", "model.activation='swish' must be one of relu, gelu"),
    ],
)
def test_wrong_types_are_refused_before_data_is_read(tmp_path, override, message):
    assert refused(tmp_path, override) == message


@pytest.mark.parametrize(
    ("overrides", "parts"),
    [
        (("model.n_heads=3",), ["invalid configuration", "d_model=32", "not divisible", "3"]),
        (("pe=rope", "model.d_model=36"), ["invalid configuration", "head dim 9", "even"]),
        (("pe=xpos", "model.d_model=36"), ["invalid configuration", "must be even"]),
        (("trainer.schedule=step",), ["trainer.schedule='step' is unknown"]),
        (("trainer.max_steps=null",), ["set a budget", "trainer.max_time"]),
        (("device=tpu",), ["device='tpu' is unknown"]),
    ],
)
def test_impossible_settings_are_refused_before_data_is_read(tmp_path, overrides, parts):
    message = refused(tmp_path, *overrides)
    for part in parts:
        assert part in message, (part, message)
