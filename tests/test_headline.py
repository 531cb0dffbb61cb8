"""The headline (``python -m study headline``): each system against a baseline by split and depth,
every cell judged by the decision rule as one family, drawn as small multiples."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_study
from conftest import scored_entry as entry

from posenc.analysis.decision import contrast_deviation, loss_statistics
from posenc.analysis.report import findings
from posenc.analysis.report.findings import (
    EQUIVALENT,
    NOISE,
    NOT_RESOLVED,
    ONE_SEED,
    UNINFORMATIVE,
    holm,
)
from posenc.runtime.sentence_losses import SentenceLosses
from study.headline import (
    MAX_SYSTEMS,
    change,
    correction_note,
    depth_changes,
    headline,
    headline_table,
    judge_headline,
    loss_headline,
    loss_table,
    plot_headline,
    plot_loss_headline,
)


def sweep(tmp_path, depth: str, systems: dict[str, int], seeds=(0, 1, 2)) -> dict:
    """One split, ``test``, with each system's hypotheses wrong every ``n``-th sentence."""
    folder = tmp_path / depth
    folder.mkdir()
    return {
        "test": {
            name: [entry(folder, name, s, every) for s in seeds] for name, every in systems.items()
        }
    }


def test_each_system_is_set_against_the_baseline_at_every_depth(tmp_path):
    sweeps = {
        "1 layer": sweep(tmp_path, "one", {"nonepe": 2, "rope": 9}),
        "3 layers": sweep(tmp_path, "three", {"nonepe": 2, "rope": 9}, seeds=(0,)),
    }
    cells = headline(sweeps, ["rope", "absent"], "nonepe", samples=200)
    at = {(c.depth, c.system): c for c in cells}
    assert at["1 layer", "rope"].verdict() == "ahead"
    assert at["3 layers", "rope"].verdict() == ONE_SEED
    assert at["1 layer", "absent"].verdict() == "-"
    table = "\n".join(headline_table(cells, "bleu", "nonepe", correction_note(cells, [])))
    assert "| system | 1 layer, test | 3 layers, test |" in table
    assert "| rope | +" in table and " ahead |" in table
    assert "(1 layer: 2 + 0 tests, 3 layers: 0 + 0 tests)." in table  # it states its families
    assert plot_headline(cells, "bleu", "nonepe", tmp_path / "h.png").stat().st_size > 0


def test_each_depth_is_its_own_family_so_adding_one_leaves_the_others_verdicts(tmp_path):
    shallow = sweep(tmp_path, "one", {"nonepe": 2, "rope": 4, "alibi": 3})
    alone = headline({"1 layer": shallow}, ["rope", "alibi"], "nonepe", samples=200)
    deep = sweep(tmp_path, "three", {f"s{i}": 2 for i in range(8)} | {"nonepe": 3})
    both = headline(
        {"1 layer": shallow, "3 layers": deep}, ["rope", "alibi"] + list(deep), "nonepe", 200
    )
    before = {(c.system, c.split): (c.verdict(), c.judgement.p_holm) for c in alone}
    after = {
        (c.system, c.split): (c.verdict(), c.judgement.p_holm)
        for c in both
        if c.depth == "1 layer" and c.system in ("rope", "alibi")
    }
    assert before == after
    losses = {"1 layer": {"nonepe": {0: 5.0, 1: 5.1, 2: 5.05}, "rope": {0: 4.5, 1: 4.62, 2: 4.5}}}
    wider = losses | {"3 layers": {"nonepe": {0: 4.0, 1: 4.1}, "rope": {0: 3.9, 1: 4.05}}}
    one = [c.p_holm for c in loss_headline(losses, ["rope"], "nonepe")]
    two = [c.p_holm for c in loss_headline(wider, ["rope"], "nonepe") if c.depth == "1 layer"]
    assert one == two


def test_a_figure_holds_at_most_max_systems(tmp_path):
    sweeps = {"d": sweep(tmp_path, "d", {"nonepe": 2}, seeds=(0,))}
    cells = headline(sweeps, [f"s{i}" for i in range(MAX_SYSTEMS + 1)], "nonepe", samples=10)
    with pytest.raises(ValueError, match=f"draw at most {MAX_SYSTEMS} a figure"):
        plot_headline(cells, "bleu", "nonepe", tmp_path / "h.png")


def test_the_script_refuses_too_many_systems_before_reading_any_sweep(tmp_path):
    systems = ",".join(f"s{i}" for i in range(MAX_SYSTEMS + 1))
    out = tmp_path / "out"
    done = run_study(
        "headline", "--sweep", f"d={tmp_path / 'none'}", "--systems", systems, "--out", out
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (
        f"headline: {MAX_SYSTEMS + 1} systems in --systems; a figure draws at most "
        f"{MAX_SYSTEMS}: give fewer (or run the script once per group)"
    )


def test_validation_loss_is_judged_over_the_seeds_lower_being_ahead():
    losses = {
        "1 layer": {
            "nonepe": {0: 5.00, 1: 5.02, 2: 4.98},
            "rope": {0: 4.50, 1: 4.51, 2: 4.49},  # 0.5 nats lower on every seed
            "t5": {0: 5.01, 1: 4.97, 2: 5.03},  # the same within its seeds
        },
        "3 layers": {"nonepe": {0: 4.0}, "rope": {0: 3.6}},
    }
    cells = loss_headline(losses, ["rope", "t5"], "nonepe")
    at = {(c.depth, c.system): c.verdict() for c in cells}
    assert at["1 layer", "rope"] == "ahead"
    assert at["1 layer", "t5"] == NOISE
    assert at["3 layers", "rope"] == ONE_SEED
    assert at["3 layers", "t5"] == "-"
    table = "\n".join(loss_table(cells, "nonepe", correction_note([], cells)))
    assert "| rope | -0.500 [" in table and "ahead" in table
    assert "validation losses another (1 layer: 0 + 2 tests, 3 layers: 0 + 0 tests)." in table


def kept_sentences(rng, tokens, level: float) -> np.ndarray:
    """A run's validation sentences as it keeps them: each sentence's NLL about ``level``
    nats a token."""
    nll = rng.gamma(4.0, level / 4.0, tokens.size) * tokens
    return loss_statistics(SentenceLosses([1] * tokens.size, list(nll), list(tokens)))


def test_validation_sentences_every_run_kept_add_their_resampled_noise():
    """Runs that kept their validation sentences (``valid_losses.tsv``) add the deviation of
    the difference over resampled validation sets; a run without them, or runs of other
    sentences, leave the seeds as the only noise, and the table says which."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 30, size=50)
    losses = {"1 layer": {"nonepe": {0: 5.0, 1: 5.02, 2: 4.98}, "rope": {0: 4.9, 1: 4.94, 2: 4.87}}}
    kept = {
        name: {s: kept_sentences(rng, tokens, 5.0) for s in range(3)} for name in ("nonepe", "rope")
    }
    (cell,) = loss_headline(losses, ["rope"], "nonepe", sentences={"1 layer": kept}, samples=50)
    terms = [(1.0, list(kept["rope"].values())), (-1.0, list(kept["nonepe"].values()))]
    assert cell.sentences
    assert cell.comparison.sentence_se == pytest.approx(contrast_deviation("loss", terms, 50))
    assert cell.comparison.sentence_se > 0
    assert "seeds and resampled validation sentences as noise" in "\n".join(
        loss_table([cell], "nonepe", "")
    )
    other = {**kept, "rope": {s: kept_sentences(rng, tokens + 1, 5.0) for s in range(3)}}
    missing = {**kept, "rope": {0: kept["rope"][0], 1: kept["rope"][1]}}
    for partial in (other, missing):
        (alone,) = loss_headline(losses, ["rope"], "nonepe", sentences={"1 layer": partial})
        assert not alone.sentences and alone.comparison.sentence_se == 0.0
        assert "did not keep their validation sentences" in "\n".join(
            loss_table([alone], "nonepe", "")
        )


def test_with_a_plans_margins_no_finding_is_equivalent_or_not_resolved(tmp_path):
    """Two one-sided tests within the plan's margins decide what "within noise" would leave
    open: a system scoring as the baseline does on every seed is equivalent, one whose seeds
    scatter widely is not resolved."""
    split = sweep(tmp_path, "one", {"nonepe": 4, "same": 4, "rope": 9})
    margins = {"bleu": 1.0, "chrf": 1.0}
    cells = {c.system: c for c in headline({"d": split}, ["same", "rope"], "nonepe", 200, margins)}
    assert cells["same"].verdict() == EQUIVALENT
    assert cells["rope"].verdict() in ("ahead", "behind", NOT_RESOLVED)
    plain = {c.system: c for c in headline({"d": split}, ["same"], "nonepe", 200)}
    assert plain["same"].verdict() == NOISE  # without margins nothing is called equivalent
    losses = {
        "d": {
            "nonepe": {0: 5.00, 1: 5.02, 2: 4.98},
            "close": {0: 5.005, 1: 5.015, 2: 4.985},  # within 0.05 nats on every seed
            "wide": {0: 4.6, 1: 5.4, 2: 5.0},  # its seeds allow a difference of 0.5 nats
        }
    }
    judged = {
        c.system: c.verdict() for c in loss_headline(losses, ["close", "wide"], "nonepe", 0.05)
    }
    assert judged == {"close": EQUIVALENT, "wide": NOT_RESOLVED}
    unjudged = {c.system: c.verdict() for c in loss_headline(losses, ["close"], "nonepe")}
    assert unjudged == {"close": NOISE}


@pytest.mark.parametrize(
    ("shallow", "deep", "expected"),
    [
        ("ahead", "ahead", "holds"),
        ("behind", "behind", "holds"),
        ("ahead", "behind", "reverses"),
        (NOISE, "ahead", "appears"),
        ("ahead", NOISE, "not found"),
        ("ahead", "only chrF significant", "not found"),
        (NOISE, NOISE, "neither"),
        ("ahead", ONE_SEED, "untested"),
        (UNINFORMATIVE, "ahead", "untested"),
        ("-", NOISE, "untested"),
    ],
)
def test_what_becomes_of_a_verdict_from_one_depth_to_the_next(shallow, deep, expected):
    assert change(shallow, deep) == expected


def test_the_depth_table_has_a_row_per_system_and_measure(tmp_path):
    sweeps = {
        "1 layer": sweep(tmp_path, "one", {"nonepe": 2, "rope": 9}),
        "3 layers": sweep(tmp_path, "three", {"nonepe": 2, "rope": 9}),
    }
    cells = headline(sweeps, ["rope"], "nonepe", samples=200)
    losses = loss_headline(
        {d: {"nonepe": {0: 5.0, 1: 5.1, 2: 5.0}, "rope": {0: 4.0, 1: 4.1, 2: 4.0}} for d in sweeps},
        ["rope"],
        "nonepe",
    )
    table = depth_changes(cells, losses, "1 layer", "3 layers")
    assert table[0] == "| system | measured on | 1 layer | 3 layers | at 3 layers |"
    assert "| rope | validation loss | ahead | ahead | holds |" in table
    assert "| rope | test | ahead | ahead | holds |" in table
    assert plot_loss_headline(losses, "nonepe", tmp_path / "loss.png").stat().st_size > 0


@pytest.mark.parametrize("within", [(), ("depth",), ("kind",), ("depth", "kind")])
def test_a_plan_family_splits_holm_by_the_factors_it_declares(tmp_path, within):
    """``holm_within`` as a plan's family states it: none joins every test of every depth in
    one Holm correction; ``depth`` corrects each depth apart, ``kind`` the BLEU-and-chrF cells
    apart from the validation losses."""
    depths = {"1 layer": "one", "3 layers": "three"}
    sweeps = {d: sweep(tmp_path, f, {"nonepe": 2, "rope": 5, "t5": 3}) for d, f in depths.items()}
    cells = headline(sweeps, ["rope", "t5"], "nonepe", samples=200)
    side = {"nonepe": {0: 5.0, 1: 5.1, 2: 5.05}, "rope": {0: 4.8, 1: 5.0, 2: 4.85}}
    losses = loss_headline({d: side for d in depths}, ["rope"], "nonepe")
    judge_headline(cells, losses, None, within)

    def group(depth: str, kind: str) -> tuple:
        return (depth if "depth" in within else None, kind if "kind" in within else None)

    raw = {
        (*group(c.depth, "pair"), c.depth, c.system, m): p
        for (i, m), p in findings.tested_p([c.judgement for c in cells]).items()
        for c in [cells[i]]
    }
    raw |= {(*group(c.depth, "loss"), c.depth, c.system, "loss"): c.comparison.p for c in losses}
    expected = {}
    for key in {k[:2] for k in raw}:
        expected |= holm({k: p for k, p in raw.items() if k[:2] == key})
    got = {
        (*group(c.depth, "pair"), c.depth, c.system, m): c.judgement.p_holm[m]
        for c in cells
        for m in ("bleu", "chrf")
    }
    got |= {(*group(c.depth, "loss"), c.depth, c.system, "loss"): c.p_holm for c in losses}
    assert len(expected) == 10 and got == pytest.approx(expected)
    assert (
        correction_note(cells, losses, within)
        == {
            (): "every depth's BLEU and chrF cells and validation losses are one family under "
            "Holm's correction (10 tests)",
            ("depth",): "each depth's BLEU and chrF cells and validation losses are one family "
            "under Holm's correction (1 layer: 5 tests, 3 layers: 5 tests)",
            ("kind",): "every depth's BLEU and chrF cells are one family under Holm's correction, "
            "its validation losses another (8 + 2 tests)",
            ("depth", "kind"): "each depth's BLEU and chrF cells are one family under Holm's "
            "correction, its validation losses another (1 layer: 4 + 1 tests, 3 layers: 4 + 1 "
            "tests)",
        }[within]
    )
