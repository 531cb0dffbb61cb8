"""The extrapolation penalty: the short-trained sweep's loss minus the all-lengths sweep's, per
source-length bucket, paired by system and seed, with the seeds' spread (run directories written
by hand: config and metrics only)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from posenc.analysis.report.runs import load_run
from study.penalty import done_runs, main, penalties, penalty_table, systems_of

#: (min, max, sentences) of the test split's buckets; the last one is too small to show
BUCKETS = [(0, 10, 40), (10, 20, 400), (20, 30, 500), (120, 1000, 2)]


def scores(losses: list[float]) -> dict:
    buckets = [
        {"min": lo, "max": hi, "sentences": n, "bleu": 1.0, "loss": loss}
        for (lo, hi, n), loss in zip(BUCKETS, losses, strict=True)
    ]
    return {"bleu": 1.0, "chrf": 1.0, "loss": 5.0, "sentences": 942, "buckets": buckets}


def write_run(
    sweep: Path,
    pe: str,
    seed: int,
    losses: list[float],
    options: dict | None = None,
    variants: dict[str, list[float]] | None = None,
) -> None:
    """A finished run of encoding ``pe`` (with ``pe.*`` ``options``) and its test-time
    ``variants`` (``eval.pe_variants``' scores)."""
    run = sweep / f"pe={pe},seed={seed}{''.join(f',{k}={v}' for k, v in (options or {}).items())}"
    run.mkdir(parents=True)
    config = {"pe": {"name": pe, **(options or {})}, "seed": seed}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = {"pe": pe, "step": 10, "splits": {"test": scores(losses)}}
    if variants:
        metrics["variants"] = {
            name: {"pe": {"scaling": "linear"}, "splits": {"test": scores(v)}}
            for name, v in variants.items()
        }
    (run / "metrics.json").write_text(json.dumps(metrics))


@pytest.fixture
def sweeps(tmp_path) -> tuple[Path, Path]:
    short, full = tmp_path / "short", tmp_path / "full"
    write_run(short, "rope", 0, [4.0, 5.0, 6.0, 7.0])
    write_run(short, "rope", 1, [4.2, 5.2, 6.4, 7.0])
    write_run(short, "alibi", 0, [4.0, 5.0, 5.5, 7.0])
    write_run(short, "fire", 0, [4.0, 5.0, 5.5, 7.0])  # no partner in the full sweep
    write_run(full, "rope", 0, [4.1, 4.9, 5.6, 6.0])
    write_run(full, "rope", 1, [4.1, 4.9, 5.6, 6.0])
    write_run(full, "rope", 2, [9.0, 9.0, 9.0, 9.0])  # no partner in the short sweep
    write_run(full, "alibi", 0, [4.0, 4.8, 5.4, 6.0])
    return short, full


def paired(short, full):
    """The penalties of the short-trained runs ``short`` against ``full`` on ``test``."""
    return penalties(systems_of(short, "test"), systems_of(full, "test"))


def test_penalty_is_the_mean_over_paired_seeds_of_short_minus_full_with_their_spread(sweeps):
    found = {p.system: p for p in paired(done_runs(sweeps[0]), done_runs(sweeps[1]))}
    assert set(found) == {"rope", "alibi"}
    rope = found["rope"]
    assert (rope.seeds, rope.partner) == ([0, 1], "rope")
    differences = [6.0 - 5.6, 6.4 - 5.6]
    assert rope.by_bucket[(0, 10)][0] == pytest.approx(((4.0 - 4.1) + (4.2 - 4.1)) / 2)
    assert rope.by_bucket[(20, 30)] == pytest.approx(
        (np.mean(differences), np.std(differences, ddof=1), 2)
    )
    assert found["alibi"].by_bucket[(20, 30)] == pytest.approx((0.1, 0.0, 1))


def test_table_leaves_out_small_buckets_orders_by_the_longest_and_names_the_unpaired(sweeps):
    table = penalty_table(done_runs(sweeps[0]), done_runs(sweeps[1]), "test", min_sentences=20)
    lines = table.splitlines()
    assert lines[0] == "system | 0–9 | 10–19 | 20–29"
    assert lines[2] == "alibi (seed 0) | +0.000 | +0.200 | +0.100"
    assert lines[3] == "rope (seeds 0, 1) | +0.000 ± 0.141 | +0.200 ± 0.141 | +0.600 ± 0.283"
    assert lines[-1] == "No all-lengths run with the same seed: fire."
    bigger = penalty_table(done_runs(sweeps[0]), done_runs(sweeps[1]), "test", min_sentences=1)
    assert bigger.splitlines()[0].endswith("| 120–999")


def test_sweeps_without_pairs_fail_in_one_line(sweeps, tmp_path, capsys):
    with pytest.raises(SystemExit, match="no run of the short-trained sweep has a run"):
        main([str(sweeps[0]), str(tmp_path / "full" / "pe=rope,seed=2")])
    with pytest.raises(SystemExit, match="no sweep directory .*nowhere; pass the sweep's folder"):
        main([str(sweeps[0]), str(tmp_path / "nowhere")])
    main([str(sweeps[0]), str(sweeps[1])])
    assert "rope (seeds 0, 1)" in capsys.readouterr().out


def test_variants_pair_with_their_own_runs_else_with_their_base_and_say_so(tmp_path):
    """A variant trained in both sweeps is measured against itself; one trained short only (an
    augmentation) against its encoding's default form, a test-time scaling against its run's
    system; the table names both."""
    short, full = tmp_path / "short", tmp_path / "full"
    write_run(short, "rope", 0, [4.0, 5.0, 6.0, 7.0], variants={"pi4": [4.0, 5.0, 5.8, 7.0]})
    write_run(short, "rope", 0, [4.0, 5.0, 5.9, 7.0], {"cross_attention": "rotated"})
    write_run(short, "rope", 0, [4.0, 5.0, 5.7, 7.0], {"augment": "random"})
    write_run(full, "rope", 0, [4.0, 5.0, 5.6, 7.0])
    write_run(full, "rope", 0, [4.0, 5.0, 5.2, 7.0], {"cross_attention": "rotated"})
    found = {p.system: p for p in paired(done_runs(short), done_runs(full))}
    assert {name: (p.partner, round(p.by_bucket[(20, 30)][0], 6)) for name, p in found.items()} == {
        "rope": ("rope", 0.4),
        "rope [pi4]": ("rope", 0.2),
        "rope (pe.cross_attention=rotated)": ("rope (pe.cross_attention=rotated)", 0.7),
        "rope (pe.augment=random)": ("rope", 0.1),
    }
    table = penalty_table(done_runs(short), done_runs(full), "test")
    assert table.splitlines()[-1] == (
        "Not trained on all lengths, so measured against: rope (pe.augment=random) against "
        "rope; rope [pi4] against rope."
    )


def test_test_time_scalings_come_from_the_runs_standalone_evaluation(tmp_path, capsys):
    """RoPE's scalings are scored after training, into ``RUN/evals/NAME``: ``--eval NAME``
    reads them (and leaves out the runs without that evaluation)."""
    short, full = tmp_path / "short", tmp_path / "full"
    write_run(short, "rope", 0, [4.0, 5.0, 6.0, 7.0])
    write_run(short, "alibi", 0, [4.0, 5.0, 6.0, 7.0])
    write_run(full, "rope", 0, [4.0, 5.0, 5.6, 7.0])
    write_run(
        tmp_path / "evaluated",
        "rope",
        0,
        [4.0, 5.0, 6.0, 7.0],
        variants={"pi4": [4.0, 5.0, 5.9, 7.0]},
    )
    evaluation = short / "pe=rope,seed=0" / "evals" / "scalings,step=10"
    evaluation.parent.mkdir()
    (tmp_path / "evaluated" / "pe=rope,seed=0").rename(evaluation)
    found = {p.system: p for p in paired(done_runs(short, "scalings,step=10"), done_runs(full))}
    assert sorted(found) == ["rope", "rope [pi4]"]
    assert found["rope [pi4]"].by_bucket[(20, 30)][0] == pytest.approx(0.3)
    main([str(short), str(full), "--eval", "scalings,step=10"])
    assert "rope [pi4] (seed 0) |" in capsys.readouterr().out
    # a pattern names the evaluation whose folder's digest differs from seed to seed
    assert [p.system for p in paired(done_runs(short, "scal*"), done_runs(full))] == [
        "rope",
        "rope [pi4]",
    ]
    (evaluation.parent / "scalings,step=20").mkdir()  # two matches: the run fails, saying so
    failed = load_run(short / "pe=rope,seed=0", short, "scal*")
    assert failed.status == "failed" and "'scal*' matches 2 evaluations" in failed.message
