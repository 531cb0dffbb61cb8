"""An EMA of the weights (``trainer.ema_decay``, fairseq's ``--store-ema``): after every optimizer
step ``ema = decay * ema + (1 - decay) * weights``; every checkpoint keeps it and a resume goes on
from it bit for bit; ``eval.weights=ema`` scores it; validation logs its loss beside the raw
weights' (which alone choose ``best.pt``); switched off (the default) nothing changes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SMOKE, compose, tiny_model
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from posenc.config import EvalConfig, TrainerConfig, check_types
from posenc.config.identity import training_identity
from posenc.config.settings import Settings
from posenc.evaluation.evaluate import evaluate
from posenc.evaluation.standalone import compose_run_config
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.factory import load_run_model
from posenc.runtime import checkpoint
from posenc.runtime.averaging import averaged_weights, last_step_checkpoints
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.rundir import run_dir_name
from posenc.training.ema import WeightEMA
from posenc.training.setup import check_config

TRAIN = (
    *SMOKE,
    "pe=rope",
    "trainer.max_steps=8",
    "trainer.valid_every=4",
    "trainer.warmup_steps=2",
)
EMA = "trainer.ema_decay=0.9"  # short runs: a short memory, so the EMA is far from the weights


class Scalar(nn.Module):
    """One weight, a float buffer that never changes and an integer buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.0]))
        self.register_buffer("constant", torch.tensor([0.3]))
        self.register_buffer("count", torch.tensor([7]))


def stepped(ema: WeightEMA, model: Scalar, values: list[float]) -> list[float]:
    """The EMA after each step that sets the weight to the next of ``values``."""
    seen = []
    for step, value in enumerate(values, start=1):
        with torch.no_grad():
            model.w.fill_(value)
        ema.update(step)
        seen.append(ema.module.w.item())
    return seen


# --- the update rule -------------------------------------------------------------------------


def test_three_steps_of_decay_0_9_give_the_hand_computed_average():
    """w: 0 (start) -> 1 -> 2 -> 3. ema_1 = 0.9 * 0 + 0.1 * 1 = 0.1;
    ema_2 = 0.9 * 0.1 + 0.1 * 2 = 0.29; ema_3 = 0.9 * 0.29 + 0.1 * 3 = 0.561."""
    model = Scalar()
    ema = WeightEMA(model, decay=0.9)
    assert stepped(ema, model, [1.0, 2.0, 3.0]) == pytest.approx([0.1, 0.29, 0.561], rel=1e-6)
    assert torch.equal(ema.module.constant, torch.tensor([0.3]))  # bit for bit, not 0.3000001
    assert torch.equal(ema.module.count, torch.tensor([7]))
    assert model.w.item() == 3.0  # the model is read, never written


def test_until_ema_start_the_ema_copies_the_weights_then_averages():
    model = Scalar()
    ema = WeightEMA(model, decay=0.9, start=2)
    assert stepped(ema, model, [1.0, 2.0, 3.0]) == pytest.approx([1.0, 2.0, 2.1], rel=1e-6)


def test_the_fused_update_matches_a_slow_reference_on_a_tiny_model():
    """Three AdamW steps of a tiny model with tied embeddings: every floating-point tensor of
    the EMA equals a float64 loop over the tensors, one at a time."""
    model = tiny_model("rope")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ema = WeightEMA(model, decay=0.9)
    reference = {k: v.double().clone() for k, v in model.state_dict().items()}
    src, tgt = torch.randint(3, 40, (4, 7)), torch.randint(3, 40, (4, 6))
    for step in (1, 2, 3):
        optimizer.zero_grad()
        model(src, tgt).logsumexp(-1).mean().backward()
        optimizer.step()
        ema.update(step)
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                reference[name] = 0.9 * reference[name] + 0.1 * value.double()
    averaged = ema.state_dict()
    assert averaged.keys() == model.state_dict().keys()
    for name, value in reference.items():
        torch.testing.assert_close(averaged[name].double(), value, rtol=1e-6, atol=1e-7)
        assert averaged[name].dtype == model.state_dict()[name].dtype
    assert not torch.equal(averaged["output.weight"], model.state_dict()["output.weight"])
    assert ema.module.output.weight is ema.module.tgt_embed.weight  # still tied


# --- settings and refusals -------------------------------------------------------------------


def trainer_yaml() -> dict:
    return OmegaConf.to_container(compose(*SMOKE).trainer)


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1])
def test_a_decay_outside_0_1_is_refused_in_one_line(decay):
    with pytest.raises(ValueError) as refused:
        TrainerConfig.of({**trainer_yaml(), "ema_decay": decay})
    assert str(refused.value) == f"trainer.ema_decay={decay!r} must be a number in (0, 1) or null"


def test_bad_ema_start_and_eval_weights_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^trainer.ema_start=-1 must be an integer >= 0 or null$"):
        check_types({"trainer": {"ema_start": -1}})
    with pytest.raises(ValueError, match=r"^eval.weights='best' must be one of raw, ema or null$"):
        check_types({"eval": {"weights": "best"}})
    assert TrainerConfig.of(trainer_yaml()).ema_decay is None  # off by default
    assert EvalConfig.of(OmegaConf.to_container(compose(*SMOKE).eval)).weights is None


def test_training_that_would_score_an_ema_it_does_not_keep_is_refused_before_any_data():
    with pytest.raises(ValueError) as refused:
        check_config(Settings.of(compose(*TRAIN, "eval.weights=ema")))
    message = str(refused.value)
    assert "trainer.ema_decay" in message and "\n" not in message
    check_config(Settings.of(compose(*TRAIN, "eval.weights=ema", EMA)))  # with an EMA: fine


# --- runs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """8 steps with an EMA, validated at steps 4 and 8, evaluated on the raw weights."""
    run_dir = tmp_path_factory.mktemp("ema") / "run"
    run(compose(*TRAIN, EMA), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """The same run without an EMA (the default), not evaluated."""
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    run(compose(*TRAIN, "eval.enabled=false"), run_dir)
    return run_dir


def saved(run_dir, name: str = "last.pt") -> dict:
    return checkpoint.load(run_dir / "checkpoints" / name)


def test_every_checkpoint_holds_the_ema_as_a_state_dict_of_the_model(ema_run, tmp_path):
    last, best = saved(ema_run), saved(ema_run, "best.pt")
    assert last["ema"].keys() == last["model"].keys()
    assert "ema" in best and best["state"]["step"] == best["state"]["best_step"]
    differs = [n for n, t in last["ema"].items() if not torch.equal(t, last["model"][n])]
    assert "output.weight" in differs
    # a step checkpoint (checkpoint averaging) keeps it too
    path = checkpoint.save_step(last, tmp_path, keep=2)
    assert torch.equal(checkpoint.load(path)["ema"]["output.weight"], last["ema"]["output.weight"])


def test_a_resumed_run_ends_with_the_ema_of_an_uninterrupted_one_bit_for_bit(ema_run, tmp_path):
    """Stopped after 4 of 8 steps (its checkpoint written, the process gone), then resumed by
    the same command with the full budget."""
    resumed = tmp_path / "resumed"
    run(compose(*TRAIN, EMA, "trainer.max_steps=4", "eval.enabled=false"), resumed)
    assert saved(resumed)["state"]["step"] == 4
    run(compose(*TRAIN, EMA, "eval.enabled=false"), resumed)
    straight, again = saved(ema_run), saved(resumed)
    assert again["state"]["step"] == straight["state"]["step"] == 8
    for entry in ("model", "ema"):
        for name, value in straight[entry].items():
            assert torch.equal(again[entry][name], value), f"{entry}: {name}"


def test_validation_logs_the_ema_loss_beside_the_raw_one(ema_run):
    events = EventAccumulator(str(ema_run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    raw = {e.step: e.value for e in events.Scalars("valid/loss")}
    averaged = {e.step: e.value for e in events.Scalars("valid/loss_ema")}
    assert sorted(raw) == sorted(averaged) == [4, 8]
    assert all(raw[step] != averaged[step] for step in raw)
    summary = json.loads((ema_run / "train_summary.json").read_text())
    # best.pt is chosen on the raw weights' loss
    assert summary["best_valid_loss"] == pytest.approx(min(raw.values()), rel=1e-6)


def test_eval_weights_ema_scores_the_ema_into_its_own_directory(ema_run, tmp_path):
    evaluate_main([f"run_dir={ema_run}", "eval.weights=ema"])
    out = ema_run / "evals" / "eval.weights=ema,step=8"
    metrics = json.loads((out / "metrics.json").read_text())
    raw = json.loads((ema_run / "metrics.json").read_text())  # training's own: raw weights
    assert metrics["weights"] == "ema" and "weights" not in raw
    assert metrics["checkpoint"] == raw["checkpoint"] == "best.pt"
    assert metrics["splits"]["test"]["loss"] != raw["splits"]["test"]["loss"]

    # the same as scoring a model that loaded the EMA state by hand
    cfg = Settings.of(compose_run_config(ema_run, []))
    tokenizer, model, step, path = load_run_model(ema_run, cfg, "best", torch.device("cpu"))
    model.load_state_dict(checkpoint.load(path)["ema"])
    by_hand = evaluate(cfg, ema_run, tmp_path / "by_hand", (tokenizer, model, step, path))
    timing = ("decode_seconds", "decode_tokens_per_s", "decode_sentences_per_s")
    for split, scores in by_hand["splits"].items():
        ours = metrics["splits"][split]
        assert {k: v for k, v in ours.items() if k not in timing} == {
            k: v for k, v in scores.items() if k not in timing
        }
        hypotheses = f"hypotheses.{split}.txt"
        assert (out / hypotheses).read_bytes() == (tmp_path / "by_hand" / hypotheses).read_bytes()


def test_a_run_without_an_ema_is_refused_in_one_line_naming_the_fix(plain_run):
    with pytest.raises(SystemExit) as refused:
        evaluate_main([f"run_dir={plain_run}", "eval.weights=ema"])
    message = str(refused.value.code)
    assert "holds no EMA weights" in message and "trainer.ema_decay" in message
    assert "\n" not in message
    assert not (plain_run / "evals" / "eval.weights=ema,step=8").exists()


def test_averaging_with_ema_averages_the_ema_weights_of_the_step_checkpoints(ema_run, tmp_path):
    """``eval.average_last=N`` with ``eval.weights=ema``: the mean of the EMA weights kept at
    the last N validations; step checkpoints without an EMA are refused in one line."""
    first, second = saved(ema_run), saved(ema_run)
    second["state"] = {**second["state"], "step": 12}
    second["ema"] = {k: v + 1 if v.is_floating_point() else v for k, v in second["ema"].items()}
    for payload in (first, second):
        checkpoint.save_step(payload, tmp_path / "with", keep=2)
    mean = averaged_weights(last_step_checkpoints(tmp_path / "with", 2), ema=True)
    torch.testing.assert_close(mean["output.weight"], first["ema"]["output.weight"] + 0.5)

    without = {key: first[key] for key in ("model", "state", "config")}
    checkpoint.save_step(without, tmp_path / "without", keep=2)
    with pytest.raises(CheckpointError, match="holds no EMA weights.*trainer.ema_decay"):
        averaged_weights(last_step_checkpoints(tmp_path / "without", 1), ema=True)


# --- off: nothing changes --------------------------------------------------------------------


def test_without_ema_decay_the_checkpoint_and_the_run_identity_are_as_before(plain_run):
    assert "ema" not in saved(plain_run) and "ema" not in saved(plain_run, "best.pt")
    cfg = OmegaConf.to_container(compose(*TRAIN), resolve=True)
    before = OmegaConf.to_container(compose(*TRAIN), resolve=True)  # a config from before EMA
    for key in ("ema_decay", "ema_start"):
        del before["trainer"][key]
    del before["eval"]["weights"]
    assert training_identity(cfg) == training_identity(before)
    assert run_dir_name("pe=rope", cfg) == run_dir_name("pe=rope", before)
    with_ema = OmegaConf.to_container(compose(*TRAIN, EMA), resolve=True)
    assert run_dir_name("pe=rope", with_ema) != run_dir_name("pe=rope", cfg)
