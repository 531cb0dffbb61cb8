"""A held-out set's clean part (:mod:`posenc.analysis.report.clean`): runs made before the holdout
dropped shared targets are scored again, from the hypotheses they wrote, on the held-out pairs
that share no side with their training pairs; runs whose set does not leak enter it whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import sentences, write_pair
from omegaconf import OmegaConf

from posenc.analysis.report.build import build_report
from posenc.analysis.report.clean import NEAR_SUFFIX, clean_entries, entries_by_split
from posenc.analysis.report.runs import DONE, Group, ReportError, Run
from posenc.config import data as typed
from posenc.config import flatten
from posenc.data.splits import load_corpora
from posenc.evaluation.metrics import corpus_scores

SIZE = 20


def data_node(directory: Path, **overrides) -> dict:
    node = {
        "kind": "local",
        "dir": str(directory),
        "train": ["corpus/train"],
        "valid": "corpus/train",
        "test": "corpus/train",
        "extra_tests": {},
        "holdout": {"inside": {"stem": "corpus/train", "size": SIZE}},
        "src_lang": "fr",
        "tgt_lang": "en",
        "train_size": None,
        "valid_size": None,
        "seed": 1,
        "clean": None,
    }
    return {**node, **overrides}


def finished_run(tmp_path: Path, data: dict, name: str) -> Run:
    """A run that translated every held-out pair but its first three correctly."""
    held_out = load_corpora(typed.data_config(data), with_train=False)["inside"]
    hyps = ["wrong words here"] * 3 + held_out.tgt[3:]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "hypotheses.inside.txt").write_text("\n".join(hyps) + "\n")
    (folder / "references.inside.txt").write_text("\n".join(held_out.tgt) + "\n")
    config = {"pe.name": "rope", "seed": 0, **flatten({"data": data})}
    metrics = {"splits": {"inside": corpus_scores(hyps, held_out.tgt)}}
    return Run(name, folder, config, status=DONE, metrics=metrics, label="rope")


@pytest.fixture
def twins(tmp_path: Path) -> Path:
    """Every English sentence twice, with two French sources (Tatoeba's way)."""
    src, tgt = sentences(60, 1), sentences(60, 2)
    write_pair(tmp_path / "data", "corpus/train", src + [f"{s} aussi" for s in src], tgt + tgt)
    return tmp_path / "data"


def test_a_leaking_set_is_scored_again_on_the_pairs_that_share_nothing_with_training(
    tmp_path, twins
):
    leaky = data_node(twins)  # made before holdout_drops: shared sources only
    run = finished_run(tmp_path, leaky, "old")
    found = clean_entries([Group("rope", "rope", "", [run])], ["inside"], tmp_path / "report")
    (entry,) = found["inside-clean"]["rope"]
    held_out = load_corpora(typed.data_config(leaky), with_train=False)["inside"]
    held_targets = set(held_out.tgt)
    kept = entry.references.read_text().splitlines()
    assert 0 < len(kept) < SIZE and entry.scores["sentences"] == len(kept)
    assert set(kept) <= held_targets
    assert (
        entry.scores["bleu"]
        == corpus_scores(entry.hypotheses.read_text().splitlines(), kept)["bleu"]
    )


def test_a_set_held_out_under_the_rule_is_clean_whole(tmp_path, twins):
    """Runs made under ``data.holdout_drops`` and before it can be read on one clean split."""
    run = finished_run(tmp_path, data_node(twins, holdout_drops=["source", "target"]), "new")
    found = clean_entries([Group("rope", "rope", "", [run])], ["inside"], tmp_path / "r")
    (entry,) = found["inside-clean"]["rope"]
    assert entry.scores == run.metrics["splits"]["inside"]
    assert entry.references == tmp_path / "new" / "references.inside.txt"


def sweep_of(tmp_path: Path, data: dict, seeds=(0, 1)) -> Path:
    """A sweep folder of rope runs (one per seed) scored on ``inside`` as
    :func:`finished_run`'s, their settings in ``config.yaml`` as a run writes them."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for seed in seeds:
        run = finished_run(sweep, data, f"pe=rope,seed={seed}")
        settings = {"pe": {"name": "rope"}, "seed": seed, "data": data}
        OmegaConf.save(OmegaConf.create(settings), run.path / "config.yaml")
        scores = {**run.metrics["splits"]["inside"], "loss": 1.0, "sentences": SIZE}
        (run.path / "metrics.json").write_text(
            json.dumps({"pe": "rope", "step": 4, "splits": {"inside": scores}})
        )
    return sweep


def test_the_report_focuses_on_a_clean_part_it_scored_again(tmp_path, twins):
    sweep = sweep_of(tmp_path, data_node(twins))
    report = build_report(sweep, focus="inside-clean", samples=20)
    markdown = report.path.read_text()
    assert "focus split `inside-clean`; splits: inside-clean, inside." in markdown


def test_the_report_refuses_a_clean_focus_where_no_set_leaks(tmp_path, twins):
    sweep = sweep_of(tmp_path, data_node(twins, holdout_drops=["source", "target"]))
    with pytest.raises(ReportError, match="split 'inside-clean' has no clean part"):
        build_report(sweep, focus="inside-clean", samples=20)
    markdown = build_report(sweep, focus="inside", samples=20).path.read_text()
    assert "splits: inside." in markdown  # a clean part equal to its split is not repeated


def test_the_near_clean_part_leaves_out_pairs_within_one_word_of_any_training_pair(tmp_path, twins):
    """A set held out under the rule is clean whole, but each source's twin (``X`` and ``X
    aussi``) stays in the training stem: one word apart, so ``NAME-nearclean`` leaves that pair
    out, and it is the same part whatever ``holdout_drops`` dropped."""
    rule = data_node(twins, holdout_drops=["source", "target"])
    groups = [Group("rope", "rope", "", [finished_run(tmp_path, rule, "new")])]
    found = entries_by_split(groups, ["inside", "inside-clean", "inside-nearclean"], tmp_path / "r")
    assert list(found) == ["inside", "inside-clean", "inside-nearclean"]
    assert found["inside-clean"] == found["inside"]
    (entry,) = found["inside-nearclean"]["rope"]
    kept = entry.references.read_text().splitlines()
    held_out = load_corpora(typed.data_config(rule), with_train=False)["inside"]
    twins_of = {
        s: s.removesuffix(" aussi") if s.endswith(" aussi") else f"{s} aussi" for s in held_out.src
    }
    twin_held_out = [twins_of[s] in held_out.src for s in held_out.src]  # none left to train on
    assert len(kept) == sum(twin_held_out) < SIZE
    leaky = clean_entries(
        [Group("rope", "rope", "", [finished_run(tmp_path, data_node(twins), "old")])],
        ["inside"],
        tmp_path / "r2",
        NEAR_SUFFIX,
    )
    assert leaky["inside-nearclean"]["rope"][0].references.read_text().splitlines() == kept
