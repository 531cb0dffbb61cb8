"""A held-out set's clean part (:mod:`posenc.analysis.report.clean`): runs made before the holdout
dropped shared targets are scored again, from the hypotheses they wrote, on the held-out pairs
that share no side with their training pairs; runs whose set does not leak enter it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import sentences, write_pair

from posenc.analysis.report.clean import clean_entries
from posenc.analysis.report.runs import DONE, Group, Run
from posenc.config import flatten
from posenc.data.corpora import load_corpora
from posenc.evaluation.metrics import bleu_chrf

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
    held_out = load_corpora(data, with_train=False)["inside"]
    hyps = ["wrong words here"] * 3 + held_out.tgt[3:]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "hypotheses.inside.txt").write_text("\n".join(hyps) + "\n")
    (folder / "references.inside.txt").write_text("\n".join(held_out.tgt) + "\n")
    config = {"pe.name": "rope", "seed": 0, **flatten({"data": data})}
    metrics = {"splits": {"inside": bleu_chrf(hyps, held_out.tgt)}}
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
    held_out = load_corpora(leaky, with_train=False)["inside"]
    held_targets = set(held_out.tgt)
    kept = entry.references.read_text().splitlines()
    assert 0 < len(kept) < SIZE and entry.scores["sentences"] == len(kept)
    assert set(kept) <= held_targets
    assert (
        entry.scores["bleu"] == bleu_chrf(entry.hypotheses.read_text().splitlines(), kept)["bleu"]
    )


def test_a_set_held_out_under_the_rule_is_clean_whole(tmp_path, twins):
    """Runs made under ``data.holdout_drops`` and before it can be read on one clean split."""
    run = finished_run(tmp_path, data_node(twins, holdout_drops=["source", "target"]), "new")
    found = clean_entries([Group("rope", "rope", "", [run])], ["inside"], tmp_path / "r")
    (entry,) = found["inside-clean"]["rope"]
    assert entry.scores == run.metrics["splits"]["inside"]
    assert entry.references == tmp_path / "new" / "references.inside.txt"
