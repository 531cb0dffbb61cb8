"""Standalone evaluation (``python -m posenc.evaluation run_dir=RUN ...``) never replaces what
training wrote; its overrides are checked like ``train.py``'s; a continued run keeps its earlier
evaluation."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal

import pytest
from conftest import SMOKE, compose
from omegaconf import OmegaConf

from posenc.analysis.report.build import main as report_main
from posenc.analysis.report.runs import UNFINISHED, load_run
from posenc.evaluation import standalone
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.runtime.lock import run_lock

TRAIN = (*SMOKE, "pe=rope", "trainer.max_steps=4", "trainer.valid_every=2")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sweep") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


def own_files(run_dir):
    """The bytes of every file that training's own evaluation wrote."""
    names = ["metrics.json", "hypotheses.test.txt", "references.test.txt", "attention.npz"]
    return {name: (run_dir / name).read_bytes() for name in names}


def test_a_standalone_evaluation_goes_to_its_own_directory_and_replaces_nothing(trained, capsys):
    before = own_files(trained)
    evaluate_main([f"run_dir={trained}", "eval.use_cache=false"])
    out = trained / "evals" / "eval.use_cache=false,step=4"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["splits"]["test"]["use_cache"] is False
    assert (out / "hypotheses.test.txt").exists() and (out / "eval_config.yaml").exists()
    assert own_files(trained) == before
    printed = capsys.readouterr().out.splitlines()  # one line a split, then where the rest is
    test = metrics["splits"]["test"]
    assert printed[0] == (
        f"test: BLEU {test['bleu']:.2f}  chrF {test['chrf']:.2f}  ({test['sentences']} sentences)"
    )
    assert printed[-1] == f"metrics: {out / 'metrics.json'}"

    stamp = (out / "metrics.json").stat().st_mtime_ns
    evaluate_main([f"run_dir={trained}", "eval.use_cache=false"])  # the same evaluation again
    assert (out / "metrics.json").stat().st_mtime_ns == stamp  # read, not recomputed
    # how it runs is not what it scores: with a progress bar it is still the same evaluation
    evaluate_main([f"run_dir={trained}", "eval.use_cache=false", "trainer.progress=true"])
    assert (out / "metrics.json").stat().st_mtime_ns == stamp


def reported_decode_speed(report_dir) -> float:
    """The decoding speed in a report's CSV (one run, so the mean is the run's; test split)."""
    with open(report_dir / "report.csv", newline="") as handle:
        (value,) = [
            float(row["value"])
            for row in csv.DictReader(handle)
            if row["metric"] == "decode_tokens_per_s_mean" and row["split"] == "test"
        ]
    return value


def test_the_report_reads_the_runs_own_evaluation_unless_told_otherwise(trained):
    evaluate_main([f"run_dir={trained}", "eval.use_cache=false", "eval.beam_size=2"])
    name = "eval.beam_size=2,eval.use_cache=false,step=4"
    own = json.loads((trained / "metrics.json").read_text())["splits"]["test"]
    standalone = json.loads((trained / "evals" / name / "metrics.json").read_text())
    standalone = standalone["splits"]["test"]
    assert own["decode_tokens_per_s"] != standalone["decode_tokens_per_s"]
    report_main([str(trained.parent), "--out", str(trained.parent / "r1")])
    report_main([str(trained.parent), "--out", str(trained.parent / "r2"), "--eval", name])
    r1, r2 = trained.parent / "r1", trained.parent / "r2"
    assert reported_decode_speed(r1) == pytest.approx(own["decode_tokens_per_s"], abs=0.05)
    assert reported_decode_speed(r2) == pytest.approx(standalone["decode_tokens_per_s"], abs=0.05)
    # each report states the decoding its scores come from
    assert "beam_size=1," in (r1 / "report.md").read_text()
    assert "beam_size=2," in (r2 / "report.md").read_text()
    assert standalone["beam_size"] == 2 and own["beam_size"] == 1


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("eval.use_cach=false", "Could not override 'eval.use_cach': Key 'use_cach' is not in"),
        ("eval.use_cache=maybe", "eval.use_cache='maybe' must be true or false"),
        ("eval.checkpoint=newest", "eval.checkpoint='newest' must be one of best, last"),
        ("eval.max_sentences=0", "eval.max_sentences=0 must be an integer >= 1 or null"),
    ],
)
def test_a_typo_or_a_wrong_type_is_refused_in_one_line(trained, override, expected):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([f"run_dir={trained}", override])
    message = str(exit_info.value.code)
    assert expected in message and "\n" not in message
    assert not (trained / "evals" / f"{override},step=4").exists()


def test_a_run_without_a_checkpoint_or_a_failed_run_says_so(tmp_path):
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    OmegaConf.save(compose(*TRAIN), untrained / "config.yaml", resolve=True)
    with pytest.raises(SystemExit, match="has no checkpoint .*train it first"):
        evaluate_main([f"run_dir={untrained}"])
    (untrained / "failed.json").write_text('{"error": "DataError", "message": "no data"}')
    with pytest.raises(SystemExit, match="failed \\(DataError: no data\\); fix the cause"):
        evaluate_main([f"run_dir={untrained}"])
    with pytest.raises(SystemExit, match="config.yaml not found: is .* a posenc run"):
        evaluate_main([f"run_dir={tmp_path / 'nothing'}"])


def test_a_continued_run_keeps_its_earlier_evaluation(tmp_path):
    """Raising the budget continues the same run directory; the evaluation at the old step
    moves to ``evals/step=N/`` instead of being overwritten."""
    first = run(compose(*TRAIN), tmp_path)
    second = run(compose(*TRAIN[:-2], "trainer.max_steps=6", "trainer.valid_every=2"), tmp_path)
    assert first["step"] == 4 and second["step"] == 6
    archived = json.loads((tmp_path / "evals" / "step=4" / "metrics.json").read_text())
    assert archived == first
    assert (tmp_path / "evals" / "step=4" / "hypotheses.test.txt").exists()
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 6


def test_test_time_variants_can_be_asked_for_standalone(trained):
    evaluate_main([f"run_dir={trained}", "eval.pe_variants={pi2: {scaling: linear, factor: 2.0}}"])
    (out,) = (trained / "evals").glob("eval.pe_variants=*")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["variants"]["pi2"]["pe"] == {"scaling": "linear", "factor": 2.0}
    assert (out / "hypotheses.test.pi2.txt").exists() and not (
        trained / "hypotheses.test.pi2.txt"
    ).exists()
    # the report of that evaluation states its variants, not the run's empty mapping
    report_dir = trained.parent / "r_variants"
    report_main([str(trained.parent), "--out", str(report_dir), "--eval", out.name])
    report = (report_dir / "report.md").read_text()
    assert "pe_variants.pi2.scaling=linear" in report and "pe_variants={}" not in report
    assert "rope [pi2]" in report


def test_a_run_without_the_named_evaluation_says_whether_it_can_still_get_one(trained, tmp_path):
    """Under ``--eval``, a trained run lacking that evaluation is unfinished, and the note says
    when it has no checkpoint left to evaluate (it was trained on another machine, say)."""
    kept = load_run(trained, trained.parent, "eval.beam_size=9,step=*")
    assert (
        kept.status == UNFINISHED
        and kept.message == "trained, no evaluation eval.beam_size=9,step=*"
    )
    copy = tmp_path / "pe=rope"
    shutil.copytree(trained, copy, ignore=shutil.ignore_patterns("checkpoints"))
    lost = load_run(copy, tmp_path, "eval.beam_size=9,step=*")
    assert lost.message.endswith("(no checkpoint to evaluate)")


def test_a_stopped_evaluation_leaves_no_half_written_folder(trained, monkeypatch, capsys):
    """``timeout`` (a study's budget) stops an evaluation with SIGTERM: the folder it was
    writing is removed, it ends with one line and status 143, and the next call evaluates."""

    def stopped_midway(cfg, run_dir, work, *args):
        (work / "hypotheses.test.txt").write_text("half\n")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(standalone, "evaluate", stopped_midway)
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([f"run_dir={trained}", "eval.beam_size=3"])
    assert exit_info.value.code == 143
    assert capsys.readouterr().err.strip().splitlines() == [
        "posenc.evaluation: stopped (SIGTERM); nothing half-written was kept"
    ]
    assert [p.name for p in (trained / "evals").iterdir() if "beam_size=3" in p.name] == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler goes back


def test_a_run_that_is_training_can_be_evaluated_from_its_checkpoint(trained):
    """Training holds RUN/.lock; a standalone evaluation takes RUN/evals/.lock only: it scores
    the checkpoint it loads (its step names the folder) and writes nothing outside evals/."""

    def written():  # the run's own files, but the lock the test itself takes
        return {p: p.stat().st_mtime_ns for p in trained.iterdir() if p.is_file()} | {
            trained / ".lock": None
        }

    before = written()
    with run_lock(trained, "training"):
        evaluate_main([f"run_dir={trained}", "eval.use_cache=false", "eval.max_sentences=3"])
    assert written() == before
    assert list((trained / "evals").glob("*max_sentences=3*step=*/metrics.json"))
