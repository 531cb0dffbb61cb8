"""The harness end to end: compose the real config, train a few steps, decode, score."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import PE_NAMES, ROOT, SMOKE, compose
from omegaconf import open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc.config.settings import Settings
from posenc.evaluation.metrics import corpus_scores
from posenc.job import run
from posenc.runtime.sentence_losses import read_losses
from posenc.training import loop as train_module
from posenc.training import validation as validation_module


def scalar_steps(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("pe", PE_NAMES)
def test_every_encoding_trains_decodes_and_scores(pe, tmp_path):
    cfg = compose(*SMOKE, f"pe={pe}", "trainer.max_steps=6", "trainer.valid_every=3")
    metrics = run(cfg, tmp_path)
    test = metrics["splits"]["test"]
    assert metrics["pe"] == pe and metrics["step"] == 6
    assert 0 <= test["bleu"] <= 100 and test["bleu_signature"].startswith("nrefs:1")
    assert test["sentences"] == 12
    assert (tmp_path / "hypotheses.test.txt").read_text().count("\n") == 12
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    for tag in (
        "train/loss",
        "valid/loss",
        "train/lr",
        "train/tokens_per_s",
        "vs_train_seconds/train_loss",
    ):
        assert scalar_steps(tmp_path, tag), tag


def test_a_perfect_hypothesis_scores_bleu_100():
    refs = ["The cat sat on the mat.", "A second, longer sentence follows here."]
    scores = corpus_scores(refs, refs)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


@pytest.mark.parametrize("pools", [(), ("trainer.batch_pool=300",)], ids=["one pool", "pools"])
def test_an_interrupted_run_resumes_to_the_same_result_without_duplicated_steps(
    tmp_path, monkeypatch, pools
):
    """With pools of 300 of the 2,000 pairs the 20 steps cross pools, and the resumed run
    rebuilds the pool it was in."""
    overrides = (
        *SMOKE,
        *pools,
        "pe=rope",
        "trainer.max_steps=20",
        "trainer.valid_every=5",
        "trainer.log_every=1",
        "eval.enabled=false",
    )
    straight = tmp_path / "straight"
    run(compose(*overrides), straight)

    interrupted = tmp_path / "interrupted"
    real_validation = validation_module.validation_loss
    calls = {"n": 0}

    def crash_on_third_validation(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # as if killed at step 15, after checkpoint 10
        return real_validation(*args, **kwargs)

    monkeypatch.setattr(validation_module, "validation_loss", crash_on_third_validation)
    with pytest.raises(SystemExit, match="130"):  # one line, no traceback
        run(compose(*overrides), interrupted)
    monkeypatch.setattr(validation_module, "validation_loss", real_validation)
    assert (
        torch.load(interrupted / "checkpoints" / "last.pt", weights_only=True)["state"]["step"]
        == 10
    )
    run(compose(*overrides), interrupted)

    resumed = json.loads((interrupted / "train_summary.json").read_text())
    reference = json.loads((straight / "train_summary.json").read_text())
    assert resumed["steps"] == reference["steps"] == 20
    assert resumed["final_valid_loss"] == pytest.approx(reference["final_valid_loss"], rel=1e-5)
    for folder, summary in ((straight, reference), (interrupted, resumed)):
        kept = read_losses(folder / "valid_losses.tsv")  # the best validation's sentences
        assert kept.loss == pytest.approx(summary["best_valid_loss"], rel=1e-5)
    assert read_losses(interrupted / "valid_losses.tsv").nll == pytest.approx(
        read_losses(straight / "valid_losses.tsv").nll, rel=1e-4
    )
    for tag in ("train/loss", "valid/loss"):
        steps = [s for s, _ in scalar_steps(interrupted, tag)]
        assert steps == sorted(set(steps)), f"{tag} has duplicated steps"
        assert steps == [s for s, _ in scalar_steps(straight, tag)]
    seconds = [s for s, _ in scalar_steps(interrupted, "vs_train_seconds/train_loss")]
    assert seconds == sorted(set(seconds))


def test_rerunning_a_finished_run_does_nothing_new(tmp_path):
    cfg = compose(*SMOKE, "pe=nonepe", "trainer.max_steps=4", "trainer.valid_every=2")
    first = run(cfg, tmp_path)
    second = run(
        compose(*SMOKE, "pe=nonepe", "trainer.max_steps=4", "trainer.valid_every=2"), tmp_path
    )
    assert first == second


def test_a_nan_loss_stops_the_run_with_the_step_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    real_loss = train_module.summed_losses
    calls = {"n": 0}

    def nan_after_four(*args, **kwargs):
        loss, nll = real_loss(*args, **kwargs)
        calls["n"] += torch.is_grad_enabled()  # count training batches, not validation
        return (loss * float("nan") if calls["n"] > 4 else loss), nll

    monkeypatch.setattr(train_module, "summed_losses", nan_after_four)
    cfg = compose(*SMOKE, "pe=nonepe", "trainer.max_steps=10", "trainer.valid_every=2")
    with pytest.raises(SystemExit):
        run(cfg, tmp_path)
    failure = json.loads((tmp_path / "failed.json").read_text())
    assert "at step 5" in failure["message"] and "nan" in failure["message"]
    assert (tmp_path / "checkpoints" / "last.pt").exists()


def test_nan_policy_skip_skips_bad_batches(tmp_path, monkeypatch):
    real_loss = train_module.summed_losses
    calls = {"n": 0}

    def one_nan(*args, **kwargs):
        loss, nll = real_loss(*args, **kwargs)
        calls["n"] += torch.is_grad_enabled()
        return (
            (loss * float("nan") if calls["n"] == 3 and torch.is_grad_enabled() else loss),
            nll,
        )

    monkeypatch.setattr(train_module, "summed_losses", one_nan)
    cfg = compose(
        *SMOKE, "pe=nonepe", "trainer.max_steps=6", "trainer.nan_policy=skip", "eval.enabled=false"
    )
    run(cfg, tmp_path)
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["skipped_batches"] == 1


def test_impossible_model_settings_are_refused_before_data_is_read(tmp_path, caplog):
    """A single run refused writes nothing; a sweep's job records why, for its report."""
    cfg = compose(*SMOKE, "model.n_heads=3")
    with open_dict(cfg):  # local files that do not exist: reading them would fail
        cfg.data = {"kind": "local", "dir": str(tmp_path / "no-such-dir"), "train": ["x"]}
    with pytest.raises(SystemExit):
        run(cfg, tmp_path / "single")
    assert "not divisible" in caplog.text and not (tmp_path / "single").exists()
    assert run(cfg, tmp_path / "job", multirun=True) is None
    message = json.loads((tmp_path / "job" / "failed.json").read_text())["message"]
    assert "not divisible" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_the_machine_lacks_is_refused_before_anything_is_written(tmp_path, caplog):
    with pytest.raises(SystemExit):
        run(compose(*SMOKE, "device=cuda"), tmp_path / "single")
    assert "this machine has no CUDA device" in caplog.text
    assert not (tmp_path / "single").exists()


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(("flag", "key"), [((), "hydra.run.dir"), (("-m",), "hydra.sweep.dir")])
def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path, flag, key):
    """Once Hydra's traceback from its own mkdir; a read-only folder fails the same way."""
    (tmp_path / "file").write_text("not a folder")
    folder = tmp_path / "file" / "run"
    result = _cli(*flag, "experiment=smoke", f"{key}={folder}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {key}={folder} cannot be made or written to (Not a directory); choose a "
        f"folder you can write to: {key}=DIR"
    )
    assert "Traceback" not in result.stderr


def test_an_unknown_encoding_name_is_a_clear_error(tmp_path):
    result = _cli("pe=nope", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.startswith("train: pe=nope is no option of pe; did you mean pe=")


def test_a_multirun_of_two_encodings_produces_two_scored_runs(tmp_path):
    result = _cli(
        "-m",
        *SMOKE,
        "pe=nonepe,rope",
        "trainer.max_steps=4",
        "trainer.valid_every=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    runs = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/metrics.json"))
    # job directories name their overrides, budgets and paths aside
    readable = [name.split("@")[0] for name in runs]  # the overrides, then the settings' digest
    assert readable == ["pe=nonepe,trainer.valid_every=2", "pe=rope,trainer.valid_every=2"]


def test_test_time_encoding_variants_are_scored_with_the_trained_weights(tmp_path):
    cfg = compose(
        *SMOKE,
        "pe=rope",
        "trainer.max_steps=4",
        "trainer.valid_every=2",
        "+eval.pe_variants={pi2: {scaling: linear, factor: 2.0}}",
    )
    metrics = run(cfg, tmp_path)
    variant = metrics["variants"]["pi2"]
    assert variant["pe"] == {"scaling": "linear", "factor": 2.0}
    assert variant["splits"]["test"]["sentences"] == metrics["splits"]["test"]["sentences"]
    assert (tmp_path / "hypotheses.test.pi2.txt").exists()


def test_max_source_tokens_keeps_only_short_training_sources(tmp_path):
    from posenc.data.pools import PooledBatcher
    from posenc.training.inputs import prepare

    _, data = prepare(Settings.of(compose(*SMOKE)), tmp_path)
    short = PooledBatcher(data.train, 64, max_source_tokens=6)
    sources = [data.train.src[i] for batch in short.batches(0) for i in batch]
    assert sources and max(len(s) for s in sources) <= 6
    assert short.dropped > 0 and max(len(data.train.src[i]) for i in range(len(data.train))) > 6


def test_raising_max_steps_on_the_command_line_continues_the_same_run(tmp_path):
    """Budgets are not part of run directory names, so the README's promise holds: the same
    command with a larger ``trainer.max_steps`` continues the finished run, and its earlier
    evaluation is kept in ``evals/step=N/``."""
    common = (*SMOKE, "pe=rope", "trainer.valid_every=2", "eval.max_sentences=5")
    first = _cli(*common, "trainer.max_steps=4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = _cli(*common, "trainer.max_steps=6", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    (run_dir,) = (tmp_path / "outputs" / "runs" / "smoke").iterdir()
    assert run_dir.name.split("@")[0] == "pe=rope,trainer.valid_every=2"
    assert "resumed from" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["step"] == 6
    assert json.loads((run_dir / "evals" / "step=4" / "metrics.json").read_text())["step"] == 4


def test_a_run_that_cannot_teach_anything_says_so(tmp_path, caplog):
    """The old demo's trap: warmup longer than the budget, one validation point, empty output."""
    cfg = compose(
        *SMOKE,
        "pe=nonepe",
        "trainer.max_steps=3",
        "trainer.warmup_steps=10",
        "trainer.valid_every=100",
    )
    with caplog.at_level("INFO"):
        metrics = run(cfg, tmp_path)
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("test: ")]
    assert said[0] == "test: decoding 12 sentences"  # scoring says each split's phases
    assert re.fullmatch(r"test: BLEU .* \(12 sentences in \d+\.\d s: decoding .*\)", said[-1])
    assert "inside the 10-step warmup" in warnings and "never trainer.lr" in warnings
    assert "only 1 validation point(s)" in warnings
    test = metrics["splits"]["test"]
    if test["empty_hypotheses"] * 2 > test["sentences"]:
        assert "hypotheses are empty" in warnings


def test_trainer_compile_trains_through_torch_compile(tmp_path, monkeypatch):
    """``trainer.compile=true`` hands the training model to ``torch.compile`` (opt-in; here a
    recorder stands in for the compiler, which the slow test below runs for real)."""
    compiled = []

    def recording_compile(module):
        compiled.append(module)
        return module

    monkeypatch.setattr(torch, "compile", recording_compile)
    common = (*SMOKE, "pe=rope", "trainer.max_steps=2", "eval.enabled=false")
    run(compose(*common), tmp_path / "plain")
    assert compiled == []
    run(compose(*common, "trainer.compile=true"), tmp_path / "compiled")
    assert len(compiled) == 1 and isinstance(compiled[0], torch.nn.Module)


@pytest.mark.slow
def test_a_compiled_model_trains_to_the_same_loss(tmp_path):
    common = (*SMOKE, "pe=rope", "trainer.max_steps=4", "trainer.valid_every=2")
    plain = run(compose(*common, "eval.enabled=false"), tmp_path / "plain")
    assert plain is None
    compiled_cfg = compose(*common, "eval.enabled=false", "trainer.compile=true")
    run(compiled_cfg, tmp_path / "compiled")
    losses = [
        json.loads((tmp_path / name / "train_summary.json").read_text())["best_valid_loss"]
        for name in ("plain", "compiled")
    ]
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)


def test_progress_bars_are_drawn_on_a_terminal_only():
    """Piped into a file, a bar that is asked for draws nothing: no carriage-return redraws
    (the log lines say the same); one not asked for never draws."""
    import io

    from tqdm import tqdm

    from posenc.runtime.progress import bar_disabled

    piped = io.StringIO()
    for _ in tqdm(range(5), disable=bar_disabled(True), file=piped):
        pass
    assert piped.getvalue() == "" and bar_disabled(False) is True


def test_a_run_directory_pasted_unquoted_into_trainer_resume_works(tmp_path):
    """A run directory's name holds ``=`` and ``,``, which Hydra's grammar would refuse
    ("mismatched input '='"); the path is quoted for it."""
    first = _cli(*SMOKE, "seed=3", "trainer.max_steps=2", "eval.enabled=false", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    (last,) = (tmp_path / "outputs").rglob("last.pt")
    assert "=" in str(last) and "," in str(last)
    resumed = _cli(
        *SMOKE,
        "trainer.max_steps=4",
        "eval.enabled=false",
        f"trainer.resume={last.relative_to(tmp_path)}",
        f"hydra.run.dir={tmp_path / 'resumed'}",
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((tmp_path / "resumed" / "train_summary.json").read_text())
    assert summary["steps"] == 4
