"""Data-parallel training with ``torchrun`` (gloo on the CPU): two processes train exactly like
one process that sees the union of their batches, and a distributed run resumes after a crash.

The batcher gives rank ``r`` of 2 the batches ``r::2`` of each epoch, so step k of two ranks
with ``accumulate=1`` uses batches (2k, 2k+1): the same pair as step k of one process with
``accumulate=2``. With dropout off (``model=tiny``), the losses and parameters must agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SMOKE, compose, torchrun
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc.job import run

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)

OVERRIDES = (
    *SMOKE,
    "device=cpu",  # gloo: two ranks cannot share one GPU under NCCL
    "pe=rope",
    "trainer.max_steps=4",
    "trainer.valid_every=2",
    "trainer.log_every=1",
    "eval.enabled=false",
)


def wait_for(path: Path, job: subprocess.Popen, timeout: float = 300) -> None:
    """Poll until ``path`` exists; fail if ``job`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert job.poll() is None, f"the job ended (status {job.returncode}) before {path}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)


def train_losses(run_dir: Path) -> dict[int, float]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("train/loss")}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_two_processes_train_like_one_process_on_the_union_of_their_batches(tmp_path):
    single = tmp_path / "single"
    run(compose(*OVERRIDES, "trainer.accumulate=2"), single)
    ddp = tmp_path / "ddp"
    result = torchrun(ddp, *OVERRIDES, "trainer.accumulate=1")
    assert result.returncode == 0, result.stderr[-3000:]

    assert (
        "effective batch <= 1024 tokens (max_tokens 512 x accumulate 1 x 2 processes)"
        in (ddp / "train.log").read_text()
    )
    reference, summary = (json.loads((d / "train_summary.json").read_text()) for d in (single, ddp))
    assert summary["processes"] == 2 and summary["steps"] == reference["steps"] == 4
    assert summary["train_tokens"] == reference["train_tokens"]  # the same global batches
    losses, expected = train_losses(ddp), train_losses(single)
    assert sorted(losses) == [1, 2, 3, 4]
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, rel=1e-5), step
    weights, reference_weights = final_weights(ddp), final_weights(single)
    assert weights.keys() == reference_weights.keys()
    for name, value in reference_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert len(list((ddp / "tb").glob("events.out.tfevents.*"))) == 1  # rank 0's only


def test_torchrun_with_one_process_trains_through_a_process_group_like_a_plain_run(tmp_path):
    """``torchrun --nproc_per_node=1`` takes the multi-process path (a group, DDP) on one
    process, the only way to exercise NCCL on a machine with one GPU, and trains exactly as a
    run without torchrun."""
    plain = tmp_path / "plain"
    run(compose(*OVERRIDES), plain)
    one = tmp_path / "one"
    result = torchrun(one, *OVERRIDES, procs=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "process group up: 1 ranks (gloo)" in (one / "train.log").read_text()
    assert json.loads((one / "train_summary.json").read_text())["processes"] == 1
    assert train_losses(one) == train_losses(plain)
    for name, value in final_weights(plain).items():
        torch.testing.assert_close(final_weights(one)[name], value, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_killed_distributed_run_resumes_to_the_same_result(tmp_path):
    overrides = (*OVERRIDES, "trainer.max_steps=12")
    killed = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "train.py"),
        *overrides,
        f"hydra.run.dir={killed}",
    ]
    job = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(killed / "checkpoints" / "last.pt", job)
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # torchrun and both ranks, like `kill -9` of the job
        job.wait()
    assert not (killed / "train_summary.json").exists(), "the run ended before it was killed"

    result = torchrun(killed, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in (killed / "train.log").read_text()
    assert json.loads((killed / "train_summary.json").read_text())["steps"] == 12
    assert sorted(train_losses(killed)) == list(range(1, 13))  # no step lost or logged twice

    single = tmp_path / "single"
    run(compose(*overrides, "trainer.accumulate=2"), single)
    expected = final_weights(single)
    for name, value in final_weights(killed).items():
        torch.testing.assert_close(value, expected[name], rtol=1e-4, atol=1e-5, msg=name)

    # Go on in one process with the run's own settings (the number of processes is not part of
    # a run's identity; trainer.accumulate is, so the one-process twin cannot follow it here):
    # it continues where the two ranks stopped in the epoch, no step lost or logged twice.
    run(compose(*overrides[:-1], "trainer.max_steps=14"), killed)
    assert json.loads((killed / "train_summary.json").read_text())["steps"] == 14
    assert sorted(train_losses(killed)) == list(range(1, 15))
