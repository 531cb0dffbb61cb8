"""The report's sections about scores, one subsection per split of the metrics (the focus split
first): 3. Scores, 4. Significance (sacreBLEU's paired bootstrap against the best system) and
5. Length buckets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.analysis.report.figures import plot_buckets, plot_intervals, plot_scores
from posenc.analysis.report.findings import (
    ALPHA,
    NOISE_FLOOR_BLEU,
    UNINFORMATIVE,
    WORSE,
    SeedDifference,
    holm,
    seed_difference,
    verdict,
)
from posenc.analysis.report.render import SECTIONS, Table, Writer, fmt, fmt_stats, record_stats
from posenc.analysis.report.runs import FAILED, Entry, Run
from posenc.analysis.report.stats import (
    SCORES,
    Paired,
    best_mean_bleu,
    bucket_label,
    bucket_values,
    length_limits,
    limit_on_axis,
    mean_std,
    p_value,
    score_limits,
    seed_list,
    seed_texts,
    significance_rows,
    system_order,
)

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
        f"{SEEDS_COLUMN}. BLEU and chrF are detokenised sacreBLEU; BERTScore F1 is shown ×100 "
        "(0–100, like BLEU and chrF) in the tables and figures (`report.csv` and `metrics.json` "
        "keep its 0–1 value); loss is the token-level NLL of the references. Each score's "
        "figure has the same y range on every split."
    )
    ranges = score_limits(systems[split] for split in splits)
    tables = [section_scores(w, split, systems[split], styles, ranges) for split in splits]
    w.heading(SECTIONS[3])
    w.text(
        f"sacreBLEU's paired bootstrap resampling (`sacrebleu.significance.PairedTest`, "
        f"`test_type='bs'`, {samples} resamples, its default seed unless `SACREBLEU_SEED` is "
        "set) of each system against the best one by mean BLEU. With several seeds the "
        "hypotheses of the seeds both systems have are concatenated in seed order against "
        "the references repeated as often; the baseline's own row uses all its seeds. "
        f"{SEEDS_COLUMN}, as in the score tables: here the seeds compared (those this system "
        "shares with the baseline), so a row can list fewer seeds than its score row. "
        "p is the chance of a difference at least as large under the null hypothesis."
    )
    for split in splits:
        section_significance(w, split, systems[split], samples, styles)
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


def section_scores(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    styles: dict[str, Any],
    limits: dict[str, tuple[float, float]],
) -> Table:
    """BLEU, chrF, BERTScore F1 (x100) and loss per system (mean ± std over seeds; the CSV keeps
    the values of ``metrics.json``), a bar chart with the y ranges ``limits``, and the metric
    signatures. Returns the score table as written."""
    w.heading(f"{split}", 3)
    rows = []
    for name in system_order(systems):
        entries = systems[name]
        cells = [name, seed_list(entries), fmt(entries[0].scores.get("sentences"))]
        for metric, _, digits, scale in SCORES:
            for entry in entries:
                w.record("scores", split, name, entry.run.name, metric, entry.scores.get(metric))
            stats = mean_std(e.scores.get(metric) for e in entries)
            record_stats(w, "scores", split, name, metric, stats)
            shown = None if stats is None else (stats[0] * scale, stats[1] * scale, stats[2])
            cells.append(fmt_stats(shown, digits))
        rows.append(cells)
    header = ["system", "seeds", "sentences", *[label for _, label, _, _ in SCORES]]
    table = w.table(header, rows)
    signature_lines(w, systems)
    plot_scores(w, split, systems, styles, limits)
    return table


def signature_lines(w: Writer, systems: dict[str, list[Entry]]) -> None:
    """The sacreBLEU signatures and the BERTScore model/layer (or the reason it is null)."""
    scores = [e.scores for entries in systems.values() for e in entries]
    lines = []
    for key, label in (("bleu_signature", "BLEU"), ("chrf_signature", "chrF")):
        signatures = dict.fromkeys(str(s.get(key)) for s in scores if s.get(key))
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
    w.text(*lines)


# ---------------------------------------------------------------- 4. significance


def section_significance(
    w: Writer, split: str, systems: dict[str, list[Entry]], samples: int, styles: dict[str, Any]
) -> None:
    """Every system against the best one on ``split``: sacreBLEU's paired bootstrap p-values,
    Holm-adjusted over the systems compared, the difference on each training seed and its size
    against the seed noise, and the verdict of :mod:`.findings`."""
    w.heading(f"{split}", 3)
    usable = {name: entries for name, entries in systems.items() if seed_texts(entries)}
    if len(usable) < 2:
        w.text("Fewer than two systems have hypothesis files for this split: nothing to compare.")
        return
    baseline = system_order(usable)[0]
    rows, signatures = significance_rows(usable, baseline, samples)
    others = [row for row in rows if row.system != baseline]
    adjusted = {
        metric: holm({r.system: p for r in others if (p := p_value(r, metric)) is not None})
        for metric in ("bleu", "chrf")
    }
    best_bleu = best_mean_bleu(usable)
    floor = best_bleu is not None and best_bleu < NOISE_FLOOR_BLEU
    w.record("significance", split, baseline, "", "noise_floor", int(floor))
    table = [_significance_cells(w, split, rows[0], baseline, {}, {}, "")]
    for row in others:
        p_adj = {m: adjusted[m].get(row.system) for m in adjusted}
        differences = {m: seed_difference(usable[baseline], usable[row.system], m) for m in p_adj}
        judged = verdict(p_adj, differences, floor) if row.results else ""
        table.append(_significance_cells(w, split, row, baseline, p_adj, differences, judged))
    w.table(
        [
            "system",
            "seeds",
            "BLEU (bootstrap mean ± 95% CI)",
            "p (BLEU)",
            "p Holm",
            "chrF (bootstrap mean ± 95% CI)",
            "p (chrF)",
            "p Holm",
            "Δ BLEU per seed",
            "Δ / seed sd",
            "verdict",
            "note",
        ],
        table,
    )
    intervals = {
        row.system: {
            m: (result.mean, result.ci)
            for m, result in row.results.items()
            if result is not None and result.ci is not None
        }
        for row in rows
        if row.results
    }
    if intervals:
        plot_intervals(w, split, intervals, styles)
    w.text(
        f"Baseline: **{baseline}** (best mean BLEU). Test signatures: "
        + ", ".join(f"{m} `{s}`" for m, s in signatures.items()),
        f"Verdicts: **{WORSE}** is a finding: both Holm-adjusted p-values (over the "
        f"{len(others)} systems compared) below {ALPHA}, and the baseline ahead on BLEU and chrF "
        f"on every paired training seed (two at least). Δ is the baseline's corpus score minus "
        "the system's on each seed; Δ / seed sd divides its mean by the pooled standard "
        "deviation of the two systems' scores over seeds (the noise a rerun with another seed "
        f"brings). A split whose best mean BLEU is below {NOISE_FLOOR_BLEU} ranks nothing "
        f"({UNINFORMATIVE}).",
    )


def _significance_cells(
    w: Writer,
    split: str,
    row: Paired,
    baseline: str,
    p_adjusted: dict[str, float | None],
    differences: dict[str, SeedDifference],
    judged: str,
) -> list[str]:
    """One row of the significance table, its numbers also recorded in the report's CSV."""
    cells = [row.system, ", ".join(map(str, row.seeds)) or "—"]
    for metric in ("bleu", "chrf"):
        result, p = row.results.get(metric), p_value(row, metric)
        score = None if result is None else result.score
        recorded = {metric: score, f"p_{metric}": p, f"p_{metric}_holm": p_adjusted.get(metric)}
        for name, value in recorded.items():
            w.record("significance", split, row.system, "", name, value)
        ci = (
            "" if result is None or result.ci is None else f" ({result.mean:.2f} ± {result.ci:.2f})"
        )
        first = row.system == baseline
        cells += [
            fmt(score) + ci,
            "baseline" if first else fmt(p, 4),
            "" if first else fmt(p_adjusted.get(metric), 4),
        ]
    bleu = differences.get("bleu")
    if bleu is not None:
        w.record("significance", split, row.system, "", "delta_bleu", bleu.mean)
        w.record("significance", split, row.system, "", "effect_bleu", bleu.effect)
    if judged:
        w.record("significance", split, row.system, "", "verdict", judged)
    cells += [
        ", ".join(f"{d:+.2f}" for d in bleu.per_seed) if bleu else "",
        fmt(bleu.effect) if bleu else "",
        judged,
        row.note if row.note != "baseline" else "",
    ]
    return cells


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
