"""Contrasts between two chosen systems (``scripts/contrasts.py``): a claim such as "relative
positions beat sinusoids" is a finding only by the report's rules: the decision rule whose unit
is the training run, Holm over the whole family at once, both systems above the quality floor,
BLEU and chrF agreeing. A decoding contrast sets each system under another decoding of the same
runs (beam 5) against their own (greedy) by the same rules."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, compose
from conftest import scored_entry as entry

from posenc.analysis.decision import holm
from posenc.analysis.report.contrasts import (
    MISSING,
    contrast,
    contrasts_markdown,
    decoding_contrasts,
    decoding_markdown,
    judge,
    ranking_agreement,
    sweep_contrasts,
)
from posenc.analysis.report.findings import (
    ONE_SEED,
    ONLY_BLEU,
    ONLY_CHRF,
    OPPOSITE,
    UNINFORMATIVE,
    StatisticsCache,
    verdict,
)
from posenc.analysis.report.runs import Entry, ReportError
from posenc.analysis.report.seeds import seed_selection, seeds_note
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run

SAMPLES = 200


def good_and_bad(tmp_path: Path, seeds=(0, 1, 2)) -> dict[str, list[Entry]]:
    return {
        "good": [entry(tmp_path, "good", s, 9) for s in seeds],
        "bad": [entry(tmp_path, "bad", s, 2) for s in seeds],
    }


def compared(systems, *pairs, split="test"):
    cache = StatisticsCache()
    rows = [contrast(systems, split, a, b, SAMPLES, cache) for a, b in pairs]
    judge(rows)
    return rows


def test_a_system_ahead_on_both_metrics_beyond_seeds_and_sentences_is_a_finding_either_way_round(
    tmp_path,
):
    rows = compared(good_and_bad(tmp_path), ("good", "bad"), ("bad", "good"))
    assert [r.verdict for r in rows] == ["good ahead", "good ahead"]
    bleu = [r.judgement.comparisons["bleu"] for r in rows]
    assert bleu[0].paired and bleu[0].seeds == (3, 3) and bleu[0].low > 0
    assert bleu[1].difference == pytest.approx(-bleu[0].difference)


def test_holm_adjusts_every_row_and_metric_as_one_family(tmp_path):
    systems = good_and_bad(tmp_path)
    rows = compared(systems, ("good", "bad"), ("bad", "good"), ("good", "bad"))
    raw = {(i, m): c.p for i, r in enumerate(rows) for m, c in r.judgement.comparisons.items()}
    adjusted = holm(raw)
    assert all(r.judgement.p_holm[m] == adjusted[(i, m)] for (i, m) in raw for r in [rows[i]])
    assert "Holm's method over the 6 tests above" in "\n".join(contrasts_markdown(rows, SAMPLES))


def test_the_family_counts_only_what_is_tested(tmp_path):
    """A row without two seeds a side or below the quality floor is no test, so the caption's
    count and the correction leave it out."""
    systems = {
        "good": [entry(tmp_path, "good", s, 9) for s in (0, 1)],
        "bad": [entry(tmp_path, "bad", s, 2) for s in (0, 1)],
        "single": [entry(tmp_path, "single", 0, 5)],
        "silent": [entry(tmp_path, "silent", s, 1) for s in (0, 1)],
    }
    rows = compared(systems, ("good", "bad"), ("good", "single"), ("good", "silent"))
    assert "Holm's method over the 2 tests above" in "\n".join(contrasts_markdown(rows, SAMPLES))


def test_one_seed_a_missing_system_and_the_quality_floor_are_no_findings(tmp_path):
    systems = {
        "good": [entry(tmp_path, "good", 0, 9)],
        "bad": [entry(tmp_path, "bad", 0, 2)],
        "silent": [entry(tmp_path, "silent", s, 1) for s in (0, 1)],
        "looping": [entry(tmp_path, "looping", s, 1, "la la la la la") for s in (0, 1)],
        "fine": [entry(tmp_path, "fine", s, 0) for s in (0, 1)],
    }
    rows = compared(
        systems,
        ("good", "bad"),
        ("good", "absent"),
        ("fine", "silent"),
        ("fine", "looping"),
    )
    assert [r.verdict for r in rows] == [ONE_SEED, MISSING, UNINFORMATIVE, UNINFORMATIVE]
    assert rows[3].judgement.loops == (0.0, 1.0)
    table = "\n".join(contrasts_markdown(rows, SAMPLES))
    assert "| test | good | absent | - |" in table and f"{SAMPLES} test sets" in table


def test_the_verdict_says_which_metric_is_significant_and_when_they_point_opposite_ways(tmp_path):
    judged = compared(good_and_bad(tmp_path), ("good", "bad"))[0].judgement
    significant, not_significant = 0.001, 0.5
    for p_bleu, p_chrf, expected in [
        (significant, not_significant, ONLY_BLEU),
        (not_significant, significant, ONLY_CHRF),
    ]:
        assert verdict(dataclasses.replace(judged, p_holm={"bleu": p_bleu, "chrf": p_chrf})) == (
            expected
        )
    chrf = dataclasses.replace(judged.comparisons["chrf"], difference=-1.0)
    opposite = dataclasses.replace(judged, comparisons={**judged.comparisons, "chrf": chrf})
    assert verdict(opposite) == OPPOSITE


def test_the_seeds_needed_are_given_for_what_is_not_a_finding(tmp_path):
    systems = {
        "a": [entry(tmp_path, "a", s, 9) for s in (0, 1, 2)],
        "b": [entry(tmp_path, "b", s, 8) for s in (0, 1, 2)],
    }
    row = compared(systems, ("a", "b"))[0]
    assert set(row.judgement.seeds_needed) == {"bleu", "chrf"}
    assert "seeds for 80% power" in "\n".join(contrasts_markdown([row], SAMPLES))


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


def test_the_rankings_agreement_is_kendalls_tau_over_each_systems_seeds_with_both(tmp_path):
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
    assert ranking_agreement(systems, decoded, pairs) == pytest.approx(1 / 3)
    assert ranking_agreement(systems, decoded, pairs[:1]) is None


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
    pairs = {(r.first, r.second): r.judgement.comparisons["bleu"].seeds for r in comparison.rows}
    assert pairs == {  # rope's seed 1 has no beam evaluation: its greedy run is left out too
        ("rope (eval.beam_size=2)", "rope"): (1, 1),
        ("nonepe (eval.beam_size=2)", "nonepe"): (1, 1),
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


def test_a_family_can_be_judged_on_some_seeds_for_every_system_alike(beam_sweep):
    """``--seeds``: seeds trained at another commit left out of every system at once."""
    both = sweep_contrasts(beam_sweep, [("rope", "nonepe")], ["test"], 20)
    only = sweep_contrasts(
        beam_sweep, [("rope", "nonepe")], ["test"], 20, seeds=seed_selection("1")
    )
    assert both[0].judgement.comparisons["bleu"].seeds == (2, 1)
    assert only[0].judgement is None  # nonepe has no seed 1: nothing to compare
    with pytest.raises(ReportError, match=r"no run of seeds \[7\]"):
        sweep_contrasts(beam_sweep, [("rope", "nonepe")], ["test"], 20, seeds=seed_selection("7"))
    assert seed_selection("1-3,5") == {1, 2, 3, 5} and seeds_note(frozenset({2, 1})) == (
        "Runs of seeds 1, 2 only, for every system alike."
    )
    with pytest.raises(argparse.ArgumentTypeError, match="names no training seeds"):
        seed_selection("one")


def test_with_a_plans_margins_no_finding_is_equivalent_only_when_two_one_sided_tests_say_so(
    tmp_path,
):
    """Not significant is not the same: a small difference is "equivalent" within wide margins
    and "not resolved" within margins its interval (about +-15 BLEU here) does not fit."""
    systems = {
        "a": [entry(tmp_path, "a", s, 9) for s in (0, 1, 2)],
        "b": [entry(tmp_path, "b", s, 11) for s in (0, 1, 2)],
    }
    verdicts = []
    for margin in (100.0, 0.5):
        rows = [contrast(systems, "test", "a", "b", SAMPLES, StatisticsCache())]
        judge(rows, {"bleu": margin, "chrf": margin})
        verdicts.append(rows[0].verdict)
    assert verdicts == ["equivalent within the margins", "not resolved"]
    table = "\n".join(contrasts_markdown(rows, SAMPLES, {"bleu": 0.5, "chrf": 0.5}))
    assert "p equivalent (BLEU, chrF)" in table and "(BLEU 0.5, chrF 0.5 points)" in table
    assert "p equivalent" not in "\n".join(contrasts_markdown(compared(systems, ("a", "b")), 9))


def test_the_table_opens_with_its_plans_family_or_says_it_is_exploratory(beam_sweep, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "plan: toy\ndeclared: 2026-11-29\nbaseline: nonepe\nmargins: {bleu: 1, chrf: 1}\n"
        "families:\n  - {name: pairs, contrast: a - b, metrics: [bleu, chrf], tests: 2}\n"
    )
    command = [sys.executable, str(ROOT / "scripts" / "contrasts.py"), str(beam_sweep)]
    command += ["--pair", "rope", "nonepe"]
    first_lines = []
    for extra in ([], ["--plan", str(plan), "--family", "pairs"]):
        result = subprocess.run(command + extra, capture_output=True, text=True, check=True)
        first_lines.append(result.stdout.splitlines()[:3])
    assert first_lines[0][0].startswith("**Exploratory**: these comparisons are not a family")
    assert first_lines[1][0].startswith("Family 'pairs' (2 tests) of plan `toy` (sha256 ")
    # nonepe has one seed here: nothing is tested, and the page says so against the plan
    assert first_lines[1][2].startswith("**The family declares 2 tests; this table holds 0**")
