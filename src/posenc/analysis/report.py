"""The report of a sweep: tables, figures and a CSV from the run directories of a multirun.

``python scripts/report.py SWEEP_DIR [--out DIR] [--split test] [--bootstrap 1000] [--eval NAME]``
reads every directory under ``SWEEP_DIR`` that holds a ``config.yaml`` (Hydra puts each job of a
multirun in ``SWEEP_DIR/<override_dirname>/``) and writes into ``--out`` (default
``SWEEP_DIR/report``); scores come from each run's own evaluation, or with ``--eval NAME`` from
its standalone evaluation ``RUN/evals/NAME/`` (see :mod:`posenc.evaluation.evaluate`):

- ``report.md``: a reading (one paragraph, also in ``reading.txt``: what the significance tests
  say and how far to trust them, see :mod:`posenc.analysis.reading`), then runs and their status,
  learning curves, scores, significance, length buckets, cost and attention maps, every split of
  the metrics (the focus split ``--split`` first);
- ``*.png``: the figures the report shows;
- ``report.csv``: every number of the tables, long format ``section,split,encoding,run,metric,
  value`` (``run`` is empty for a mean over seeds).

Runs are grouped by encoding (``pe.name``, plus any other training setting that differs between
the runs, seeds aside). A failed run (``failed.json``) or an unfinished one (no ``metrics.json``
yet) is listed with its status, never dropped, and its curves so far are plotted.

Significance is sacreBLEU's own paired bootstrap resampling (``sacrebleu.significance.
PairedTest`` with ``test_type="bs"``, the ``--paired-bs`` of its command line) of every system
against the one with the best mean BLEU. With several seeds, the hypotheses of the seeds both
systems have are concatenated in seed order and compared against the references repeated as
often, so every seed counts and the pairs stay aligned.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from posenc.analysis.reading import reading
from posenc.runtime.files import read_json

DONE, FAILED, UNFINISHED = "done", "failed", "unfinished"
SECTIONS = (
    "1. Runs",
    "2. Learning curves",
    "3. Scores",
    "4. Significance",
    "5. Length buckets",
    "6. Cost",
    "7. Attention maps",
)
#: settings that may differ between runs of one encoding without making it another system
IGNORED_KEYS = {
    "seed",
    "name",
    "cache_dir",
    "device",
    "threads",
    "trainer.resume",
    "trainer.progress",
    "trainer.log_every",
    "eval.splits",
}
#: settings left out of the report: where this machine caches tokenizers (no result depends on it)
UNREPORTED_KEYS = {"cache_dir"}
#: the shared setup shown in section 1: (what, config keys)
SETUP_KEYS = (
    (
        "data",
        (
            "data.name",
            "data.kind",
            "data.task",
            "data.src_lang",
            "data.tgt_lang",
            "data.train_size",
            "data.valid_size",
            "data.test_size",
            "data.min_len",
            "data.max_len",
            "data.clean.max_words",
        ),
    ),
    ("tokenizer", ("tokenizer.kind", "tokenizer.vocab_size")),
    (
        "model",
        (
            "model.d_model",
            "model.n_heads",
            "model.encoder_layers",
            "model.decoder_layers",
            "model.d_ff",
            "model.norm_first",
            "model.dropout",
        ),
    ),
    (
        "budget",
        (
            "trainer.max_steps",
            "trainer.max_time",
            "trainer.max_tokens",
            "trainer.accumulate",
            "trainer.max_positions",
            "trainer.lr",
            "trainer.schedule",
            "trainer.warmup_steps",
        ),
    ),
    (
        "evaluation",
        ("eval.checkpoint", "eval.max_sentences", "eval.use_cache", "eval.bertscore.model"),
    ),
)
IDENTICAL = "output identical to the baseline's: p = 1"
CURVE_TAGS = {"steps": "valid/loss", "time": "time/valid_loss"}
MAX_GRID = 300

Curve = tuple[np.ndarray, np.ndarray]


class ReportError(ValueError):
    """The sweep cannot be reported (no runs, unknown split); the message says why."""


@dataclass
class Run:
    """One run directory: its flattened config, status, metrics, training summary and curves."""

    name: str
    path: Path
    config: dict[str, Any]
    status: str = UNFINISHED
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    label: str = ""
    results: Path | None = None

    def __post_init__(self) -> None:
        if self.results is None:
            self.results = self.path

    @property
    def pe(self) -> str:
        """The encoding's name (``pe.name``)."""
        return str(self.config.get("pe.name", "?"))

    @property
    def seed(self) -> int:
        """The training seed."""
        return int(self.config.get("seed", 0) or 0)

    @property
    def last_step(self) -> int | None:
        """Steps trained: from the summary, else the last validation step logged so far."""
        if self.train.get("steps") is not None:
            return int(self.train["steps"])
        if "steps" in self.curves:
            return int(self.curves["steps"][0][-1])
        return None


@dataclass
class Group:
    """The runs of one encoding (several seeds); ``variant`` names other differing settings."""

    label: str
    pe: str
    variant: str
    runs: list[Run]


@dataclass
class Entry:
    """One run's scores on one split for one system (the run's encoding or a test-time variant
    from ``eval.pe_variants``), with its hypothesis and reference files."""

    system: str
    run: Run
    scores: dict[str, Any]
    hypotheses: Path
    references: Path


@dataclass
class Paired:
    """A row of the significance table."""

    system: str
    seeds: tuple[int, ...] = ()
    results: dict[str, Any] = field(default_factory=dict)  # metric -> sacrebleu Result
    note: str = ""


class Writer:
    """Collects the markdown lines, the CSV rows and the figures of the report."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []
        self.rows: list[dict[str, Any]] = []

    def text(self, *lines: str) -> None:
        """Append paragraphs (one blank line after them)."""
        self.lines.extend([*lines, ""])

    def heading(self, title: str, level: int = 2) -> None:
        """A markdown heading."""
        self.text("#" * level + " " + title)

    def table(self, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        """A markdown table; cells are escaped."""

        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", " ")

        body = [" | ".join(cell(c) for c in row) for row in rows]
        self.text(" | ".join(header), " | ".join("---" for _ in header), *body)

    def record(
        self, section: str, split: str, encoding: str, run: str, metric: str, value: Any
    ) -> None:
        """One CSV row (skipped when ``value`` is None)."""
        if value is not None:
            self.rows.append(
                {
                    "section": section,
                    "split": split,
                    "encoding": encoding,
                    "run": run,
                    "metric": metric,
                    "value": value,
                }
            )

    def figure(self, fig: Figure, name: str, caption: str) -> None:
        """Save ``fig`` as ``out/name`` and show it in the report."""
        fig.savefig(self.out / name, dpi=110)
        self.text(f"![{caption}]({name})")

    def save(self) -> Path:
        """Write ``report.md`` and ``report.csv``; returns the path of ``report.md``."""
        with open(self.out / "report.csv", "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(
                handle, ["section", "split", "encoding", "run", "metric", "value"]
            )
            writer.writeheader()
            writer.writerows(self.rows)
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines).rstrip() + "\n", encoding="utf-8")
        return path


# ---------------------------------------------------------------- reading the run directories


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and empty mappings stay values."""
    if isinstance(node, dict) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node} if prefix else {}


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_curves(tb_dir: Path) -> dict[str, Curve]:
    """Validation loss against steps and against training seconds from TensorBoard events
    (``{"steps": (x, y), "time": (x, y)}``, the tags that exist; the last value of a step wins)."""
    if not tb_dir.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    try:
        events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(events.Tags().get("scalars", []))
        curves: dict[str, Curve] = {}
        for name, tag in CURVE_TAGS.items():
            if tag in tags:
                points = {e.step: e.value for e in events.Scalars(tag)}
                x = np.array(sorted(points), dtype=float)
                curves[name] = (x, np.array([points[s] for s in sorted(points)], dtype=float))
    except Exception:  # a half-written event file of a running job must not stop the report
        return {}
    return curves


def find_run_dirs(sweep: Path, out: Path) -> list[Path]:
    """Directories under ``sweep`` (itself included) with a ``config.yaml``, except Hydra's
    hidden ``.hydra/`` copies, standalone evaluations (``evals/``) and the report's own
    directory."""
    found = []
    for config in sorted(sweep.rglob("config.yaml")):
        parts = config.parent.relative_to(sweep).parts
        if any(p.startswith(".") or p == "evals" for p in parts) or out in config.parents:
            continue
        found.append(config.parent)
    return found


def load_run(path: Path, sweep: Path, evaluation: str | None = None) -> Run:
    """Read one run directory; its status is failed (``failed.json`` or unreadable files), done
    (``metrics.json``) or unfinished. Scores come from the run's own evaluation, or from its
    standalone evaluation ``RUN/evals/<evaluation>/`` when one is named."""
    name = str(path.relative_to(sweep)) if path != sweep else path.name
    try:
        config = flatten(OmegaConf.to_container(OmegaConf.load(path / "config.yaml")))
    except Exception as err:  # a broken config is a failed run in the table, not a crash
        return Run(name, path, {}, FAILED, f"config.yaml unreadable: {_first_line(err)}")
    results = path / "evals" / evaluation if evaluation else path
    run = Run(name, path, config, curves=read_curves(path / "tb"), results=results)
    run.train = read_json(path / "train_summary.json") or {}
    if (path / "failed.json").exists():
        info = read_json(path / "failed.json") or {}
        run.status = FAILED
        error, message = info.get("error", "error"), info.get("message", "failed.json unreadable")
        run.message = f"{error}: {message}"
    elif (results / "metrics.json").exists():
        metrics = read_json(results / "metrics.json")
        if metrics is None:
            run.status, run.message = FAILED, "metrics.json unreadable"
        else:
            run.status, run.metrics = DONE, metrics
            run.train = metrics.get("train") or run.train
    elif run.train:
        run.message = (
            f"trained, no evaluation {evaluation}" if evaluation else "trained, not evaluated"
        )
    elif run.last_step is not None:
        run.message = f"running or interrupted; last validation at step {run.last_step}"
    else:
        run.message = "running or interrupted; nothing logged yet"
    return run


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """Config keys whose value (or presence) is not the same in every run."""
    keys = sorted({k for r in runs for k in r.config})
    return [k for k in keys if len({_value_key(r.config.get(k, "<unset>")) for r in runs}) > 1]


def _is_variant_key(key: str) -> bool:
    return key not in IGNORED_KEYS and not key.startswith(("pe.", "eval.pe_variants"))


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group runs by encoding; settings other than the seed that differ between the healthy
    runs (a model size, say) make separate groups, labelled ``pe (key=value, ...)``, and so do
    ``pe.*`` settings that differ between runs of the same encoding (an encoder form, say)."""
    healthy = [r for r in runs if r.status != FAILED]
    variant_keys = [k for k in differing_keys(healthy) if _is_variant_key(k)]
    pe_keys = {
        pe: [
            k
            for k in differing_keys([r for r in healthy if r.pe == pe])
            if k.startswith("pe.") and k != "pe.name"
        ]
        for pe in {r.pe for r in runs}
    }
    groups: dict[str, Group] = {}
    for run in runs:
        keys = pe_keys.get(run.pe, []) + variant_keys
        variant = ", ".join(f"{k}={run.config.get(k, '?')}" for k in keys)
        run.label = f"{run.pe} ({variant})" if variant else run.pe
        groups.setdefault(run.label, Group(run.label, run.pe, variant, [])).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: (r.seed, r.name))
    return list(groups.values())


def split_names(runs: Sequence[Run], focus: str) -> list[str]:
    """The splits in the metrics of the finished runs, ``focus`` first.

    Raises:
        ReportError: runs are finished but none has the ``focus`` split.
    """
    found = list(dict.fromkeys(s for r in runs for s in r.metrics.get("splits", {})))
    if found and focus not in found:
        raise ReportError(f"split {focus!r} is in no metrics.json; found: {', '.join(found)}")
    return sorted(found, key=lambda s: s != focus)


def split_entries(groups: Sequence[Group], split: str) -> dict[str, list[Entry]]:
    """Per system, the finished runs' scores on ``split``: the encoding itself and each
    test-time variant (system ``label [variant]``)."""
    systems: dict[str, list[Entry]] = {}
    for group in groups:
        for run in group.runs:
            scores = run.metrics.get("splits", {}).get(split)
            if scores is not None:
                systems.setdefault(group.label, []).append(
                    Entry(
                        group.label,
                        run,
                        scores,
                        run.results / f"hypotheses.{split}.txt",
                        run.results / f"references.{split}.txt",
                    )
                )
            for name, variant in (run.metrics.get("variants") or {}).items():
                v_scores = variant.get("splits", {}).get(split)
                if v_scores is not None:
                    system = f"{group.label} [{name}]"
                    systems.setdefault(system, []).append(
                        Entry(
                            system,
                            run,
                            v_scores,
                            run.results / f"hypotheses.{split}.{name}.txt",
                            run.results / f"references.{split}.txt",
                        )
                    )
    return systems


# ---------------------------------------------------------------- numbers and formatting


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` (None and NaN dropped)."""
    return [
        float(v)
        for v in values
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]


def mean_std(values: Iterable[Any]) -> tuple[float, float, int] | None:
    """Mean, sample standard deviation (0 for one value) and count, or None without values."""
    vals = finite(values)
    if not vals:
        return None
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)


def fmt(value: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals (integers with thousands separators); "—" for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_stats(stats: tuple[float, float, int] | None, digits: int = 2) -> str:
    """``mean ± std`` (just the mean for one seed)."""
    if stats is None:
        return "—"
    mean, std, n = stats
    return f"{mean:,.{digits}f} ± {std:,.{digits}f}" if n > 1 else f"{mean:,.{digits}f}"


def record_stats(
    w: Writer,
    section: str,
    split: str,
    encoding: str,
    metric: str,
    stats: tuple[float, float, int] | None,
) -> None:
    """CSV rows ``METRIC_mean``, ``METRIC_std`` and ``METRIC_n`` of a mean over seeds."""
    if stats is not None:
        for suffix, value in zip(("mean", "std", "n"), stats, strict=True):
            w.record(section, split, encoding, "", f"{metric}_{suffix}", value)


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "x"


def new_figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Any]]:
    """A figure drawn by the Agg backend (no pyplot state) with ``panels`` side by side."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def palette(names: Iterable[str]) -> dict[str, Any]:
    """A fixed colour per name (sorted), shared by every figure."""
    ordered = sorted(set(names))
    cmap = colormaps["tab10" if len(ordered) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(ordered)}


# ---------------------------------------------------------------- 1. runs


def section_runs(w: Writer, runs: Sequence[Run], groups: Sequence[Group], focus: str) -> None:
    """Every run with its status, the shared setup and the settings that differ."""
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
    configured = [r for r in runs if r.config]
    if configured:
        setup_lines(w, configured)
        differing_lines(w, configured, groups)


def setup_lines(w: Writer, runs: Sequence[Run]) -> None:
    """The setup the runs share (differing values say "varies"), and all shared keys."""
    w.heading("Shared setup", 3)
    lines = []
    for what, keys in SETUP_KEYS:
        parts = []
        for key in keys:
            values = {_value_key(r.config[key]) for r in runs if key in r.config}
            if values:
                shown = runs[0].config.get(key) if len(values) == 1 else "varies"
                parts.append(f"{key.split('.', 1)[1]}={shown}")
        if parts:
            lines.append(f"- **{what}**: " + ", ".join(parts))
    w.text(*lines)
    varying = set(differing_keys(runs))
    shared = {
        k: v for k, v in runs[0].config.items() if k not in varying and k not in UNREPORTED_KEYS
    }
    w.text(
        "<details><summary>All shared settings</summary>",
        "",
        *[f"- `{k}`: {v}" for k, v in sorted(shared.items())],
        "",
        "</details>",
    )


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


def common_grid(curves: Sequence[Curve]) -> np.ndarray:
    """The union of the curves' x values, or an even grid over their range when that is long."""
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    if len(grid) > MAX_GRID:
        grid = np.linspace(grid[0], grid[-1], MAX_GRID)
    return grid


def aggregate_curves(curves: Sequence[Curve], grid: np.ndarray) -> dict[str, np.ndarray]:
    """Seeds interpolated onto ``grid`` (each only inside its own range, never extrapolated):
    mean, min, max and how many seeds cover each point; points no seed covers are dropped."""
    values = np.full((len(curves), len(grid)), np.nan)
    for i, (x, y) in enumerate(curves):
        inside = (grid >= x[0]) & (grid <= x[-1])
        values[i, inside] = np.interp(grid[inside], x, y)
    count = np.sum(~np.isnan(values), axis=0)
    keep = count > 0
    values = values[:, keep]
    return {
        "x": grid[keep],
        "mean": np.nanmean(values, axis=0),
        "min": np.nanmin(values, axis=0),
        "max": np.nanmax(values, axis=0),
        "count": count[keep],
    }


def plot_curves(
    w: Writer, groups: Sequence[Group], kind: str, colours: dict[str, Any], xlabel: str
) -> None:
    """``valid_loss_vs_KIND.png``: one line per encoding (mean over seeds), min–max band."""
    fig, (ax,) = new_figure(7.5, 4.5)
    for group in groups:
        curves = [r.curves[kind] for r in group.runs if kind in r.curves]
        if not curves:
            continue
        agg = aggregate_curves(curves, common_grid(curves))
        colour = colours[group.label]
        ax.plot(
            agg["x"],
            agg["mean"],
            color=colour,
            marker="." if len(agg["x"]) < 30 else None,
            label=f"{group.label} (n={len(curves)})",
        )
        if len(curves) > 1:
            ax.fill_between(agg["x"], agg["min"], agg["max"], color=colour, alpha=0.2, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss (token NLL)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    w.figure(fig, f"valid_loss_vs_{kind}.png", f"validation loss vs {kind}")


def section_curves(w: Writer, groups: Sequence[Group], colours: dict[str, Any]) -> None:
    """Validation loss against steps and against training time, and a summary table."""
    w.heading(SECTIONS[1])
    w.text(
        "Validation loss (token-level NLL, no label smoothing) from each run's TensorBoard "
        "events, unfinished runs included. Lines: mean over seeds after linear interpolation "
        "onto a common grid (each seed only inside its own range); band: min–max over seeds. "
        "Time is training time in whole seconds, evaluation excluded."
    )
    plot_curves(w, groups, "steps", colours, "training step")
    plot_curves(w, groups, "time", colours, "training time (s)")
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
    w.table(
        [
            "encoding",
            "runs with curves",
            "best valid loss",
            "last valid loss",
            "last step",
            "last second",
        ],
        rows,
    )


# ---------------------------------------------------------------- 3. scores


SCORE_METRICS = (
    ("bleu", "BLEU", 2),
    ("chrf", "chrF", 2),
    ("bertscore_f1", "BERTScore F1", 4),
    ("loss", "loss", 4),
)


def system_order(systems: dict[str, list[Entry]]) -> list[str]:
    """Systems by mean BLEU, best first (systems without BLEU last)."""

    def key(name: str) -> tuple[float, str]:
        stats = mean_std(e.scores.get("bleu") for e in systems[name])
        return (-stats[0] if stats else math.inf, name)

    return sorted(systems, key=key)


def section_scores(
    w: Writer, split: str, systems: dict[str, list[Entry]], colours: dict[str, Any]
) -> None:
    """BLEU, chrF, BERTScore F1 and loss per system (mean ± std over seeds), a bar chart, and
    the metric signatures."""
    w.heading(f"{split}", 3)
    rows = []
    for name in system_order(systems):
        entries = systems[name]
        cells = [name, len(entries), fmt(entries[0].scores.get("sentences"))]
        for metric, _, digits in SCORE_METRICS:
            for entry in entries:
                w.record("scores", split, name, entry.run.name, metric, entry.scores.get(metric))
            stats = mean_std(e.scores.get(metric) for e in entries)
            record_stats(w, "scores", split, name, metric, stats)
            cells.append(fmt_stats(stats, digits))
        rows.append(cells)
    w.table(["system", "seeds", "sentences", *[label for _, label, _ in SCORE_METRICS]], rows)
    signature_lines(w, systems)
    plot_scores(w, split, systems, colours)


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


def plot_scores(
    w: Writer, split: str, systems: dict[str, list[Entry]], colours: dict[str, Any]
) -> None:
    """``scores_SPLIT.png``: BLEU, chrF and BERTScore F1 (x100) per system, bars = mean,
    error bars = std over seeds, dots = seeds."""
    order = system_order(systems)
    metrics = [
        ("bleu", "BLEU", 1.0),
        ("chrf", "chrF", 1.0),
        ("bertscore_f1", "BERTScore F1 x100", 100.0),
    ]
    metrics = [
        m for m in metrics if any(finite(e.scores.get(m[0]) for e in systems[s]) for s in order)
    ]
    fig, axes = new_figure(3.2 * max(len(metrics), 1) + 1, 4.0, max(len(metrics), 1))
    for ax, (metric, label, scale) in zip(axes, metrics, strict=False):
        for i, name in enumerate(order):
            values = [v * scale for v in finite(e.scores.get(metric) for e in systems[name])]
            if not values:
                continue
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            ax.bar(
                i,
                statistics.fmean(values),
                yerr=std,
                color=colours.get(name, "grey"),
                capsize=3,
                alpha=0.85,
            )
            ax.plot([i] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    w.figure(fig, f"scores_{slug(split)}.png", f"scores on {split}")


# ---------------------------------------------------------------- 4. significance


def read_lines(path: Path) -> list[str] | None:
    """The lines of a hypothesis/reference file (empty lines kept), or None if it is missing."""
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def seed_texts(entries: Sequence[Entry]) -> dict[int, tuple[list[str], list[str]]]:
    """Per seed (first run of a seed), hypotheses and references whose lengths agree."""
    texts: dict[int, tuple[list[str], list[str]]] = {}
    for entry in entries:
        hyps, refs = read_lines(entry.hypotheses), read_lines(entry.references)
        if hyps and refs and len(hyps) == len(refs) and entry.run.seed not in texts:
            texts[entry.run.seed] = (hyps, refs)
    return texts


def paired_bootstrap(
    named: list[tuple[str, list[str]]], references: list[str], samples: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """sacreBLEU's paired bootstrap test of ``named[1:]`` against ``named[0]`` on BLEU and chrF.

    Returns per system ``{"bleu": Result, "chrf": Result}`` (``score``, ``p_value``, bootstrap
    ``mean`` and 95% ``ci``; the baseline has no p-value) and the test signatures.
    """
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    metrics = {"bleu": BLEU(), "chrf": CHRF()}
    test = PairedTest(named, metrics, [references], test_type="bs", n_samples=samples)
    signatures, scores = test()
    names = [k for k in scores if k != "System"]  # sacrebleu's own names: BLEU, chrF2
    results = [
        {m: scores[n][i] for m, n in zip(metrics, names, strict=True)} for i in range(len(named))
    ]
    return results, {m: str(signatures[n]) for m, n in zip(metrics, names, strict=True)}


def _concat(
    texts: dict[int, tuple[list[str], list[str]]], seeds: Iterable[int], side: int
) -> list[str]:
    return [line for s in seeds for line in texts[s][side]]


def significance_rows(
    systems: dict[str, list[Entry]], baseline: str, samples: int
) -> tuple[list[Paired], dict[str, str]]:
    """Every system against ``baseline`` on the seeds both have (hypotheses concatenated in seed
    order); systems sharing the same seeds go through one ``PairedTest``. The baseline's own row
    uses all its seeds. A system whose output equals the baseline's gets p = 1 (sacrebleu's
    formula gives 1/(N+1) for a zero difference)."""
    base = seed_texts(systems[baseline])
    top = Paired(baseline, tuple(sorted(base)), note="baseline")
    rows = [top]
    by_seeds: dict[tuple[int, ...], list[Paired]] = {top.seeds: []}
    hyps: dict[str, list[str]] = {}
    for name in system_order(systems):
        if name == baseline:
            continue
        texts = seed_texts(systems[name])
        row = Paired(name, tuple(sorted(set(texts) & set(base))))
        rows.append(row)
        if not row.seeds:
            row.note = "no hypotheses for a seed the baseline has"
        elif any(texts[s][1] != base[s][1] for s in row.seeds):
            row.note = "references differ from the baseline's"
        else:
            hyps[name] = _concat(texts, row.seeds, 0)
            by_seeds.setdefault(row.seeds, []).append(row)
            if hyps[name] == _concat(base, row.seeds, 0):
                row.note = IDENTICAL
    signatures: dict[str, str] = {}
    for seeds, group in by_seeds.items():
        named = [(baseline, _concat(base, seeds, 0)), *[(r.system, hyps[r.system]) for r in group]]
        results, signatures = paired_bootstrap(named, _concat(base, seeds, 1), samples)
        if seeds == top.seeds:
            top.results = results[0]
        for row, result in zip(group, results[1:], strict=True):
            row.results = result
    return rows, signatures


def _p_value(row: Paired, metric: str) -> float | None:
    if row.note == IDENTICAL:
        return 1.0
    result = row.results.get(metric)
    return None if result is None else result.p_value


def section_significance(
    w: Writer, split: str, systems: dict[str, list[Entry]], samples: int
) -> None:
    """Paired bootstrap p-values of every system against the best one on ``split``."""
    w.heading(f"{split}", 3)
    usable = {name: entries for name, entries in systems.items() if seed_texts(entries)}
    if len(usable) < 2:
        w.text("Fewer than two systems have hypothesis files for this split: nothing to compare.")
        return
    baseline = system_order(usable)[0]
    rows, signatures = significance_rows(usable, baseline, samples)
    table = []
    for row in rows:
        cells = [row.system, ", ".join(map(str, row.seeds)) or "—"]
        for metric in ("bleu", "chrf"):
            result, p = row.results.get(metric), _p_value(row, metric)
            score = None if result is None else result.score
            for name, value in ((metric, score), (f"p_{metric}", p)):
                w.record("significance", split, row.system, "", name, value)
            ci = (
                ""
                if result is None or result.ci is None
                else (f" ({result.mean:.2f} ± {result.ci:.2f})")
            )
            cells += [fmt(score) + ci, "baseline" if row.system == baseline else fmt(p, 4)]
        table.append([*cells, row.note if row.note != "baseline" else ""])
    w.table(
        [
            "system",
            "seeds",
            "BLEU (bootstrap mean ± 95% CI)",
            "p (BLEU)",
            "chrF (bootstrap mean ± 95% CI)",
            "p (chrF)",
            "note",
        ],
        table,
    )
    w.text(
        f"Baseline: **{baseline}** (best mean BLEU). Test signatures: "
        + ", ".join(f"{m} `{s}`" for m, s in signatures.items())
    )


# ---------------------------------------------------------------- 5. length buckets


def bucket_values(
    systems: dict[str, list[Entry]],
) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int], dict[str, dict[str, list]]]:
    """The buckets ``(min, max)``, sentences per bucket, and per system the mean over seeds of
    bucket BLEU and loss (None where no seed has sentences there)."""
    buckets: dict[tuple[int, int], int] = {}
    for entries in systems.values():
        for entry in entries:
            for b in entry.scores.get("buckets") or []:
                key = (b["min"], b["max"])
                buckets[key] = max(buckets.get(key, 0), int(b.get("sentences") or 0))
    edges = sorted(buckets)
    values: dict[str, dict[str, list]] = {}
    for name, entries in systems.items():
        rows = [b for e in entries for b in e.scores.get("buckets") or []]
        values[name] = {}
        for metric in ("bleu", "loss"):
            means = [
                mean_std(b.get(metric) for b in rows if (b["min"], b["max"]) == edge)
                for edge in edges
            ]
            values[name][metric] = [None if m is None else m[0] for m in means]
    return edges, buckets, values


def length_limits(runs: Sequence[Run]) -> list[tuple[str, float, str]]:
    """The training length limits the configs give: ``(key, value, unit)``."""
    limits: dict[tuple[str, float], str] = {}
    for run in runs:
        for key, value in run.config.items():
            if not finite([value]):
                continue
            if (
                key.startswith("data.")
                and "max" in key
                and "token" in key
                and ("train" in key or "src" in key)
            ):
                limits[(key, value)] = "tokens"
            elif key == "data.clean.max_words":
                limits[(key, value)] = "words"
            elif key == "data.max_len" and run.config.get("data.kind") == "toy":
                limits[(key, value)] = "symbols"
            elif key == "trainer.max_positions":
                limits[(key, value)] = "tokens incl. EOS"
    return [(key, float(value), unit) for (key, value), unit in limits.items()]


def bucket_position(value: float, edges: Sequence[tuple[int, int]]) -> float | None:
    """Where ``value`` falls on the categorical bucket axis (bucket i spans i-0.5..i+0.5)."""
    for i, (low, high) in enumerate(edges):
        if low <= value < high:
            return i - 0.5 + (value - low) / (high - low)
    return None


def plot_buckets(
    w: Writer,
    split: str,
    edges: list[tuple[int, int]],
    values: dict[str, dict[str, list]],
    limits: list[tuple[str, float, str]],
    colours: dict[str, Any],
) -> None:
    """``buckets_SPLIT.png``: BLEU and loss by source-length bucket, one line per system, the
    training length limits as vertical lines."""
    fig, axes = new_figure(11, 4.2, 2)
    x = np.arange(len(edges))
    styles = iter(["--", ":", "-.", (0, (5, 1)), (0, (1, 3))])
    for ax, metric in zip(axes, ("bleu", "loss"), strict=True):
        for name, per in values.items():
            y = np.array([np.nan if v is None else v for v in per[metric]], dtype=float)
            ax.plot(x, y, marker="o", color=colours.get(name, "grey"), label=name)
        ax.set_xticks(x, [f"{lo}–{hi - 1}" for lo, hi in edges], rotation=45, fontsize=7)
        ax.set_xlabel("source length (tokens incl. EOS)")
        ax.set_ylabel("BLEU" if metric == "bleu" else "loss (token NLL)")
        ax.grid(alpha=0.3)
    for key, value, unit in limits:
        position = bucket_position(value, edges)
        if position is not None:
            style = next(styles, "--")
            for ax in axes:
                ax.axvline(
                    position,
                    color="black",
                    ls=style,
                    lw=1,
                    label=f"{key}={value:g} ({unit})" if ax is axes[0] else None,
                )
    axes[0].legend(fontsize=7)
    w.figure(fig, f"buckets_{slug(split)}.png", f"BLEU and loss by source length on {split}")


def section_buckets(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    limits: list[tuple[str, float, str]],
    colours: dict[str, Any],
) -> None:
    """BLEU and loss per source-length bucket (mean over seeds), tables and a figure."""
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
    header = ["system", *[f"{lo}–{hi - 1} ({sentences[(lo, hi)]})" for lo, hi in edges]]
    for metric, digits in (("bleu", 2), ("loss", 4)):
        w.text(
            f"{'BLEU' if metric == 'bleu' else 'Loss'} by source length in tokens "
            "(sentences in brackets), mean over seeds:"
        )
        rows = []
        for name in system_order(systems):
            row = values[name][metric]
            for (lo, hi), value in zip(edges, row, strict=True):
                w.record("buckets", split, name, "", f"{metric}[{lo},{hi})", value)
            rows.append([name, *[fmt(v, digits) for v in row]])
        w.table(header, rows)
    plot_buckets(w, split, edges, values, limits, colours)


# ---------------------------------------------------------------- 6. cost


def cost_values(group: Group, focus: str) -> dict[str, tuple[float, float, int] | None]:
    """Mean over seeds of training speed, peak memory, decoding speed, parameters, time."""
    runs = group.runs
    return {
        "train_tokens_per_s": mean_std(r.train.get("train_tokens_per_s") for r in runs),
        "peak_memory_mb": mean_std(r.train.get("peak_memory_mb") for r in runs),
        "decode_tokens_per_s": mean_std(
            r.metrics.get("splits", {}).get(focus, {}).get("decode_tokens_per_s") for r in runs
        ),
        "parameters": mean_std(r.train.get("parameters") for r in runs),
        "train_seconds": mean_std(r.train.get("train_seconds") for r in runs),
    }


def section_cost(w: Writer, groups: Sequence[Group], focus: str) -> None:
    """Training and decoding speed, memory and size per encoding, and relative to ``nonepe``."""
    w.heading(SECTIONS[5])
    values = {g.label: cost_values(g, focus) for g in groups}
    labels = {
        "train_tokens_per_s": "train tokens/s",
        "peak_memory_mb": "peak memory MB",
        "decode_tokens_per_s": f"decode tokens/s ({focus})",
        "parameters": "parameters",
        "train_seconds": "train s",
    }
    header = ["encoding"]
    for label in labels.values():
        header += [label, "× nonepe"]
    rows = []
    for group in groups:
        reference = next(
            (g for g in groups if g.pe == "nonepe" and g.variant == group.variant), None
        )
        cells = [group.label]
        for metric in labels:
            stats = values[group.label][metric]
            ref = values[reference.label][metric] if reference else None
            ratio = stats[0] / ref[0] if stats and ref and ref[0] else None
            record_stats(w, "cost", focus, group.label, metric, stats)
            w.record("cost", focus, group.label, "", f"{metric}_vs_nonepe", ratio)
            cells += [fmt_stats(stats, 0 if metric != "train_seconds" else 1), fmt(ratio, 2)]
        rows.append(cells)
    w.table(header, rows)
    notes = ["Means over the seeds that report each value. Training time excludes evaluation."]
    if any(r.train.get("device") == "cpu" for g in groups for r in g.runs):
        notes.append(
            "On CPU, peak memory is the largest resident set of the training process sampled "
            "while a batch's activations are alive; it includes the corpus and everything else "
            "the process holds, so only large differences mean something. Speeds are only "
            "comparable between runs that shared the machine in the same way."
        )
    if not any(g.pe == "nonepe" for g in groups):
        notes.append("No `nonepe` run: the relative columns are empty.")
    w.text(*notes)


# ---------------------------------------------------------------- 7. attention maps


def render_attention(npz: Path, title: str, target: Path) -> None:
    """Draw the arrays of an ``attention.npz`` (``(H, Lq, Lk)`` per site) as a PNG."""
    from posenc.evaluation.attention_maps import plot_attention

    with np.load(npz) as data:
        maps = {}
        for key in data.files:
            array = np.asarray(data[key], dtype=float)
            while array.ndim > 3:
                array = array[0]
            maps[key] = array.reshape((1, *array.shape)) if array.ndim == 2 else array
    if not maps or any(a.ndim != 3 for a in maps.values()):
        raise ValueError("expected arrays (H, Lq, Lk)")
    plot_attention(maps, title, target)


def section_attention(w: Writer, groups: Sequence[Group]) -> None:
    """One example attention map per encoding (``attention.png``, else drawn from
    ``attention.npz``) from its lowest-seed run that has one."""
    w.heading(SECTIONS[6])
    missing = []
    for group in groups:
        run = next(
            (
                r
                for r in group.runs
                if (r.results / "attention.png").exists() or (r.results / "attention.npz").exists()
            ),
            None,
        )
        if run is None:
            missing.append(group.label)
            continue
        target = w.out / f"attention_{slug(group.label)}.png"
        try:
            if (run.results / "attention.png").exists():
                shutil.copyfile(run.results / "attention.png", target)
            else:
                render_attention(
                    run.results / "attention.npz", f"{group.label}: {run.name}", target
                )
        except Exception as err:  # one unreadable file must not stop the report
            w.text(
                f"**{group.label}**: attention map of `{run.name}` unreadable ({_first_line(err)})."
            )
            continue
        w.text(f"**{group.label}** (run `{run.name}`):", f"![attention]({target.name})")
    if missing:
        w.text("No attention map (`attention.png` / `attention.npz`) for: " + ", ".join(missing))


# ---------------------------------------------------------------- the report


def build_report(
    sweep: Path,
    out: Path | None = None,
    focus: str = "test",
    samples: int = 1000,
    evaluation: str | None = None,
) -> Path:
    """Write the report of the sweep in ``sweep`` into ``out``; returns ``report.md``'s path.
    Scores come from each run's own evaluation, or from its standalone evaluation
    ``RUN/evals/<evaluation>/``.

    Raises:
        ReportError: ``sweep`` is no directory, holds no run, or no run has the ``focus`` split.
    """
    sweep = sweep.expanduser().resolve()
    if not sweep.is_dir():
        raise ReportError(f"{sweep} is not a directory")
    if samples < 1:
        raise ReportError(f"--bootstrap must be a positive number of resamples, not {samples}")
    out = out.expanduser().resolve() if out else sweep / "report"
    runs = [load_run(path, sweep, evaluation) for path in find_run_dirs(sweep, out)]
    if not runs:
        raise ReportError(f"no run directory (one with a config.yaml) under {sweep}")
    splits = split_names(runs, focus)
    out.mkdir(parents=True, exist_ok=True)
    groups = group_runs(runs)
    systems = {split: split_entries(groups, split) for split in splits}
    order = system_order(systems[focus]) if splits else []
    groups.sort(key=lambda g: (order.index(g.label) if g.label in order else len(order), g.label))
    colours = palette([g.label for g in groups] + [s for per in systems.values() for s in per])

    w = Writer(out)
    w.heading(f"Sweep report: {sweep.name}", 1)
    w.text(
        f"Sweep `{sweep}`; focus split `{focus}`; splits: {', '.join(splits) or 'none yet'}. "
        "Every number of the tables is also in `report.csv`."
    )
    top = len(w.lines)
    section_runs(w, runs, groups, focus)
    section_curves(w, groups, colours)
    split_sections(w, splits, systems, runs, samples, colours)
    section_cost(w, groups, focus)
    section_attention(w, groups)
    summary = reading(w.rows, splits)
    w.lines[top:top] = ["## Reading", "", summary, ""]
    (out / "reading.txt").write_text(summary + "\n", encoding="utf-8")
    return w.save()


def split_sections(
    w: Writer,
    splits: list[str],
    systems: dict[str, dict[str, list[Entry]]],
    runs: Sequence[Run],
    samples: int,
    colours: dict[str, Any],
) -> None:
    """Sections 3–5 (scores, significance, length buckets), one subsection per split."""
    if not splits:
        for title in SECTIONS[2:5]:
            w.heading(title)
            w.text("No finished run yet.")
        return
    w.heading(SECTIONS[2])
    w.text(
        "Mean ± sample standard deviation over seeds (no ± for one seed); BLEU and chrF are "
        "detokenised sacreBLEU; loss is the token-level NLL of the references."
    )
    for split in splits:
        section_scores(w, split, systems[split], colours)
    w.heading(SECTIONS[3])
    w.text(
        f"sacreBLEU's paired bootstrap resampling (`sacrebleu.significance.PairedTest`, "
        f"`test_type='bs'`, {samples} resamples, its default seed unless `SACREBLEU_SEED` is "
        "set) of each system against the best one by mean BLEU. With several seeds the "
        "hypotheses of the seeds both systems have are concatenated in seed order against "
        "the references repeated as often; the baseline's own row uses all its seeds. "
        "p is the chance of a difference at least as large under the null hypothesis."
    )
    for split in splits:
        section_significance(w, split, systems[split], samples)
    w.heading(SECTIONS[4])
    limits = length_limits([r for r in runs if r.status != FAILED])
    w.text(
        "Training length limits in the configs: "
        + (", ".join(f"`{k}` = {v:g} {u}" for k, v, u in limits) or "none found")
        + " (vertical lines where they fall inside the plotted buckets)."
    )
    for split in splits:
        section_buckets(w, split, systems[split], limits, colours)


def main(argv: Sequence[str] | None = None) -> None:
    """``python scripts/report.py SWEEP_DIR [--out DIR] [--split test] [--bootstrap N]``."""
    parser = argparse.ArgumentParser(description="Report of a sweep: report.md, PNGs, report.csv.")
    parser.add_argument("sweep", type=Path, help="the sweep directory (runs in subdirectories)")
    parser.add_argument("--out", type=Path, default=None, help="default: SWEEP/report")
    parser.add_argument("--split", default="test", help="the focus split (default: test)")
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="paired bootstrap resamples (default: 1000)"
    )
    parser.add_argument(
        "--eval",
        default=None,
        metavar="NAME",
        help="score each run's standalone evaluation RUN/evals/NAME instead of its own",
    )
    args = parser.parse_args(argv)
    try:
        path = build_report(args.sweep, args.out, args.split, args.bootstrap, args.eval)
    except ReportError as err:
        raise SystemExit(f"error: {err}") from None
    print(scores_summary(path.read_text(encoding="utf-8"), args.split))
    print()
    print((path.parent / "reading.txt").read_text(encoding="utf-8"))
    print(f"report: {path}")


def scores_summary(report_md: str, split: str) -> str:
    """The focus split's score table of a rendered report (printed at the end of ``make demo``)."""
    section = report_md.split(f"## {SECTIONS[2]}", 1)[-1].split("\n## ", 1)[0]
    block = section.split(f"### {split}", 1)[-1].split("\n### ", 1)[0]
    lines = block.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if " | " in line), len(lines))
    table = []
    for line in lines[start:]:
        if " | " not in line:
            break
        table.append(line)
    return "\n".join(table)
