"""The report's sections about runs and encodings, one row or line per run or encoding.

They are: 1. Runs (status, shared setup, differing settings), 2. Learning curves, 6. Cost
(against the reference encoding) and 7. Attention maps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from posenc.analysis.report.benchtime import BenchTimes, bench_time
from posenc.analysis.report.curves import (
    kendall_tau,
    means_at_equal_steps,
    rankings_at_last_validations,
    swaps_against_noise,
)
from posenc.analysis.report.figures import MAX_ATTENTION_BYTES, plot_curves, render_attention
from posenc.analysis.report.render import SECTIONS, Writer, fmt, fmt_stats, record_stats, slug
from posenc.analysis.report.runs import (
    DONE,
    FAILED,
    UNFINISHED,
    Group,
    Run,
    differing_keys,
    first_line,
)
from posenc.analysis.report.stats import COST_METRICS, cost_values, mean_std
from posenc.config import UNREPORTED_KEYS
from posenc.runtime import untrusted
from posenc.runtime.files import replacing
from posenc.runtime.rundir import RunDir
from posenc.runtime.version import describe

#: the line of the shared setup that holds the top-level keys (``device``, ``name``, ...)
TOP_LEVEL = "run"

# ---------------------------------------------------------------- 1. runs


def section_runs(w: Writer, runs: Sequence[Run], groups: Sequence[Group], focus: str) -> None:
    """Every run with its status, the code and hardware, and the settings that differ (the
    shared setup is the report's last section, :func:`section_setup`, after the figures)."""
    w.heading(SECTIONS[0])
    counts = Counter(r.status for r in runs)
    w.text(
        f"{len(runs)} run(s): {counts[DONE]} done, {counts[FAILED]} failed, "
        f"{counts[UNFINISHED]} unfinished."
    )
    header = [
        "run",
        "encoding",
        "seed",
        "status",
        "steps",
        "train s",
        "best valid loss",
        f"{focus} BLEU",
        "note",
    ]
    rows = []
    for run in runs:
        bleu = run.metrics.get("splits", {}).get(focus, {}).get("bleu")
        values = {
            "steps": run.last_step,
            "train_seconds": run.train.get("train_seconds"),
            "best_valid_loss": run.train.get("best_valid_loss"),
            "bleu": bleu,
        }
        w.record("runs", focus, run.label, run.name, "status", run.status)
        for metric, value in values.items():
            w.record("runs", focus, run.label, run.name, metric, value)
        rows.append(
            [
                f"`{run.name}`",
                run.label,
                run.seed if run.config else "—",
                run.status,
                fmt(values["steps"]),
                fmt(values["train_seconds"], 1),
                fmt(values["best_valid_loss"], 4),
                fmt(bleu),
                run.message,
            ]
        )
    w.table(header, rows)
    w.text(code_line(runs))
    w.text(machine_line(runs))
    configured = [r for r in runs if r.config]
    if configured:
        differing_lines(w, configured, groups)


def code_line(runs: Sequence[Run]) -> str:
    """Which code trained the runs (``code`` of their training summaries): one version, or each
    with its runs' count and a warning that runs of different code compare only when they are
    shown to train identically."""
    versions = Counter(describe(r.train["code"]) for r in runs if r.train.get("code"))
    unknown = sum(not r.train.get("code") for r in runs)
    parts = [f"{version} ({n} run(s))" for version, n in versions.items()]
    if unknown:
        parts.append(
            f"not recorded ({unknown} run(s): unfinished, or trained before posenc recorded it)"
        )
    if len(versions) == 1 and not unknown:
        return f"Code: {next(iter(versions))}, for every run."
    warning = (
        " Runs of different code compare only where they were shown to train identically."
        if len(versions) > 1
        else ""
    )
    return "Code: " + "; ".join(parts) + "." + warning


def machine_line(runs: Sequence[Run]) -> str:
    """Which hardware the runs computed on (``machine`` of their training summaries), each with
    its runs' count: runs of one code and seed agree bit for bit only on the same hardware."""
    machines = Counter(
        " + ".join(str(m[k]) for k in ("cpu", "cpu_capability", "gpu") if m.get(k))
        for r in runs
        if isinstance(m := r.train.get("machine"), dict)
    )
    unknown = sum(not isinstance(r.train.get("machine"), dict) for r in runs)
    parts = [f"{name} ({n} run(s))" for name, n in machines.items()]
    if unknown:
        parts.append(f"not recorded ({unknown} run(s))")
    return "Hardware: " + "; ".join(parts) + "."


def shared_settings(runs: Sequence[Run]) -> dict[str, Any]:
    """The config keys every run has with the same value, in config order, ``UNREPORTED_KEYS``
    left out: ``{key: value}``."""
    varying = set(differing_keys(runs))
    return {
        k: v for k, v in runs[0].config.items() if k not in varying and k not in UNREPORTED_KEYS
    }


def setup_groups(shared: dict[str, Any]) -> dict[str, list[str]]:
    """The shared settings by config group (the key's first dotted component; top-level keys
    under :data:`TOP_LEVEL`), as ``name=value`` with the group left out of the name; the
    encodings' ``pe.*`` are left out (section 1 lists them per encoding)."""
    groups: dict[str, list[str]] = {}
    for key, value in shared.items():
        group, dot, name = key.partition(".")
        if group == "pe":
            continue
        if not dot:
            group, name = TOP_LEVEL, key
        groups.setdefault(group, []).append(f"{name}={value}")
    return groups


def section_setup(w: Writer, runs: Sequence[Run]) -> None:
    """The setup the runs share, one line per config group (``- **model**: d_model=128, ...``),
    then every shared setting in a ``<details>`` block."""
    runs = [r for r in runs if r.config]
    if not runs:
        return
    w.heading(SECTIONS[7])
    shared = shared_settings(runs)
    w.text(*[f"- **{g}**: " + ", ".join(items) for g, items in setup_groups(shared).items()])
    w.details("All shared settings", *[f"- `{k}`: {v}" for k, v in sorted(shared.items())])


def differing_lines(w: Writer, runs: Sequence[Run], groups: Sequence[Group]) -> None:
    """The settings that differ between runs, and each encoding's hyper-parameters."""
    w.heading("Differing settings", 3)
    keys = [k for k in differing_keys(runs) if not k.startswith("pe.") or k == "pe.name"]
    lines = []
    for key in keys:
        values = dict.fromkeys(str(r.config.get(key, "<unset>")) for r in runs)
        lines.append(f"- `{key}`: " + ", ".join(values))
    w.text(*(lines or ["- none"]))
    w.text("Encoding hyper-parameters (`configs/pe/*.yaml`):")
    params = []
    for group in groups:
        config = next((r.config for r in group.runs if r.config), {})
        items = [
            f"{k[3:]}={v}"
            for k, v in config.items()
            if k.startswith("pe.") and k not in ("pe.name", "pe._target_")
        ]
        params.append(f"- {group.label}: " + (", ".join(items) or "none"))
    w.text(*params)


# ---------------------------------------------------------------- 2. learning curves


def section_curves(
    w: Writer, groups: Sequence[Group], styles: dict[str, Any], bench: str | None = None
) -> None:
    """Validation and training loss against steps and against training time (and, with
    ``bench``, the benchmark named so, against benchmark time), and a summary table."""
    w.heading(SECTIONS[1])
    w.text(
        "Left: validation loss (token-level NLL, no label smoothing); right: training loss "
        "(the objective, label smoothing included, each run's trailing mean over 5% of its "
        "points), from each run's TensorBoard events, unfinished runs included. Thick line: "
        "mean over seeds (n), linearly interpolated, drawn only where every seed has data, so "
        "it ends where the shortest seed ends; band: min–max over seeds there; thin lines: what "
        "a seed logged beyond that range. Time is training time in whole seconds, evaluation "
        "excluded."
    )
    plot_curves(w, groups, "steps", styles, "training step")
    plot_curves(w, groups, "time", styles, "training time (s), as measured")
    if bench is not None:
        w.text(
            "The measured training time depends on what shared the machine with each run. "
            f"Benchmark time is each run's steps times its encoding's step time in {bench}: "
            "the time to read for comparing encodings."
        )
        plot_curves(w, groups, "bench", styles, "benchmark time (s): steps x benchmarked step")
    rows = []
    for group in groups:
        curves = [r.curves["steps"] for r in group.runs if "steps" in r.curves]
        best = mean_std(float(y.min()) for _, y in curves)
        last = mean_std(float(y[-1]) for _, y in curves)
        steps = mean_std(float(x[-1]) for x, _ in curves)
        seconds = mean_std(float(r.curves["time"][0][-1]) for r in group.runs if "time" in r.curves)
        for metric, stats in (
            ("best_valid_loss", best),
            ("last_valid_loss", last),
            ("last_step", steps),
            ("last_second", seconds),
        ):
            record_stats(w, "curves", "valid", group.label, metric, stats)
        rows.append(
            [
                group.label,
                len(curves),
                fmt_stats(best, 4),
                fmt_stats(last, 4),
                fmt_stats(steps, 0),
                fmt_stats(seconds, 0),
            ]
        )
    header = ["encoding", "runs with curves", "best valid loss", "last valid loss", "last step"]
    w.table([*header, "last second"], rows)
    equal_steps_table(w, groups)
    settling_line(w, groups)


def equal_steps_table(w: Writer, groups: Sequence[Group]) -> None:
    """Mean validation loss at the last validation steps that every run logged and at the last
    ones after them that the runs of two systems or more logged, unfinished runs included, the
    systems ordered at the latest step all of them reached (CSV metric
    ``valid_loss_at_step_N``): with runs that stopped at different steps (a time budget, shared
    unevenly), the comparison at equal steps."""
    steps, means = means_at_equal_steps(
        {g.label: [r.curves["steps"] for r in g.runs if "steps" in r.curves] for g in groups}
    )
    if len(means) < 2 or not steps:
        return
    shared = [i for i, step in enumerate(steps) if all(m[i] is not None for m in means.values())]
    order = sorted(means, key=lambda name: means[name][shared[-1]] if shared else 0.0)
    for name in order:
        for step, mean in zip(steps, means[name], strict=True):
            w.record("curves", "valid", name, "", f"valid_loss_at_step_{step}", mean)
    at = f", ordered at step {steps[shared[-1]]:,}, the last every system reached" if shared else ""
    w.text(f"Mean validation loss at equal steps (— where a system stopped before){at}:")
    w.table(
        ["encoding", *(f"step {step:,}" for step in steps)],
        [[name, *(fmt(m, 4) for m in means[name])] for name in order],
    )


def settling_line(w: Writer, groups: Sequence[Group]) -> None:
    """Whether the ranking by mean validation loss is the same at the last two validations that
    every finished run logged (the study's rule for a budget long enough), with Kendall's tau,
    and when it is not, whether each pair that swapped places is apart by less than twice the
    seed standard error of its difference (a tie the seeds cannot order: settled up to noise);
    unfinished runs are left out, as their last validations would decide the steps compared."""
    finished = {
        g.label: [r.curves["steps"] for r in g.runs if r.status == DONE and "steps" in r.curves]
        for g in groups
    }
    rankings = rankings_at_last_validations({k: v for k, v in finished.items() if v})
    if len(rankings) < 2:
        return
    (before, first), (last, second) = rankings
    tau = kendall_tau(first, second)
    swaps = swaps_against_noise(finished, first, second, last)
    beyond = [s for s in swaps if s[3] is None or s[2] >= 2 * s[3]]
    w.record("curves", "valid", "", "", "ranking_settled", int(first == second))
    w.record("curves", "valid", "", "", "ranking_tau", tau)
    w.record("curves", "valid", "", "", "ranking_swaps", len(swaps))
    w.record("curves", "valid", "", "", "ranking_swaps_beyond_noise", len(beyond))
    if first == second:
        verdict = "the same: the ranking has settled"
    elif not beyond:
        widest = max(swaps, key=lambda s: s[2])
        verdict = (
            f"{len(swaps)} pairs swapped places, each by less than twice the seed standard "
            f"error of its difference (the widest, {widest[0]} and {widest[1]}: "
            f"{widest[2]:.4f} against {widest[3]:.4f}): settled up to the seeds' noise"
        )
    else:
        named = ", ".join(
            f"{a} and {b} ({gap:.4f}"
            + (f" against a standard error of {noise:.4f})" if noise is not None else ", one seed)")
            for a, b, gap, noise in beyond
        )
        verdict = (
            f"not settled: {len(beyond)} of {len(swaps)} swapped pairs are apart by at least "
            f"twice their seed standard error, or have one seed: {named}"
        )
    w.text(
        f"Ranking by mean validation loss at step {before}: {' < '.join(first)}; at step {last}: "
        f"{' < '.join(second)}; {verdict} (Kendall's tau {tau:.2f})."
    )


# ---------------------------------------------------------------- 6. cost


def section_cost(w: Writer, groups: Sequence[Group], focus: str, reference: str) -> None:
    """Training and decoding speed, memory and size per encoding, and relative to the
    ``reference`` encoding's group with the same other settings (columns ``× REFERENCE``, CSV
    metrics ``METRIC_vs_REFERENCE``)."""
    w.heading(SECTIONS[5])
    values = {g.label: cost_values(g, focus) for g in groups}
    header = ["encoding"]
    for label in COST_METRICS.values():
        header += [label.format(focus=focus), f"× {reference}"]
    rows = []
    for group in groups:
        base = next((g for g in groups if g.pe == reference and g.variant == group.variant), None)
        cells = [group.label]
        for metric in COST_METRICS:
            stats = values[group.label][metric]
            ref = values[base.label][metric] if base else None
            ratio = stats[0] / ref[0] if stats and ref and ref[0] else None
            record_stats(w, "cost", focus, group.label, metric, stats)
            w.record("cost", focus, group.label, "", f"{metric}_vs_{reference}", ratio)
            cells += [fmt_stats(stats, 0 if metric != "train_seconds" else 1), fmt(ratio, 2)]
        rows.append(cells)
    w.table(header, rows)
    notes = [
        "Means over the seeds that report each value. Training time excludes evaluation. "
        f"Ratios are against `{reference}` (`reference_pe` in the runs' configs, or `--reference`)."
    ]
    if any(r.train.get("device") == "cpu" for g in groups for r in g.runs):
        notes.append(
            "On CPU, peak memory is the largest resident set of the training process sampled "
            "while a batch's activations are alive: it includes the corpus, the libraries and, "
            "in a sweep worker that ran an earlier job, what that job left. Own memory is the "
            "same sample above the process's resident set once the run's data was loaded and "
            "freed memory returned (model, optimizer, batches and activations): compare "
            "encodings by it. Speeds are only comparable between runs that shared the machine "
            "in the same way."
        )
    if not any(g.pe == reference for g in groups):
        notes.append(f"No `{reference}` run: the relative columns are empty.")
    w.text(*notes)


def section_bench_cost(
    w: Writer, groups: Sequence[Group], reference: str, times: BenchTimes, name: str
) -> None:
    """Cost as the quiet benchmark ``times`` (file ``name``) measured it, beside the measured
    cost above: each encoding's training step and cached decoding, ratios to ``reference``'s,
    and each group's benchmark training time (its runs' steps times the step; CSV metrics
    ``bench_*``). A variant the benchmark did not measure (``--variant``) has its encoding's
    times, marked so."""
    w.text(
        f"Cost in the quiet benchmark `{name}` ({times.shape}; one process, nothing beside it): "
        "the training step and the cached greedy decoding of one batch, means over its lengths "
        "of the medians, and each row's benchmark training time, its runs' steps times the "
        "step, which is the time to compare encodings by. A variant the benchmark did not "
        "measure has its encoding's times, marked *."
    )
    header = [
        "encoding",
        "step ms",
        f"× {reference}",
        "decoding ms",
        f"× {reference}",
        "benchmark training s",
    ]
    rows = []
    for group in groups:
        step, own = bench_time(times.train, group.label, group.pe)
        decode, own_decode = bench_time(times.decode, group.label, group.pe)
        ref_step, ref_decode = times.train.get(reference), times.decode.get(reference)
        steps = [r.last_step for r in group.runs if r.status == DONE and r.last_step]
        seconds = mean_std([n * step for n in steps]) if step is not None else None
        values = {
            "bench_step_ms": None if step is None else step * 1000,
            f"bench_step_vs_{reference}": _ratio(step, ref_step),
            "bench_decode_ms": None if decode is None else decode * 1000,
            f"bench_decode_vs_{reference}": _ratio(decode, ref_decode),
        }
        for metric, value in values.items():
            w.record("cost", "", group.label, "", metric, value)
        record_stats(w, "cost", "", group.label, "bench_train_seconds", seconds)
        label = group.label if own and own_decode else f"{group.label} *"
        rows.append([label, *(fmt(v, 2) for v in values.values()), fmt_stats(seconds, 0)])
    w.table(header, rows)


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


# ---------------------------------------------------------------- 7. attention maps


def section_attention(w: Writer, groups: Sequence[Group]) -> None:
    """One example attention map per encoding from its lowest-seed run that has one: drawn
    from ``attention.npz`` (tokens on the axes, a colour bar per site), else the run's own
    ``attention.png``; the encodings without one are named."""
    w.heading(SECTIONS[6])
    w.text(
        "Layer-0 attention weights on the first sentence pair of the run's first evaluation "
        "split: encoder self-attention, decoder self-attention and cross-attention in rows, "
        "heads in columns; queries down, keys across, labelled with the tokens the model saw "
        "(every k-th past 40); the colour bar of each row runs from 0 to that site's 99th "
        "percentile. Runs evaluated before the maps held their tokens show positions instead."
    )
    missing = []
    for group in groups:
        run = next(
            (
                r
                for r in group.runs
                if r.status == DONE
                and any(RunDir(r.results).attention(kind).exists() for kind in ("npz", "png"))
            ),
            None,
        )
        if run is None:
            missing.append(group.label)
            continue
        target = w.out / f"attention_{slug(group.label)}.png"
        try:
            files = RunDir(run.results)
            if files.attention("npz").exists():
                render_attention(files.attention("npz"), f"{group.label}: {run.name}", target)
            else:
                png = untrusted.read_bytes(files.attention("png"), MAX_ATTENTION_BYTES)
                with replacing(target, "wb") as handle:
                    handle.write(png)
        except Exception as err:  # one unreadable file must not stop the report
            w.text(
                f"**{group.label}**: attention map of `{run.name}` unreadable ({first_line(err)})."
            )
            continue
        w.image(target.name, "attention", f"**{group.label}** (run `{run.name}`):")
    if missing:
        w.text("No attention map (`attention.png` / `attention.npz`) for: " + ", ".join(missing))
