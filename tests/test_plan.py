"""A study's analysis plan (:mod:`posenc.analysis.plan`): read and checked as untrusted input,
recorded by the SHA-256 of its bytes, and the line every table of verdicts opens with, which
calls a family exploratory unless a plan declared it before its runs."""

from __future__ import annotations

import hashlib

import pytest
from conftest import ROOT, run_study

from posenc.analysis.plan import BEFORE, PlanError, declared_tests_note, load_plan, provenance

PLANS = ROOT / "docs" / "study" / "plans"

GOOD = """\
plan: toy
declared: 2026-11-28
baseline: nonepe
margins: {bleu: 1.0, valid_loss: 0.05}
families:
  - name: main
    contrast: system - baseline
    metrics: [bleu, chrf]
    tests: 6
  - name: later
    contrast: system - baseline
    metrics: [valid_loss]
    tests: 2
    declared: after the results of main
"""


def write(tmp_path, text: str):
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_plan_is_read_with_its_digest_families_and_margins(tmp_path):
    path = write(tmp_path, GOOD)
    plan = load_plan(path)
    assert plan.name == "toy" and plan.declared == "2026-11-28" and plan.baseline == "nonepe"
    assert plan.digest == hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    assert plan.margins == {"bleu": 1.0, "valid_loss": 0.05}
    assert [f.name for f in plan.families] == ["main", "later"]
    assert [f.tests for f in plan.families] == [6, 2]
    assert plan.family("main").holm_within == ()  # by default one correction over the family
    path.write_text(GOOD.replace("tests: 2", "tests: 2\n    holm_within: [depth, kind]"))
    assert load_plan(path).family("later").holm_within == ("depth", "kind")
    path.write_text(GOOD)
    assert not plan.family("main").exploratory and plan.family("later").exploratory
    path.write_text(GOOD.replace("tests: 6", "tests: 7"))
    assert load_plan(path).digest != plan.digest  # one byte changed: another plan


def test_the_opening_line_names_the_plan_or_says_exploratory(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    declared = provenance(plan, "main")
    assert declared == (
        f"Family 'main' (6 tests) of plan `toy` (sha256 {plan.digest}), declared on "
        f"2026-11-28 {BEFORE}."
    )
    assert provenance(plan, "later").startswith("**Exploratory**: Family 'later'")
    assert "formed after the results of main" in provenance(plan, "later")
    assert provenance(plan, "other").startswith("**Exploratory**: plan `toy`")
    assert provenance(None, None).startswith("**Exploratory**")
    assert provenance(plan, None).startswith("**Exploratory**")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("plan: toy", "plan: toy\nextra: 1"), "unknown key 'extra'"),
        (("tests: 6", "tests: 0"), "'tests' must be at least 1"),
        (("tests: 6", "tests: six"), "'tests' must be a int"),
        (("bleu: 1.0", "bleu: -1"), "'margins' must map metrics to positive numbers"),
        (("name: later", "name: main"), "two families share a name"),
        (("metrics: [bleu, chrf]", "metrics: []"), "'metrics' must list metric names"),
        (("declared: 2026-11-28\n", ""), "'declared' must give the date"),
        (("    tests: 6\n", "    tests: 6\n    weight: 2\n"), "unknown key 'weight'"),
        (("    tests: 6\n", "    tests: 6\n    holm_within: [seed]\n"), "'holm_within' must list"),
        (("    tests: 6\n", "    tests: 6\n    holm_within: kind\n"), "'holm_within' must list"),
    ],
)
def test_a_bad_plan_is_one_line_naming_the_key(tmp_path, change, message):
    old, new = change
    assert old in GOOD
    with pytest.raises(PlanError, match=message) as caught:
        load_plan(write(tmp_path, GOOD.replace(old, new, 1)))
    assert "\n" not in str(caught.value) and "plan.yaml" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [("- a\n- b\n", "must be a mapping"), ("plan: [\n", "not YAML"), ("", "must be a mapping")],
)
def test_what_is_not_a_plan_is_refused(tmp_path, text, message):
    with pytest.raises(PlanError, match=message):
        load_plan(write(tmp_path, text))
    with pytest.raises(PlanError, match="cannot be read"):
        load_plan(tmp_path / "absent.yaml")


@pytest.mark.skipif(not PLANS.is_dir(), reason="docs/ set aside (a GPU machine's copy)")
def test_every_declared_plan_of_the_study_reads():
    plans = sorted(PLANS.glob("*.yaml"))
    assert plans
    for path in plans:
        plan = load_plan(path)
        assert plan.name == path.stem


def test_the_headline_refuses_a_bad_plan_before_reading_any_sweep(tmp_path):
    plan = write(tmp_path, "- a\n")
    none, out = tmp_path / "none", tmp_path / "out"
    done = run_study(
        "headline", "--sweep", f"d={none}", "--systems", "rope", "--out", out, "--plan", plan
    )
    assert done.returncode != 0
    assert (
        done.stderr.strip()
        == f"headline: plan {tmp_path / 'plan.yaml'}: must be a mapping of keys, got list"
    )


def test_a_table_says_when_it_holds_other_tests_than_its_family_declares(tmp_path):
    plan = load_plan(write(tmp_path, GOOD))
    declared = plan.family("main").tests
    assert declared_tests_note(plan, "main", declared) is None
    assert (
        declared_tests_note(None, "main", 3) is None and declared_tests_note(plan, None, 3) is None
    )
    assert declared_tests_note(plan, "main", declared + 2).startswith(
        f"**The family declares {declared} tests; this table holds {declared + 2}**"
    )
