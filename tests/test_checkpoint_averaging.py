"""Checkpoint averaging (``eval.average_last=N``): training keeps the weights of its last N
validations, evaluation averages them and says which; asking for more than there are stops
with one line."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SMOKE, compose

from posenc.config.settings import Settings
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.factory import load_run_model
from posenc.runtime import checkpoint
from posenc.runtime.averaging import averaged_weights, last_step_checkpoints
from posenc.runtime.checkpoint import CheckpointError

TRAIN = (*SMOKE, "pe=rope", "trainer.max_steps=6", "trainer.valid_every=2", "eval.average_last=2")


def weights(step: int, seed: int) -> dict:
    """A training checkpoint at ``step`` whose model state holds float32, bfloat16 and integer
    tensors."""
    generator = torch.Generator().manual_seed(seed)
    model = {
        "w": torch.randn(3, 4, generator=generator),
        "half": torch.randn(5, generator=generator).bfloat16(),
        "count": torch.tensor([step, 7 * seed]),
    }
    return {"model": model, "optimizer": {}, "state": {"step": step}}


def test_averaging_two_checkpoints_gives_their_elementwise_mean(tmp_path):
    first, second = weights(2, seed=1), weights(4, seed=2)
    for payload in (first, second):
        checkpoint.save_step(payload, tmp_path, keep=2)
    paths = last_step_checkpoints(tmp_path, 2)
    assert [p.name for p in paths] == ["step_2.pt", "step_4.pt"]
    mean = averaged_weights(paths)
    a, b = first["model"], second["model"]
    torch.testing.assert_close(mean["w"], (a["w"] + b["w"]) / 2)
    expected_half = ((a["half"].double() + b["half"].double()) / 2).bfloat16()
    assert mean["half"].dtype is torch.bfloat16 and torch.equal(mean["half"], expected_half)
    assert torch.equal(mean["count"], b["count"])  # integers: the newest checkpoint's


def test_only_the_newest_step_checkpoints_are_kept_in_step_order(tmp_path):
    for step in (2, 4, 6, 10):
        checkpoint.save_step(weights(step, seed=step), tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_10.pt", "step_6.pt"]
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path)] == ["step_6.pt", "step_10.pt"]
    saved = checkpoint.load(tmp_path / "step_10.pt")
    assert set(saved) == {"model", "state"}  # weights only: no optimizer state


def test_checkpoints_of_different_models_are_not_averaged(tmp_path):
    other = weights(4, seed=2)
    other["model"]["w"] = torch.zeros(2, 2)
    checkpoint.save_step(weights(2, seed=1), tmp_path, keep=2)
    checkpoint.save_step(other, tmp_path, keep=2)
    with pytest.raises(CheckpointError, match="step_4.pt holds other tensors than .*step_2.pt"):
        averaged_weights(last_step_checkpoints(tmp_path, 2))


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("avg") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


def test_a_run_keeps_its_last_n_validations_and_evaluates_their_average(averaged_run):
    checkpoints = averaged_run / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*.pt")) == ["step_4.pt", "step_6.pt"]
    metrics = json.loads((averaged_run / "metrics.json").read_text())
    assert metrics["averaged"] == ["step_4.pt", "step_6.pt"]
    assert metrics["checkpoint"] == "step_6.pt" and metrics["step"] == 6

    cfg = compose(*TRAIN)
    _, model, step, _ = load_run_model(
        averaged_run, Settings.of(cfg), "best", torch.device("cpu"), 2
    )
    older = checkpoint.load(checkpoints / "step_4.pt")["model"]
    newer = checkpoint.load(checkpoints / "step_6.pt")["model"]
    name = "output.weight"
    torch.testing.assert_close(model.state_dict()[name], (older[name] + newer[name]) / 2)
    assert not torch.equal(older[name], newer[name]) and step == 6


def test_a_run_that_validated_fewer_times_averages_what_it_kept_and_does_not_fail(tmp_path, caplog):
    """Training ends in its own evaluation: asking for the average of 3 after 2 validations
    averages those 2 (with a warning) instead of failing a trained run."""
    run(
        compose(*TRAIN[:-3], "trainer.max_steps=4", "trainer.valid_every=2", "eval.average_last=3"),
        tmp_path,
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["averaged"] == ["step_2.pt", "step_4.pt"]
    assert not (tmp_path / "failed.json").exists()
    assert (
        "eval.average_last=3, but the run validated only 2 times: averaging those 2" in caplog.text
    )


def test_asking_for_more_checkpoints_than_kept_stops_in_one_line(averaged_run):
    """Standalone evaluation averages exactly what it is asked for."""
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([f"run_dir={averaged_run}", "eval.average_last=3"])
    message = str(exit_info.value.code)
    assert "eval.average_last=3 needs 3 step checkpoints" in message
    assert "found 2 (step_4.pt, step_6.pt)" in message and "eval.average_last=2" in message
    assert "\n" not in message
