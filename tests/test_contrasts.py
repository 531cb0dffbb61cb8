"""Contrasts between two chosen systems (``scripts/contrasts.py``): a claim such as "relative
positions beat sinusoids" is a finding only by the report's rules: paired bootstrap on the
pooled sentences of the shared seeds, Holm over the family, every seed, BLEU and chrF agreeing.
A decoding contrast sets each system under another decoding of the same runs (beam 5) against
their own (greedy) by the same rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, compose

from posenc.analysis.report.contrasts import (
    MISSING,
    contrast,
    contrasts_markdown,
    decoding_contrasts,
    decoding_markdown,
    judge,
    ranking_agreement,
)
from posenc.analysis.report.findings import DISAGREE, ONE_SEED, UNINFORMATIVE, SeedDifference
from posenc.analysis.report.runs import Entry, Run
from posenc.evaluation.metrics import bleu_chrf
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run

REFERENCES = [f"the cat number {i} sat on the mat near door {i % 7}" for i in range(40)]


def entry(tmp_path: Path, system: str, seed: int, garbage_every: int) -> Entry:
    """A finished run of ``system`` whose hypotheses equal the references but every
    ``garbage_every``-th one (0: none)."""
    folder = tmp_path / f"{system}-{seed}"
    folder.mkdir()
    hyps = [
        "x y z" if garbage_every and i % garbage_every == seed % garbage_every else ref
        for i, ref in enumerate(REFERENCES)
    ]
    (folder / "hyp.txt").write_text("\n".join(hyps) + "\n")
    (folder / "ref.txt").write_text("\n".join(REFERENCES) + "\n")
    run = Run(folder.name, folder, {"pe.name": system, "seed": seed})
    return Entry(system, run, bleu_chrf(hyps, REFERENCES), folder / "hyp.txt", folder / "ref.txt")


def test_a_system_ahead_on_every_seed_and_both_metrics_is_a_finding_either_way_round(tmp_path):
    systems = {
        "good": [entry(tmp_path, "good", s, 9) for s in (0, 1)],
        "bad": [entry(tmp_path, "bad", s, 2) for s in (0, 1)],
    }
    rows = [
        contrast(systems, "test", "good", "bad", 200),
        contrast(systems, "test", "bad", "good", 200),
    ]
    judge(rows, {"test": 80.0})
    assert [r.verdict for r in rows] == ["good ahead", "good ahead"]
    assert rows[0].seeds == (0, 1) and all(d > 0 for d in rows[0].differences["bleu"].per_seed)
    assert rows[1].differences["bleu"].mean == pytest.approx(-rows[0].differences["bleu"].mean)


def test_holm_adjusts_over_the_whole_family(tmp_path):
    systems = {
        "good": [entry(tmp_path, "good", s, 9) for s in (0, 1)],
        "bad": [entry(tmp_path, "bad", s, 2) for s in (0, 1)],
    }
    alone = [contrast(systems, "test", "good", "bad", 200)]
    raw = dict(alone[0].p_values)
    family = alone + [contrast(systems, "test", "bad", "good", 200) for _ in range(3)]
    judge(family, {"test": 80.0})
    assert family[0].p_values["bleu"] == pytest.approx(min(1.0, 4 * raw["bleu"]))


def test_one_seed_a_missing_system_and_the_noise_floor_are_no_findings(tmp_path):
    systems = {
        "good": [entry(tmp_path, "good", 0, 9)],
        "bad": [entry(tmp_path, "bad", 0, 2)],
    }
    rows = [
        contrast(systems, "test", "good", "bad", 200),
        contrast(systems, "test", "good", "absent", 200),
        contrast(systems, "news", "good", "bad", 200),
    ]
    judge(rows, {"test": 80.0, "news": 1.5})
    assert [r.verdict for r in rows] == [ONE_SEED, MISSING, UNINFORMATIVE]
    table = "\n".join(contrasts_markdown(rows, 200))
    assert "| test | good | absent | - |" in table and "200 resamples" in table


def test_metrics_pointing_opposite_ways_disagree(tmp_path):
    systems = {
        "a": [entry(tmp_path, "a", s, 9) for s in (0, 1)],
        "b": [entry(tmp_path, "b", s, 2) for s in (0, 1)],
    }
    rows = [contrast(systems, "test", "a", "b", 200)]
    rows[0].differences["chrf"] = SeedDifference((-1.0, -1.0), -1.0, -2.0)  # chrF: b ahead
    judge(rows, {"test": 80.0})
    assert rows[0].verdict == DISAGREE


def test_the_command_line_names_its_errors_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "contrasts.py"), str(tmp_path), "--pair", "a", "b"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"contrasts: no run directory (one with a config.yaml) under {tmp_path.resolve()}"
    ]


def test_the_rankings_agreement_is_kendalls_tau_over_each_systems_shared_seeds(tmp_path):
    """On seed 0 greedy ranks a > c > b and beam a > b > c: tau 1/3. b's greedy seed 1 (no beam
    run) is perfect and would rank it second, tau 1, were it counted."""
    systems = {
        "a": [entry(tmp_path, "a", 0, 0)],
        "b": [entry(tmp_path, "b", 0, 2), entry(tmp_path, "b", 1, 0)],
        "c": [entry(tmp_path, "c", 0, 3)],
    }
    decoded = {
        "a'": [entry(tmp_path, "a'", 0, 0)],
        "b'": [entry(tmp_path, "b'", 0, 3)],
        "c'": [entry(tmp_path, "c'", 0, 2)],
    }
    pairs = [("a", "a'"), ("b", "b'"), ("c", "c'")]
    rows = [contrast(systems | decoded, "test", d, s, 20) for s, d in pairs]
    assert [r.seeds for r in rows] == [(0,), (0,), (0,)]
    assert ranking_agreement(systems, decoded, pairs, rows) == pytest.approx(1 / 3)
    assert ranking_agreement(systems, decoded, pairs[:1], rows[:1]) is None


@pytest.fixture(scope="module")
def beam_sweep(tmp_path_factory):
    """Two encodings, rope with two seeds; beam 2 evaluated for every run but rope's seed 1."""
    sweep = tmp_path_factory.mktemp("sweep")
    train = (*SMOKE, "trainer.max_steps=2", "trainer.valid_every=2")
    for name, overrides in {
        "pe=rope": ("pe=rope",),
        "pe=rope,seed=1": ("pe=rope", "seed=1"),
        "pe=nonepe": ("pe=nonepe",),
    }.items():
        run(compose(*train, *overrides), sweep / name)
        if name != "pe=rope,seed=1":
            evaluate_main([f"run_dir={sweep / name}", "eval.beam_size=2"])
    return sweep


def test_a_decoding_contrast_sets_each_system_against_itself_on_the_runs_with_both(beam_sweep):
    comparison = decoding_contrasts(beam_sweep, "eval.beam_size=2,step=*", ["test"], 20)
    assert (comparison.decoding, comparison.own) == ("eval.beam_size=2", "eval.beam_size=1")
    pairs = {(r.first, r.second): r.seeds for r in comparison.rows}
    assert pairs == {
        ("rope (eval.beam_size=2)", "rope"): (0,),
        ("nonepe (eval.beam_size=2)", "nonepe"): (0,),
    }
    assert comparison.tau["test"] is not None
    table = "\n".join(decoding_markdown(comparison, 20))
    assert "- test: eval.beam_size=2 ahead of eval.beam_size=1 for 0 of 2 systems" in table


def test_a_decoding_no_run_has_is_refused_in_one_line(beam_sweep):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "contrasts.py"),
            str(beam_sweep),
            "--decoding",
            "eval.beam_size=7,step=*",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"contrasts: no run of {beam_sweep} has the evaluation 'eval.beam_size=7,step=*'"
    ]
