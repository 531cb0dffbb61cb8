"""Each test sentence's loss: written by evaluation beside its hypotheses, equal to the split's
recorded loss, read back with clear errors, and written for runs evaluated before it existed only
when it matches their evaluation."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SMOKE, compose

from posenc.evaluation.backfill_losses import BackfillError, backfill, evaluations
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.runtime.sentence_losses import (
    SentenceLosses,
    losses_file,
    read_losses,
    write_losses,
)
from study.bucket_contrasts import main as bucket_main


def test_a_written_file_reads_back_with_its_split_loss(tmp_path):
    losses = SentenceLosses([3, 5, 12], [4.5, 10.25, 30.0], [3, 6, 11])
    write_losses(tmp_path / "losses.test.tsv", losses)
    back = read_losses(tmp_path / "losses.test.tsv")
    assert back == losses
    assert back.loss == pytest.approx((4.5 + 10.25 + 30.0) / 20)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a\tb\tc\n1\t2.0\t3\n", "line 1 is not the header"),
        ("source_tokens\tnll\ttarget_tokens\n1\t2.0\n", "line 2: expected"),
        ("source_tokens\tnll\ttarget_tokens\n1\tx\t3\n", "line 2: expected"),
        ("source_tokens\tnll\ttarget_tokens\n1\t2.0\t3\n0\t2.0\t3\n", "line 3: token counts"),
        ("source_tokens\tnll\ttarget_tokens\n1\tnan\t3\n", "line 2: token counts"),
    ],
)
def test_a_damaged_file_is_refused_in_one_line_naming_the_line(tmp_path, text, problem):
    path = tmp_path / "losses.test.tsv"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem) as error:
        read_losses(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run")
    cfg = compose(*SMOKE, "pe=rope", "trainer.max_steps=4", "trainer.valid_every=2")
    return directory, run(cfg, directory)


def test_evaluation_keeps_every_sentence_loss_and_they_make_the_recorded_loss(evaluated_run):
    directory, metrics = evaluated_run
    for split, scores in metrics["splits"].items():
        losses = read_losses(losses_file(directory, split))
        assert len(losses.nll) == scores["sentences"]
        assert losses.loss == pytest.approx(scores["loss"], abs=1e-5)
        buckets = {(b["min"], b["max"]): b for b in scores["buckets"] if b["sentences"]}
        for (low, high), bucket in buckets.items():
            inside = [i for i, n in enumerate(losses.source_tokens) if low <= n < high]
            assert len(inside) == bucket["sentences"]
            loss = sum(losses.nll[i] for i in inside) / sum(losses.target_tokens[i] for i in inside)
            assert loss == pytest.approx(bucket["loss"], abs=1e-5)


def test_a_run_evaluated_before_gets_the_same_file_from_its_checkpoint(evaluated_run, tmp_path):
    directory, metrics = evaluated_run
    kept = read_losses(losses_file(directory, "test"))
    losses_file(directory, "test").unlink()
    try:
        assert backfill(directory, ["test"], torch.device("cpu")) == ["test"]
        again = read_losses(losses_file(directory, "test"))
        assert again.source_tokens == kept.source_tokens
        assert again.nll == pytest.approx(kept.nll, abs=1e-5)
        assert backfill(directory, ["test"], torch.device("cpu")) == []  # nothing left to do
    finally:
        write_losses(losses_file(directory, "test"), kept)


def test_a_run_whose_evaluation_does_not_match_its_checkpoint_gets_no_file(evaluated_run):
    directory, metrics = evaluated_run
    kept = read_losses(losses_file(directory, "test"))
    metrics_path = directory / "metrics.json"
    original = metrics_path.read_text()
    changed = json.loads(original)
    changed["splits"]["test"]["loss"] += 0.01  # an evaluation of other weights or data
    metrics_path.write_text(json.dumps(changed))
    losses_file(directory, "test").unlink()
    try:
        with pytest.raises(BackfillError, match="recomputes to .* evaluate the run again"):
            backfill(directory, ["test"], torch.device("cpu"))
        assert not losses_file(directory, "test").exists()
        changed["splits"]["test"]["loss"] -= 0.01
        changed["step"] = metrics["step"] + 100  # evaluated at another step than best.pt's
        metrics_path.write_text(json.dumps(changed))
        with pytest.raises(BackfillError, match=f"its evaluation at step {metrics['step'] + 100}"):
            backfill(directory, ["test"], torch.device("cpu"))
    finally:
        metrics_path.write_text(original)
        write_losses(losses_file(directory, "test"), kept)


@pytest.fixture(scope="module")
def with_variants(evaluated_run):
    """The run and its standalone evaluation with RoPE's linear scaling by 2 as a variant."""
    directory, _ = evaluated_run
    evaluate_main(
        [f"run_dir={directory}", "eval.pe_variants={pi2: {scaling: linear, factor: 2.0}}"]
    )
    (out,) = (directory / "evals").glob("eval.pe_variants=*")
    return directory, out


def test_a_standalone_evaluation_with_test_time_variants_gets_each_variants_file(with_variants):
    directory, out = with_variants
    metrics = json.loads((out / "metrics.json").read_text())
    kept = {split: read_losses(losses_file(out, split)) for split in ("test", "test.pi2")}
    for split in kept:
        losses_file(out, split).unlink()
    try:
        assert evaluations([directory]) == [directory, out]
        assert sorted(backfill(out, ["test"], torch.device("cpu"))) == ["test", "test.pi2"]
        variant = metrics["variants"]["pi2"]["splits"]["test"]
        for split, scores in (("test", metrics["splits"]["test"]), ("test.pi2", variant)):
            again = read_losses(losses_file(out, split))
            assert again.nll == pytest.approx(kept[split].nll, abs=1e-5)
            assert again.loss == pytest.approx(scores["loss"], abs=1e-5)
        assert kept["test"].nll != pytest.approx(kept["test.pi2"].nll)  # the variant's own
    finally:
        for split, losses in kept.items():
            write_losses(losses_file(out, split), losses)


def test_the_bucket_contrasts_read_a_standalone_evaluations_variants(with_variants, capsys):
    directory, _ = with_variants
    args = [str(directory), "--eval", "eval.pe_variants=*", "--baseline", "rope"]
    bucket_main([*args, "--bucket", "0-1000", "--bootstrap", "200"])
    table = capsys.readouterr().out
    assert "Sources of 0-999 tokens (12 sentences): rope's loss" in table
    assert "rope [pi2] | 1 / 1 |" in table
    assert "one seed only" in table or "within noise" in table
