"""What depth does to an encoding's gap to a baseline (:mod:`study.depth_contrast`):
the difference of differences, judged with the training run as the unit (each seed's gap at
each depth), the test sentences' noise that of the whole four-term contrast."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pytest
from conftest import SCORED_REFERENCES, run_study
from conftest import scored_entry as entry
from sacrebleu import corpus_bleu, corpus_chrf
from scipy import stats

from posenc.analysis.decision import (
    compare_scores,
    contrast_deviation,
    holm,
    loss_statistics,
    sentence_statistics,
)
from posenc.analysis.report import findings
from posenc.analysis.report.findings import (
    EQUIVALENT,
    NOISE,
    NOT_RESOLVED,
    StatisticsCache,
    judge_pair,
    judge_together,
)
from posenc.analysis.report.runs import Run
from posenc.runtime.sentence_losses import SentenceLosses
from study.depth_contrast import (
    NARROWER,
    WIDER,
    DepthLoss,
    depth_contrasts,
    depth_losses,
    depth_table,
    gaps,
)
from study.headline import validation_losses

SEEDS = (0, 1, 2, 3, 4)


def split(tmp_path, name: str, systems: dict[str, int]) -> dict:
    """One split, ``test``, each system's hypotheses wrong every ``n``-th sentence."""
    folder = tmp_path / name
    folder.mkdir()
    return {"test": {s: [entry(folder, s, seed, n) for seed in SEEDS] for s, n in systems.items()}}


def seed_gaps(sweep: dict, metric: str) -> list[float]:
    """The slow form: rope's score minus nonepe's, seed by seed, by hand."""
    score = {
        s: {e.run.seed: e.scores[metric] for e in sweep["test"][s]} for s in ("rope", "nonepe")
    }
    return [score["rope"][seed] - score["nonepe"][seed] for seed in SEEDS]


def test_the_contrast_is_the_rule_on_each_seeds_gap_at_the_two_depths(tmp_path):
    shallow = split(tmp_path, "shallow", {"nonepe": 3, "rope": 4})
    deep = split(tmp_path, "deep", {"nonepe": 3, "rope": 11})
    (cell,) = depth_contrasts(shallow, deep, ["rope"], "nonepe", samples=50)
    for metric in ("bleu", "chrf"):
        found = cell.judgement.comparisons[metric]
        deep_gaps, shallow_gaps = seed_gaps(deep, metric), seed_gaps(shallow, metric)
        mean = statistics.fmean(deep_gaps) - statistics.fmean(shallow_gaps)
        assert found.difference == pytest.approx(mean)
        assert found.paired and found.seeds == (5, 5)
        by_seed = [d - s for d, s in zip(deep_gaps, shallow_gaps, strict=True)]
        assert found.seed_se == pytest.approx(statistics.stdev(by_seed) / 5**0.5)
        assert gaps(deep["test"]["rope"], deep["test"]["nonepe"], metric) == {
            s: pytest.approx(g) for s, g in enumerate(deep_gaps)
        }


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_the_sentence_noise_is_the_four_term_contrast_over_resampled_test_sets(tmp_path, metric):
    runs = [
        [entry(tmp_path / f"c{c}", "s", seed, every) for seed in (0, 1)]
        for c, every in enumerate((3, 5, 4, 7))
        if (tmp_path / f"c{c}").mkdir() is None
    ]
    texts = [[e.hypotheses.read_text().splitlines() for e in cell] for cell in runs]
    tables = [[sentence_statistics(metric, h, SCORED_REFERENCES) for h in cell] for cell in texts]
    signs = (1.0, -1.0, -1.0, 1.0)
    found = contrast_deviation(metric, list(zip(signs, tables, strict=True)), samples=30, seed=3)
    score = {"bleu": corpus_bleu, "chrf": corpus_chrf}[metric]
    rng = np.random.default_rng(3)
    values = []
    for _ in range(30):  # the same draws as the rule's
        index = rng.integers(0, len(SCORED_REFERENCES), len(SCORED_REFERENCES))
        refs = [[SCORED_REFERENCES[i] for i in index]]
        values.append(
            sum(
                sign * statistics.fmean(score([h[i] for i in index], refs).score for h in cell)
                for sign, cell in zip(signs, texts, strict=True)
            )
        )
    assert found == pytest.approx(statistics.stdev(values))


def test_a_gap_that_grows_with_depth_is_a_finding_and_one_that_stays_is_not(tmp_path):
    shallow = split(tmp_path, "shallow", {"nonepe": 3, "grows": 3, "stays": 4})
    deep = split(tmp_path, "deep", {"nonepe": 2, "grows": 0, "stays": 2})
    cells = {c.system: c for c in depth_contrasts(shallow, deep, ["grows", "stays"], "nonepe", 200)}
    assert cells["grows"].verdict() == WIDER
    assert cells["stays"].verdict() != WIDER
    flipped = depth_contrasts(deep, shallow, ["grows"], "nonepe", 200)
    assert flipped[0].verdict() == NARROWER
    table = "\n".join(depth_table(list(cells.values()), [], "1+1", "3+3"))
    assert "| grows | +" in table and WIDER in table and "one family (" in table


def test_validation_loss_gaps_are_compared_across_depths():
    shallow = {"nonepe": {0: 5.0, 1: 5.1, 2: 4.9}, "rope": {0: 4.9, 1: 5.0, 2: 4.8}}
    deep = {"nonepe": {0: 4.0, 1: 4.1, 2: 3.9}, "rope": {0: 3.5, 1: 3.61, 2: 3.39}}
    (cell,) = depth_losses({None: shallow}, {None: deep}, ["rope"], "nonepe")
    gap_deep, gap_shallow = [-0.5, -0.49, -0.51], [-0.1, -0.1, -0.1]
    assert cell.comparison.difference == pytest.approx(-0.4)
    expected = stats.ttest_rel(gap_deep, gap_shallow).pvalue
    assert cell.comparison.p == pytest.approx(expected) and cell.verdict() == WIDER
    (same,) = depth_losses({None: shallow}, {None: shallow}, ["rope"], "nonepe", margin=0.05)
    assert same.verdict() == EQUIVALENT
    noisy = {"nonepe": {0: 4.0, 1: 4.1, 2: 3.9}, "rope": {0: 3.6, 1: 4.4, 2: 3.9}}
    (wide,) = depth_losses({None: shallow}, {None: noisy}, ["rope"], "nonepe", margin=0.05)
    assert wide.verdict() == NOT_RESOLVED
    (plain,) = depth_losses({None: shallow}, {None: noisy}, ["rope"], "nonepe")
    assert plain.verdict() == NOISE
    lone = {None: {"nonepe": {0: 1.0}}}
    assert depth_losses({None: shallow}, lone, ["rope"], "nonepe")[0].verdict() == "-"


def test_losses_at_equal_steps_are_read_from_the_curves_and_judged_as_one_family():
    """``step`` reads the validation loss each run logged at that step (a run that did not is
    left out); every step's cells are one family under Holm's correction."""

    def run(seed: int, best: float, logged: dict[int, float]) -> Run:
        steps = np.array(sorted(logged), dtype=float)
        curve = (steps, np.array([logged[s] for s in sorted(logged)]))
        return Run(
            f"r{seed}",
            Path(f"r{seed}"),
            {"seed": seed},
            curves={"steps": curve},
            train={"best_valid_loss": best},
        )

    runs = [run(0, 3.0, {2000: 4.0, 4000: 3.5}), run(1, 3.1, {2000: 4.2})]
    assert dict(validation_losses(runs, 2000)) == {0: 4.0, 1: 4.2}
    assert dict(validation_losses(runs, 4000)) == {0: 3.5}
    assert dict(validation_losses(runs, None)) == {0: 3.0, 1: 3.1}
    shallow = {"nonepe": {0: 5.0, 1: 5.1, 2: 4.9}, "rope": {0: 4.9, 1: 5.0, 2: 4.8}}
    deep = {"nonepe": {0: 4.0, 1: 4.1, 2: 3.9}, "rope": {0: 3.5, 1: 3.62, 2: 3.39}}
    alone = depth_losses({2000: shallow}, {2000: deep}, ["rope"], "nonepe")
    both = depth_losses(
        {2000: shallow, 4000: shallow}, {2000: deep, 4000: deep}, ["rope"], "nonepe"
    )
    assert [c.step for c in both] == [2000, 4000]
    assert both[0].p_holm == pytest.approx(min(1.0, 2 * alone[0].comparison.p))
    table = "\n".join(depth_table([], both, "1+1", "3+3"))
    assert "validation loss at step 2,000 | validation loss at step 4,000" in table
    assert "validation losses are one family (2 tests)" in table and "BLEU" not in table


def test_the_script_refuses_a_bad_plan_before_reading_any_sweep(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("families: []\n")
    none = tmp_path / "none"
    done = run_study(
        "depth-contrast",
        "--shallow",
        f"a={none}",
        "--deep",
        f"b={none}",
        "--systems",
        "rope",
        "--out",
        tmp_path / "out",
        "--plan",
        plan,
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (f"depth_contrast: plan {plan}: 'families' lists no family")


def test_validation_sentences_kept_add_the_four_term_contrasts_resampled_noise():
    """For the best loss, runs that kept their validation sentences add the deviation of the
    whole difference of differences over resampled validation sets; losses at a step have no
    kept sentences and stay with the seeds alone."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 30, size=40)

    def kept() -> dict[int, np.ndarray]:
        return {
            s: loss_statistics(
                SentenceLosses([1] * 40, list(rng.gamma(4.0, 1.0, 40) * tokens), list(tokens))
            )
            for s in SEEDS[:3]
        }

    shallow = {"nonepe": {0: 5.0, 1: 5.1, 2: 4.9}, "rope": {0: 4.9, 1: 5.0, 2: 4.8}}
    deep = {"nonepe": {0: 4.0, 1: 4.1, 2: 3.9}, "rope": {0: 3.5, 1: 3.62, 2: 3.39}}
    low, high = {"nonepe": kept(), "rope": kept()}, {"nonepe": kept(), "rope": kept()}
    best, at_step = depth_losses(
        {None: shallow, 2000: shallow},
        {None: deep, 2000: deep},
        ["rope"],
        "nonepe",
        sentences=(low, high),
        samples=40,
    )
    runs = [list(side[name].values()) for side in (high, low) for name in ("rope", "nonepe")]
    terms = list(zip((1.0, -1.0, -1.0, 1.0), runs, strict=True))
    assert best.sentences and not at_step.sentences
    assert best.comparison.sentence_se == pytest.approx(contrast_deviation("loss", terms, 40))
    assert at_step.comparison.sentence_se == 0.0
    table = "\n".join(depth_table([], [best, at_step], "1+1", "3+3"))
    assert "resampled validation sentences as noise in 1 of 2 cells" in table


def test_a_family_declaring_losses_beside_bleu_and_chrf_is_one_holm_family(tmp_path):
    """As a plan declares it: every p of the BLEU/chrF cells and of the losses under one Holm."""
    good = [entry(tmp_path, "good", s, 9) for s in (0, 1, 2)]
    bad = [entry(tmp_path, "bad", s, 4) for s in (0, 1, 2)]
    judgements = [judge_pair(good, bad, 200, StatisticsCache())]
    losses = [
        DepthLoss("a", compare_scores({0: 1.0, 1: 1.1, 2: 0.9}, {0: 2.0, 1: 2.2, 2: 1.9})),
        DepthLoss("b", compare_scores({0: 1.0, 1: 1.2, 2: 0.8}, {0: 1.1, 1: 1.0, 2: 1.0})),
    ]
    raw = {("pair", *k): p for k, p in findings.tested_p(judgements).items()}
    raw |= {("one", i): c.comparison.p for i, c in enumerate(losses)}
    expected = holm(raw)
    judge_together(judgements, losses, {"bleu": 1.0, "chrf": 1.0, "valid_loss": 0.05})
    assert len(expected) == 4  # two metrics of the pair, two losses: one family of four
    for m in ("bleu", "chrf"):
        assert judgements[0].p_holm[m] == pytest.approx(expected[("pair", 0, m)])
    assert [c.p_holm for c in losses] == pytest.approx([expected[("one", i)] for i in (0, 1)])
    assert all(c.p_equivalence is not None for c in losses)
