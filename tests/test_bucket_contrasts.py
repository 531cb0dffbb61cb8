"""Loss differences on a length bucket (``python -m study bucket-contrasts``): a system's lower
loss on long sources is a finding only by the decision rule whose unit is the training run, the
bucket's sentences a second noise, after Holm's correction over the systems."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_study

from posenc.analysis.decision import holm
from posenc.analysis.plan import load_plan
from posenc.analysis.report.runs import Entry, Run
from posenc.runtime.sentence_losses import SentenceLosses, write_losses
from study.bucket_contrasts import (
    HIGHER,
    LOWER,
    NOISE,
    ONE_SEED,
    bucket_contrasts,
    contrast_page,
    contrast_table,
    parse_bucket,
    sentence_sd,
)

SOURCES = [5] * 40 + [90] * 60  # 40 short sentences, 60 long ones (bucket 80-120)
TARGETS = [4] * 40 + [80] * 60


def entry(tmp_path, system: str, seed: int, per_token: np.ndarray) -> Entry:
    """A run of ``system`` whose sentences cost ``per_token`` nats per target token each."""
    folder = tmp_path / f"{system}-{seed}"
    folder.mkdir()
    nll = [float(x) * t for x, t in zip(per_token, TARGETS, strict=True)]
    write_losses(folder / "losses.test.tsv", SentenceLosses(SOURCES, nll, TARGETS))
    run = Run(folder.name, folder, {"pe.name": system, "seed": seed})
    return Entry(system, run, {}, folder / "h", folder / "r", folder / "losses.test.tsv")


def noisy(seed: int, shift: float, sd: float = 0.5) -> np.ndarray:
    return 6.0 + shift + np.random.default_rng(seed).normal(0.0, sd, len(SOURCES))


def systems_of(tmp_path, shifts: dict[str, list[float]], sd: float = 0.5) -> dict:
    """Each system's runs: seed s's sentences share their noise across systems (the same
    sentences are hard for every model), plus the system's shift on that seed."""
    return {
        name: [entry(tmp_path, name, s, noisy(s, shift, sd)) for s, shift in enumerate(seeds)]
        for name, seeds in shifts.items()
    }


def test_a_lower_loss_beyond_the_seed_and_sentence_noise_is_a_finding(tmp_path):
    systems = systems_of(
        tmp_path,
        {"base": [0, 0, 0], "tuned": [-0.2, -0.25, -0.2], "broken": [0.3, 0.2, 0.3]},
    )
    found = {c.system: c for c in bucket_contrasts(systems, "base", (80, 120), 2000).contrasts}
    assert found["tuned"].verdict == LOWER and found["broken"].verdict == HIGHER
    tuned = found["tuned"].comparison
    assert tuned.paired and tuned.difference == pytest.approx(-0.65 / 3)
    assert tuned.high < 0
    assert list(found) == ["tuned", "broken"]  # lowest loss first, not by name


def test_a_difference_the_seeds_disagree_on_is_within_noise(tmp_path):
    systems = systems_of(tmp_path, {"base": [0, 0, 0], "mixed": [-0.4, -0.4, 0.1]})
    (mixed,) = bucket_contrasts(systems, "base", (80, 120), 2000).contrasts
    assert mixed.verdict == NOISE and mixed.seeds_needed is not None


def test_one_seed_is_never_tested(tmp_path):
    systems = systems_of(tmp_path, {"base": [0], "better": [-0.3]})
    (better,) = bucket_contrasts(systems, "base", (80, 120), 2000).contrasts
    assert better.verdict == ONE_SEED and better.comparison.p is None and better.p_holm is None


def test_sentence_noise_larger_than_the_difference_is_within_noise(tmp_path):
    # each sentence's own difference is noise of sd 2 nats a token around -0.02
    base = systems_of(tmp_path, {"base": [0, 0]}, sd=0.0)["base"]
    rng = np.random.default_rng(7)
    other = [entry(tmp_path, "other", s, 6.0 - 0.02 + rng.normal(0, 2, 100)) for s in (0, 1)]
    (contrast,) = bucket_contrasts(
        {"base": base, "other": other}, "base", (80, 120), 2000
    ).contrasts
    assert contrast.verdict == NOISE and contrast.comparison.sentence_se > 0.1


def test_holm_corrects_over_the_systems_compared(tmp_path):
    shifts = {"base": [0, 0, 0]} | {f"s{i}": [-0.05, -0.02, -0.04] for i in range(4)}
    contrasts = bucket_contrasts(systems_of(tmp_path, shifts), "base", (80, 120), 500).contrasts
    adjusted = holm({c.system: c.comparison.p for c in contrasts})
    assert all(c.p_holm == adjusted[c.system] for c in contrasts)


def test_a_named_family_is_judged_and_corrected_alone(tmp_path):
    shifts = {"base": [0, 0, 0]} | {f"s{i}": [-0.05, -0.02, -0.04] for i in range(4)}
    systems = systems_of(tmp_path, shifts)
    family = bucket_contrasts(systems, "base", (80, 120), 500, family=["s1", "s3"]).contrasts
    assert sorted(c.system for c in family) == ["s1", "s3"]
    adjusted = holm({c.system: c.comparison.p for c in family})
    assert all(c.p_holm == adjusted[c.system] for c in family)
    everyone = bucket_contrasts(systems, "base", (80, 120), 500).contrasts
    assert {c.system: c.p_holm for c in everyone}["s1"] > {c.system: c.p_holm for c in family}["s1"]
    with pytest.raises(ValueError, match="no system 'rope' in the sweep; name systems as"):
        bucket_contrasts(systems, "base", (80, 120), 500, family=["s1", "rope"])


def test_the_sentence_noise_matches_a_slow_reference():
    rng = np.random.default_rng(3)
    system = [rng.normal(60, 10, 30) for _ in range(2)]
    baseline = [rng.normal(61, 10, 30) for _ in range(3)]
    tokens = rng.integers(5, 15, size=30).astype(float)
    found = sentence_sd(system, baseline, tokens, 400, np.random.default_rng(11))
    slow = np.random.default_rng(11)
    idx = slow.integers(0, 30, size=(400, 30))
    differences = []
    for row in idx:  # each resample: the mean over runs of each side's loss per token
        per_token = sum(tokens[i] for i in row)
        mean = [
            np.mean([sum(run[i] for i in row) / per_token for run in side])
            for side in (system, baseline)
        ]
        differences.append(mean[0] - mean[1])
    assert found == pytest.approx(np.std(differences, ddof=1))


def test_only_the_bucket_counts(tmp_path):
    base = [
        entry(tmp_path, "base", 0, np.full(100, 6.0)),
        entry(tmp_path, "base", 1, np.full(100, 6.0)),
    ]
    short_worse = np.concatenate([np.full(40, 9.0), np.full(60, 6.0)])  # worse on short only
    other = [entry(tmp_path, "other", s, short_worse) for s in (0, 1)]
    (contrast,) = bucket_contrasts({"base": base, "other": other}, "base", (80, 120), 200).contrasts
    assert contrast.comparison.difference == 0.0


def test_the_table_names_the_bucket_the_baseline_and_the_correction(tmp_path):
    systems = systems_of(tmp_path, {"base": [0, 0, 0], "better": [-0.3, -0.3, -0.32]})
    table = contrast_table(bucket_contrasts(systems, "base", (80, 120), 500))
    assert "Sources of 80-119 tokens (60 sentences): base's loss" in table
    assert "Holm over 1 systems" in table and f"| {LOWER}" in table


def test_bad_input_is_refused_in_one_line(tmp_path):
    systems = systems_of(tmp_path, {"base": [0], "other": [0.1]})
    with pytest.raises(ValueError, match="no system 'nonepe'"):
        bucket_contrasts(systems, "nonepe", (80, 120))
    with pytest.raises(ValueError, match="no sentence has a source of 200 to 299"):
        bucket_contrasts(systems, "base", (200, 300))
    with pytest.raises(ValueError, match="write it as LOW-HIGH"):
        parse_bucket("80:120")
    (tmp_path / "base-0" / "losses.test.tsv").unlink()
    with pytest.raises(ValueError, match="no sentence losses for base.*sentence_losses.py"):
        bucket_contrasts(systems, "base", (80, 120))


PLAN = """\
plan: toy
declared: 2026-11-29
baseline: base
families:
  - name: length against base
    contrast: system - base
    metrics: [test_loss]
    tests: 2
"""


def test_the_page_names_its_plans_family_or_says_it_is_exploratory(tmp_path):
    systems = systems_of(tmp_path, {"base": [0, 0, 0], "better": [-0.3, -0.3, -0.32]})
    comparison = bucket_contrasts(systems, "base", (80, 120), 500)
    (tmp_path / "plan.yaml").write_text(PLAN)
    plan = load_plan(tmp_path / "plan.yaml")
    page = contrast_page(comparison, plan, "length against base")
    assert page.startswith(
        f"Family 'length against base' (2 tests) of plan `toy` (sha256 {plan.digest})"
    )
    assert "**The family declares 2 tests; this table holds 1**" in page
    assert page.endswith(contrast_table(comparison))
    assert contrast_page(comparison, None, None).startswith("**Exploratory**")


def test_a_bad_plan_is_refused_before_any_sweep_is_read(tmp_path):
    (tmp_path / "plan.yaml").write_text("- a\n")
    done = run_study("bucket-contrasts", tmp_path / "none", "--plan", tmp_path / "plan.yaml")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"bucket-contrasts: plan {tmp_path / 'plan.yaml'}: must be a mapping of keys, got list"
    )
