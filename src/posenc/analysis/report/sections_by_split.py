"""The report's sections about scores, one subsection per split of the metrics (the focus split
first): 3. Scores, 4. Significance (the decision rule against the best system, one family for
the report) and 5. Length buckets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.analysis.decision import ALPHA, MAX_SEEDS, Comparison
from posenc.analysis.report.figures import plot_buckets, plot_intervals, plot_scores
from posenc.analysis.report.findings import (
    LOOP_CEILING,
    MODES_RATIO,
    NOISE_FLOOR_BLEU,
    SPLIT,
    UNINFORMATIVE,
    WORSE,
    Judgement,
    StatisticsCache,
    judge_family,
    judge_pair,
    power_cells,
    tested_p,
)
from posenc.analysis.report.render import SECTIONS, Table, Writer, fmt, fmt_stats, record_stats
from posenc.analysis.report.runs import FAILED, Entry, Run
from posenc.analysis.report.stats import (
    SCORES,
    bucket_label,
    bucket_values,
    length_limits,
    limit_on_axis,
    mean_std,
    score_limits,
    seed_list,
    seed_texts,
    system_order,
)
from posenc.config.metrics import JUDGED_METRICS, SACREBLEU_METRICS
from posenc.config.metrics import metric as metric_of

#: what the ``seeds`` column of the score and significance tables means (both captions say it)
SEEDS_COLUMN = "`seeds`: the training seeds of the runs a row is computed from"


def split_sections(
    w: Writer,
    splits: list[str],
    systems: dict[str, dict[str, list[Entry]]],
    runs: Sequence[Run],
    samples: int,
    styles: dict[str, Any],
) -> Table | None:
    """Sections 3–5 (scores, significance, length buckets), one subsection per split of
    ``splits`` (``systems``: split -> system -> entries). Returns the score table of the first
    (focus) split, or None when no run is finished yet."""
    if not splits:
        for title in SECTIONS[2:5]:
            w.heading(title)
            w.text("No finished run yet.")
        return None
    w.heading(SECTIONS[2])
    w.text(
        "Mean ± sample standard deviation over seeds (no ± and no error bar for one seed); "
        f"{SEEDS_COLUMN}. {_listed([m.label for m in SACREBLEU_METRICS.values()])} are "
        "detokenised sacreBLEU (a metric added later is shown where runs have it); BERTScore F1 "
        "is shown ×100 "
        "(0–100, like BLEU and chrF) in the tables and figures (`report.csv` and `metrics.json` "
        "keep its 0–1 value); loss is the token-level NLL of the references. Each score's "
        "figure has the same y range on every split."
    )
    ranges = score_limits(systems[split] for split in splits)
    tables = [section_scores(w, split, systems[split], styles, ranges) for split in splits]
    cache = StatisticsCache()
    judged = {split: significance_rows(systems[split], samples, cache) for split in splits}
    family = [j for rows in judged.values() for _, j in rows[1:] if j is not None]
    judge_family(family)
    w.heading(SECTIONS[3])
    w.text(
        "Each system against the best one by mean BLEU (the baseline), by the decision rule "
        "whose unit is the training run (`posenc.analysis.decision`): Δ is the baseline's mean "
        "score over its seeds minus the system's over its own, in the metric's points, with a "
        "95% interval (of the row alone) whose standard error adds the spread between training "
        "seeds (paired where both have the same seeds, Welch otherwise) and the spread over "
        f"{samples} test sets resampled from this one, with the seeds' degrees of freedom. "
        "p-values are adjusted with Holm's method over every system, metric and split of this "
        f"report at once (one family: {len(tested_p(family))} tests, the comparisons with two "
        f"seeds a side above the quality floor). {SEEDS_COLUMN}, as in the score tables."
    )
    for split in splits:
        section_significance(w, split, systems[split], judged[split], styles)
    w.heading(SECTIONS[4])
    limits = length_limits([r for r in runs if r.status != FAILED])
    w.text(*limit_notes(limits))
    for split in splits:
        section_buckets(w, split, systems[split], limits, styles)
    return tables[0]


def limit_notes(limits: Sequence[tuple[str, float, str]]) -> list[str]:
    """The training length limits of the configs, each in its own unit and, where it converts,
    in the buckets' unit (tokens incl. EOS); the others are said not to be drawn."""
    if not limits:
        return ["Training length limits in the configs: none found."]
    items = []
    for key, value, unit in limits:
        first = limit_on_axis(value, unit)
        items.append(
            f"`{key}` = {value:g} {unit}"
            + (
                f" (trained sources ≤ {first - 1:g} tokens incl. EOS: drawn)"
                if first is not None
                else f" (not drawn: counted in {unit}, the axis in tokens)"
            )
        )
    return [
        "Training length limits in the configs: " + ", ".join(items) + ". The x axis is the "
        "source length in tokens, EOS included; a limit is drawn as a vertical line between the "
        "longest source it lets into training and the next, where that falls inside the buckets."
    ]


# ---------------------------------------------------------------- 3. scores


def _listed(words: Sequence[str]) -> str:
    """``a, b and c``."""
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def section_scores(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    styles: dict[str, Any],
    limits: dict[str, tuple[float, float]],
) -> Table:
    """Each metric some run has (:data:`SCORES`, BERTScore F1 x100) and the loss per system
    (mean ± std over seeds; the CSV keeps the values of ``metrics.json``), a bar chart with the
    y ranges ``limits``, and the metric signatures. Returns the score table as written."""
    w.heading(f"{split}", 3)
    rows = []
    scored = [  # the metrics some run has (one added later is missing from older runs)
        score
        for score in SCORES
        if any(e.scores.get(score[0]) is not None for entries in systems.values() for e in entries)
    ]
    for name in system_order(systems):
        entries = systems[name]
        cells = [name, seed_list(entries), fmt(entries[0].scores.get("sentences"))]
        for metric, _, digits, scale in scored:
            for entry in entries:
                w.record("scores", split, name, entry.run.name, metric, entry.scores.get(metric))
            stats = mean_std(e.scores.get(metric) for e in entries)
            record_stats(w, "scores", split, name, metric, stats)
            shown = None if stats is None else (stats[0] * scale, stats[1] * scale, stats[2])
            cells.append(fmt_stats(shown, digits))
        rows.append(cells)
    header = ["system", "seeds", "sentences", *[label for _, label, _, _ in scored]]
    table = w.table(header, rows)
    signature_lines(w, systems)
    plot_scores(w, split, systems, styles, limits)
    return table


def signature_lines(w: Writer, systems: dict[str, list[Entry]]) -> None:
    """The sacreBLEU signatures and the BERTScore model/layer (or the reason it is null)."""
    scores = [e.scores for entries in systems.values() for e in entries]
    lines = []
    for name, declared in SACREBLEU_METRICS.items():
        key, label = f"{name}_signature", declared.label
        signatures = dict.fromkeys(str(s.get(key)) for s in scores if s.get(key))
        if not signatures and not declared.required:
            continue  # a metric added later: runs scored before it have no signature of it
        lines.append(
            f"- sacreBLEU {label} signature: "
            + (", ".join(f"`{sig}`" for sig in signatures) or "—")
            + (" (**differs between runs**)" if len(signatures) > 1 else "")
        )
    models = dict.fromkeys(
        f"`{s.get('bertscore_model')}` layer {s.get('bertscore_layer')}, "
        f"hash `{s.get('bertscore_hash')}`"
        for s in scores
        if s.get("bertscore_f1") is not None
    )
    reasons = dict.fromkeys(
        str(s.get("bertscore_reason")) for s in scores if s.get("bertscore_f1") is None
    )
    if models:
        lines.append("- BERTScore: " + "; ".join(models))
    if reasons:
        lines.append("- BERTScore null: " + "; ".join(reasons))
    comet_models = dict.fromkeys(
        f"`{s['comet_model']}`" for s in scores if s.get("comet") is not None
    )
    comet_reasons = dict.fromkeys(
        str(s.get("comet_reason")) for s in scores if "comet" in s and s.get("comet") is None
    )
    if comet_models:
        lines.append("- COMET: " + "; ".join(comet_models))
    if comet_reasons:
        lines.append("- COMET null: " + "; ".join(comet_reasons))
    w.text(*lines)


# ---------------------------------------------------------------- 4. significance


Row = tuple[str, Judgement | None]
"""A system of the significance table and its judgement against the baseline (the baseline's
own row first, with None)."""


def significance_rows(
    systems: dict[str, list[Entry]], samples: int, cache: StatisticsCache
) -> list[Row]:
    """The baseline (the best system by mean BLEU among those with hypotheses) and every other
    system judged against it, unadjusted; empty with fewer than two such systems."""
    usable = {name: entries for name, entries in systems.items() if seed_texts(entries)}
    if len(usable) < 2:
        return []
    order = system_order(usable)
    baseline = usable[order[0]]
    return [(order[0], None)] + [
        (name, judge_pair(baseline, usable[name], samples, cache)) for name in order[1:]
    ]


def section_significance(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    rows: list[Row],
    styles: dict[str, Any],
) -> None:
    """The table of every system against the baseline on ``split`` (judged, Holm-adjusted
    with the report's whole family), its figure of the differences and the verdicts' rules."""
    w.heading(f"{split}", 3)
    if not rows:
        w.text("Fewer than two systems have hypothesis files for this split: nothing to compare.")
        return
    baseline = rows[0][0]
    judged = [j for _, j in rows[1:] if j is not None]
    best = mean_std(e.scores.get("bleu") for e in systems[baseline])
    floor = (best is not None and best[0] < NOISE_FLOOR_BLEU) or any(
        j.loops[0] >= LOOP_CEILING for j in judged
    )
    w.record("significance", split, baseline, "", "noise_floor", int(floor))
    table = [
        _significance_cells(w, split, name, systems[name], judgement) for name, judgement in rows
    ]
    w.table(
        [
            "system",
            "seeds",
            *(
                heading
                for name in JUDGED_METRICS
                for heading in (
                    metric_of(name).label,
                    f"Δ {metric_of(name).label} [95% CI]",
                    "p Holm",
                )
            ),
            "looping",
            "seeds for 80% power",
            "verdict",
        ],
        table,
    )
    differences = {
        name: {m: _drawn(c) for m, c in j.comparisons.items() if c.low is not None}
        for name, j in rows[1:]
        if j is not None
    }
    if any(differences.values()):
        plot_intervals(w, split, baseline, differences, styles)
    w.text(
        f"Baseline: **{baseline}** (best mean BLEU). Verdicts: **{WORSE}** is a finding: BLEU "
        f"and chrF both below {ALPHA} after the family's correction and pointing the same "
        "way; otherwise the row says which metric alone is significant, or that they point "
        f"opposite ways, or {'one seed only'} (a side with one seed: its seed noise is "
        f"unknown), or {SPLIT} (a side's seeds spread more than {MODES_RATIO:g} times the "
        "median of the other systems': separate modes, where no test at a few seeds holds), "
        f"or within noise. {UNINFORMATIVE.capitalize()}: a side with a mean BLEU "
        f"below {NOISE_FLOOR_BLEU:g} or with {LOOP_CEILING:.0%} or more looping translations "
        "(a stretch of 2-30 characters four times in a row) is not compared. Seeds for 80% "
        "power: the seeds per system that would find the observed difference at the "
        f"family's Bonferroni level (`>{MAX_SEEDS}`: not within {MAX_SEEDS}).",
    )


def _drawn(comparison: Comparison) -> tuple[float, float, float]:
    """The system minus the baseline with its interval: the judgement is the other way round."""
    return -comparison.difference, -comparison.high, -comparison.low  # type: ignore[operator]


def _significance_cells(
    w: Writer, split: str, name: str, entries: list[Entry], judgement: Judgement | None
) -> list[str]:
    """One row of the significance table, its numbers also recorded in the report's CSV."""
    seeds = ", ".join(str(s) for s in sorted({e.run.seed for e in entries}))
    cells = [name, seeds or "—"]
    for metric in JUDGED_METRICS:
        mean = mean_std(e.scores.get(metric) for e in entries)
        score = None if mean is None else mean[0]
        w.record("significance", split, name, "", metric, score)
        cells.append(fmt(score))
        if judgement is None:
            cells += ["baseline", ""]
            continue
        comparison = judgement.comparisons[metric]
        p = judgement.p_holm.get(metric)
        for key, value in {
            f"delta_{metric}": comparison.difference,
            f"low_{metric}": comparison.low,
            f"high_{metric}": comparison.high,
            f"p_{metric}": p,
        }.items():
            w.record("significance", split, name, "", key, value)
        cells += [comparison.text(), fmt(p, 4)]
    if judgement is None:
        return cells + ["", "", ""]
    w.record("significance", split, name, "", "verdict", judgement.verdict)
    w.record("significance", split, name, "", "loops", judgement.loops[1])
    return cells + [f"{judgement.loops[1]:.0%}", power_cells(judgement), judgement.verdict]


# ---------------------------------------------------------------- 5. length buckets


def section_buckets(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    limits: list[tuple[str, float, str]],
    styles: dict[str, Any],
) -> None:
    """BLEU and loss per source-length bucket (mean over seeds; the buckets from the first to
    the last with sentences), two tables and a figure with the length ``limits``."""
    w.heading(f"{split}", 3)
    edges, sentences, values = bucket_values(systems)
    filled = [i for i, edge in enumerate(edges) if sentences[edge] > 0]
    if not filled:
        w.text("No length buckets in the metrics of this split.")
        return
    edges = edges[filled[0] : filled[-1] + 1]
    offset = filled[0]
    values = {
        name: {m: v[offset : offset + len(edges)] for m, v in per.items()}
        for name, per in values.items()
    }
    header = ["system", *[f"{bucket_label(*edge)} ({sentences[edge]})" for edge in edges]]
    for metric, digits in (("bleu", 2), ("loss", 3)):
        w.text(
            f"{'BLEU' if metric == 'bleu' else 'Loss'} by source length in tokens "
            "(sentences in brackets), mean over seeds ± their standard deviation:"
        )
        rows = []
        for name in system_order(systems):
            row, spread = values[name][metric], values[name][f"{metric}_sd"]
            for (lo, hi), value, sd in zip(edges, row, spread, strict=True):
                w.record("buckets", split, name, "", f"{metric}[{lo},{hi})", value)
                w.record("buckets", split, name, "", f"{metric}[{lo},{hi})_sd", sd)
            cells = [
                fmt(v, digits) + ("" if sd is None else f" ± {fmt(sd, digits)}")
                for v, sd in zip(row, spread, strict=True)
            ]
            rows.append([name, *cells])
        w.table(header, rows)
    plot_buckets(w, split, edges, [sentences[edge] for edge in edges], values, limits, styles)
