"""The report's figures, specified by the data they draw: fake runs and scores go in, the lines,
bars and limits the figure holds come out (and its PNG is written, for a look by eye)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import BarContainer

from posenc.analysis.report.curves import (
    aggregate_curves,
    common_range,
    smoothing_span,
    tails,
    trailing_mean,
)
from posenc.analysis.report.figures import (
    MAX_PER_PANEL,
    limit_lines,
    panel_groups,
    plot_buckets,
    plot_curves,
    plot_intervals,
    plot_scores,
    render_attention,
)
from posenc.analysis.report.render import Writer, new_figure, palette
from posenc.analysis.report.runs import Entry, Group, Run
from posenc.analysis.report.sections_by_split import section_scores
from posenc.analysis.report.stats import (
    AXIS_OFFSET,
    bucket_position,
    error_bar,
    limit_on_axis,
    score_limits,
)
from posenc.config import LENGTH_LIMITS


def curve(x, y) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def run(name: str, seed: int, **curves) -> Run:
    return Run(name, Path(name), {"pe.name": "enc", "seed": seed}, curves=curves)


def labelled(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The labelled lines of ``ax``: label -> (x, y)."""
    return {
        line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
        for line in ax.lines
        if not line.get_label().startswith("_")
    }


# ---------------------------------------------------------------- learning curves


def test_the_mean_covers_only_the_range_every_seed_has():
    early = curve([0, 10], [4, 2])
    late = curve([0, 20], [6, 2])
    agg = aggregate_curves([early, late], np.array([0.0, 10.0, 20.0]))
    assert agg["x"].tolist() == [0.0, 10.0]  # at 20 only one seed is left: no mean there
    assert agg["mean"].tolist() == [5.0, 3.0] and agg["n"] == 2
    assert agg["min"].tolist() == [4.0, 2.0] and agg["max"].tolist() == [6.0, 4.0]
    assert common_range([early, late]) == (0.0, 10.0)
    ((x, y),) = tails([early, late])  # the longer seed beyond 10, joined at its value there
    assert x.tolist() == [10.0, 20.0] and y.tolist() == [4.0, 2.0]
    assert aggregate_curves([curve([0, 1], [1, 1]), curve([5, 6], [1, 1])])["x"].size == 0


def test_the_time_curve_ends_where_the_shortest_seed_ends(tmp_path):
    """Two seeds; the slower one stops at 60 s with a higher loss than the other reaches at
    100 s. The mean must not climb from 60 s on: it ends at 60 s."""
    fast = curve([10, 40, 60], [6.0, 5.0, 4.5])
    slow = curve([10, 40, 70, 100], [6.2, 5.4, 5.0, 4.8])
    group = Group("enc", "enc", "", [run("a", 0, time=fast), run("b", 1, time=slow)])
    fig = plot_curves(Writer(tmp_path), [group], "time", palette(["enc"]), "training time (s)")
    x, y = labelled(fig.axes[0])["enc (n=2)"]
    assert x[-1] == 60.0 and x[0] == 10.0
    assert np.all(np.diff(y) <= 0)  # no climb at the end
    thin = [line for line in fig.axes[0].lines if line.get_label().startswith("_")]
    assert [line.get_xdata()[-1] for line in thin] == [100.0]  # the slower seed's own tail
    assert (tmp_path / "valid_loss_vs_time.png").stat().st_size > 1000


def test_a_run_validated_once_shows_its_training_loss_curve(tmp_path):
    steps = np.arange(10, 410, 10)
    group = Group(
        "enc",
        "enc",
        "",
        [run("a", 0, steps=curve([400], [5.0]), train_steps=curve(steps, 8 - steps / 100))],
    )
    fig = plot_curves(Writer(tmp_path), [group], "steps", palette(["enc"]), "training step")
    valid, train = fig.axes[0], fig.axes[1]
    assert labelled(valid)["enc (n=1)"][0].tolist() == [400.0]  # one validation: one point
    x, y = labelled(train)["enc (n=1)"]
    assert x.tolist() == steps.tolist() and y[-1] < y[0]  # the whole training curve
    assert "training loss" in train.get_ylabel()


def test_more_than_eight_encodings_go_to_rows_of_at_most_eight_on_shared_axes(tmp_path):
    """26 overlapping curves cannot be read: 19 encodings make three rows of 7, 6 and 6, in the
    report's order, each row's two panels on the same axes as every other row's."""
    names = [f"enc{i:02d}" for i in range(19)]
    groups = [
        Group(n, n, "", [run(n, 0, steps=curve([100, 200], [6 - i / 10, 5 - i / 10]))])
        for i, n in enumerate(names)
    ]
    fig = plot_curves(Writer(tmp_path), groups, "steps", palette(names), "training step")
    rows = [fig.axes[i : i + 2] for i in range(0, len(fig.axes), 2)]
    drawn = [[label.split(" (n=")[0] for label in labelled(valid)] for valid, _ in rows]
    assert drawn == [names[:7], names[7:13], names[13:]]
    assert len({valid.get_ylim() for valid, _ in rows}) == 1  # one scale for every row
    assert all(len(labelled(valid)) <= MAX_PER_PANEL for valid, _ in rows)
    assert panel_groups(groups[:8]) == [groups[:8]]  # eight fit one row


def test_the_training_loss_is_a_trailing_mean():
    x, y = trailing_mean(curve(range(100), [0.0, 2.0] * 50), span=1.5)  # window: 2 points
    assert y[0] == 0.0 and np.all(y[1:] == 1.0)
    assert trailing_mean(curve([1, 2], [3, 4]), span=0.5)[1].tolist() == [3.0, 4.0]  # no smoothing
    assert trailing_mean(curve([1], [3]), span=0.0)[1].tolist() == [3.0]  # one point: itself


def test_runs_of_different_lengths_are_smoothed_alike():
    values = np.random.default_rng(0).normal(size=400)
    long, short = curve(range(400), values), curve(range(100), values[:100])
    span = smoothing_span([long, short])
    assert span == pytest.approx(0.05 * 399)  # a share of the longest run's range, for both
    slow = [np.mean(values[max(0, i - 19) : i + 1]) for i in range(100)]  # x within 19.95 back
    np.testing.assert_allclose(trailing_mean(long, span)[1][:100], slow)
    np.testing.assert_allclose(trailing_mean(short, span)[1], slow)


# ---------------------------------------------------------------- scores


def entry(system: str, seed: int, **scores) -> Entry:
    run_ = Run(f"{system}-{seed}", Path(system), {"seed": seed})
    return Entry(system, run_, scores, Path("h"), Path("r"))


def systems_of(bert: float) -> dict[str, list[Entry]]:
    return {
        "two": [
            entry("two", 0, bleu=10.0, chrf=30, bertscore_f1=bert),
            entry("two", 1, bleu=12.0, chrf=32, bertscore_f1=bert + 0.02),
        ],
        "one": [entry("one", 0, bleu=8.0, chrf=28, bertscore_f1=bert - 0.01)],
    }


def test_one_seed_gets_no_error_bar_and_bertscore_one_scale_on_every_split(tmp_path):
    splits = {"test": systems_of(0.20), "long": systems_of(0.60)}
    limits = score_limits(splits.values())
    styles = palette(["two", "one"])
    figures = {
        s: plot_scores(Writer(tmp_path), s, systems, styles, limits)
        for s, systems in splits.items()
    }
    for fig in figures.values():
        for ax in fig.axes:
            bars = [c for c in ax.containers if isinstance(c, BarContainer)]
            assert [c.errorbar is not None for c in bars] == [True, False]  # two seeds, one
    bert = {s: fig.axes[2] for s, fig in figures.items()}
    assert bert["test"].get_title() == "BERTScore F1 ×100"
    assert bert["test"].get_xlim() == bert["long"].get_xlim() == limits["bertscore_f1"]
    assert limits["bertscore_f1"][0] == 0.0 and limits["bertscore_f1"][1] > 62.0  # x100
    assert error_bar([1.0]) is None and error_bar([1.0, 3.0]) == pytest.approx(2**0.5)


def test_score_bars_name_their_split_and_axes_and_bars_sharing_a_colour_differ(tmp_path):
    """With more systems than the palette has colours, a repeated colour gets a hatch, so no
    two bars look alike (seventeen encodings drew alibi and xl both in plain blue)."""
    names = [f"system {i:02d}" for i in range(19)]
    systems = {
        n: [entry(n, 0, bleu=10.0 + i, chrf=30.0, sentences=3003)] for i, n in enumerate(names)
    }
    fig = plot_scores(Writer(tmp_path), "newstest2014", systems, palette(names), {})
    assert fig._suptitle.get_text().startswith("newstest2014, 3,003 sentences\n")
    bleu = fig.axes[0]
    assert bleu.get_xlabel() == "BLEU"
    assert [t.get_text() for t in bleu.get_yticklabels()] == names[::-1]  # best on top, all named
    bars = [c.patches[0] for c in bleu.containers if isinstance(c, BarContainer)]
    looks = {(tuple(np.round(b.get_facecolor(), 3)), b.get_hatch()) for b in bars}
    assert len(bars) == len(looks) == 19


def test_bucket_ticks_count_their_sentences_and_markers_grow_with_them(tmp_path):
    styles = palette(["a"])
    values = {"a": {"bleu": [10.0, 12.0, 14.0], "loss": [5.0, 5.5, 6.0]}}
    fig = plot_buckets(Writer(tmp_path), "test", EDGES, [400, 20, 1], values, [], styles)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert [t.split("n=")[1] for t in ticks] == ["400", "20", "1"]
    sizes = fig.axes[0].collections[0].get_sizes()
    assert sizes[0] > sizes[1] > sizes[2]


def test_differences_from_the_baseline_are_drawn_with_their_intervals_in_rank_order(tmp_path):
    differences = {
        "next": {"bleu": (-1.0, -2.5, 0.5), "chrf": (-2.0, -3.0, -1.0)},
        "last": {"bleu": (-4.0, -6.0, -2.0)},
    }
    fig = plot_intervals(Writer(tmp_path), "test", "best", differences, palette(differences))
    bleu = fig.axes[0]
    assert [t.get_text() for t in bleu.get_yticklabels()] == ["next", "last"]
    point = bleu.containers[0].lines[0]
    assert point.get_xdata()[0] == -1.0 and (tmp_path / "intervals_test.png").exists()
    assert "minus best" in bleu.get_xlabel()


def test_the_score_table_shows_bertscore_x100_and_lists_the_seeds(tmp_path):
    w = Writer(tmp_path)
    systems = systems_of(0.20)
    table = section_scores(w, "test", systems, palette(systems), score_limits([systems]))
    assert table.header[1] == "seeds" and table.header[5] == "BERTScore F1 ×100"
    rows = {row[0]: row for row in table.rows}
    assert rows["two"][1] == "0, 1" and rows["one"][1] == "0"
    assert rows["one"][5] == "19.00" and rows["two"][5].startswith("21.00 ± ")
    csv = [r for r in w.rows if r["metric"] == "bertscore_f1_mean" and r["encoding"] == "one"]
    assert csv[0]["value"] == pytest.approx(0.19)  # report.csv keeps metrics.json's scale


# ---------------------------------------------------------------- length buckets

EDGES = [(0, 10), (10, 20), (20, 30)]


def test_length_limits_are_drawn_in_the_axis_unit():
    """The axis counts source tokens with EOS; the line goes between the longest trained source
    and the next: 20 source tokens are 21 with EOS, so the line is at 22 (bucket 20-29)."""
    assert limit_on_axis(20, "source tokens") == 22
    assert limit_on_axis(20, "tokens incl. EOS") == 21
    assert limit_on_axis(80, "words") is None and limit_on_axis(12, "symbols") is None
    assert bucket_position(22, EDGES) == pytest.approx(1.7)
    limits = [
        ("trainer.max_source_tokens", 20.0, "source tokens"),
        ("trainer.max_positions", 20.0, "tokens incl. EOS"),
        ("data.clean.max_words", 15.0, "words"),  # not a token count: never drawn
    ]
    lines = limit_lines(limits, EDGES)
    assert [p for _, p in lines] == [pytest.approx(1.7), pytest.approx(1.6)]
    assert (
        lines[0][0]
        == "trainer.max_source_tokens=20\n(source tokens: trained sources ≤ 21 incl. EOS)"
    )


def test_every_declared_limit_unit_either_converts_or_is_not_a_token_count():
    units = set(LENGTH_LIMITS.values())
    assert units - set(AXIS_OFFSET) == {"words", "symbols"}


def test_eleven_systems_get_distinct_styles_and_the_legend_sits_outside(tmp_path):
    names = [f"system {i}" for i in range(11)]
    styles = palette(names)
    looks = [(str(s["color"]), s["marker"], s["linestyle"]) for s in styles.values()]
    assert len({c for c, _, _ in looks}) == 11 and len(set(looks)) == 11
    values = {n: {"bleu": [i, i + 1.0, None], "loss": [5.0, 6.0, 7.0]} for i, n in enumerate(names)}
    limits = [("trainer.max_source_tokens", 20.0, "source tokens")]
    fig = plot_buckets(Writer(tmp_path), "test", EDGES, [400, 20, 1], values, limits, styles)
    bleu = fig.axes[0]
    drawn = {line.get_label(): line for line in bleu.lines}
    assert drawn["system 3"].get_ydata()[:2].tolist() == [3.0, 4.0]
    systems = [line for label, line in drawn.items() if label in names]
    assert len({(str(s.get_color()), s.get_marker(), s.get_linestyle()) for s in systems}) == 11
    limit = [line for label, line in drawn.items() if label.startswith("trainer.")]
    assert limit[0].get_xdata()[0] == pytest.approx(1.7)
    assert bleu.get_legend() is None and len(fig.legends) == 1  # outside the axes
    assert len(fig.legends[0].get_texts()) == 12


def test_a_legend_of_many_systems_takes_columns_to_stay_within_the_figure(tmp_path):
    names = [f"rope (pe.option={i})" for i in range(30)]
    values = {n: {"bleu": [1.0, 2.0, 3.0], "loss": [5.0, 6.0, 7.0]} for n in names}
    limits = [("trainer.max_source_tokens", 20.0, "source tokens")]
    fig = plot_buckets(
        Writer(tmp_path), "test", EDGES, [400, 20, 1], values, limits, palette(names)
    )
    legend = fig.legends[0]
    assert legend._ncols > 1
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert box.y0 >= 0 and box.y1 <= fig.bbox.height + 1  # nothing cut off below or above
    assert box.x1 <= fig.bbox.width + 1
    plots = [ax.get_window_extent() for ax in fig.axes]
    assert all(p.width > 0.3 * (box.x0 / len(plots)) for p in plots)  # the axes keep their room


# ---------------------------------------------------------------- attention maps


def test_an_old_attention_file_without_tokens_is_drawn_with_positions(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "attention.npz", encoder_layer0=rng.random((2, 5, 5)))
    render_attention(tmp_path / "attention.npz", "old run", tmp_path / "old.png")
    assert (tmp_path / "old.png").stat().st_size > 1000


def test_a_figure_the_new_report_no_longer_shows_is_removed_and_nothing_else(tmp_path):
    """A system renamed or gone from the sweep leaves no figure behind; files the report never
    showed (a user's, or names an untrusted report.md points outside its folder) stay."""
    outside = tmp_path / "outside.png"
    out = tmp_path / "report"
    out.mkdir()
    for name in ("user.png", "notes.txt"):
        (out / name).write_text("mine")
    outside.write_text("not the report's")
    first = Writer(out)
    for name in ("kept.png", "gone.png"):
        figure, _ = new_figure(2, 2)
        first.figure(figure, name, name)
    first.save()
    with open(out / "report.md", "a", encoding="utf-8") as handle:  # written by someone else
        handle.write("![x](../outside.png)\n![x](notes.txt)\n![x](/etc/hostname)\n")
    second = Writer(out)
    figure, _ = new_figure(2, 2)
    second.figure(figure, "kept.png", "kept")
    second.save()
    assert sorted(p.name for p in out.iterdir()) == [
        "kept.png",
        "notes.txt",
        "report.csv",
        "report.md",
        "user.png",
    ]
    assert outside.exists()
