"""Training time that compares fairly: runs that shared two cores with other runs measure their
neighbours as much as their encoding, so the report can put its learning curves on a
*benchmark time* axis instead: a run's steps times its encoding's training-step time measured in
one quiet, interleaved benchmark (``scripts/bench.py`` at the runs' shape, e.g. ``--model cpu
--tokens 1024``). The measured wall clock stays beside it (``valid_loss_vs_time.png``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.analysis.report.runs import Run
from posenc.runtime.untrusted import FINITE, INT, STR, Fields, ListOf, MapOf, check, read_json

#: per encoding and length, the median seconds of one measurement
MEDIANS = MapOf(MapOf(Fields({"median_s": FINITE})))
#: the part of a benchmark's JSON read here: training steps and (when measured) cached decoding
BENCH = Fields(
    {
        "settings": Fields({"model": STR, "tokens": INT}, {"lengths": ListOf(INT)}),
        "summary": Fields({"train": MEDIANS}, {"decode": MEDIANS}),
    }
)
#: the curves given a benchmark-time twin: validation and training loss against steps
TWINS = {"steps": "bench", "train_steps": "train_bench"}


@dataclass(frozen=True)
class BenchTimes:
    """A quiet benchmark's times per encoding, each the mean over the lengths it measured of
    the median: a training step and a cached greedy decoding of its batch (seconds; empty when
    not measured), and its shape in words."""

    train: dict[str, float]
    decode: dict[str, float]
    shape: str


def read_bench(path: Path) -> BenchTimes:
    """The :class:`BenchTimes` of the benchmark JSON ``path`` (``scripts/bench.py --out``).

    Raises:
        UntrustedFileError: the file is unreadable or not a benchmark's JSON (one line).
    """
    data = check(read_json(path), BENCH, path)
    summary = data["summary"]
    settings = data["settings"]
    lengths = ", ".join(str(n) for n in settings.get("lengths", []))
    shape = f"model={settings['model']}, {settings['tokens']} tokens a batch, lengths {lengths}"
    return BenchTimes(_means(summary["train"]), _means(summary.get("decode", {})), shape)


def _means(medians: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    return {
        name: statistics.fmean(float(by_length["median_s"]) for by_length in lengths.values())
        for name, lengths in medians.items()
        if lengths
    }


def bench_time(table: dict[str, float], label: str, pe: str) -> tuple[float | None, bool]:
    """A row's time in ``table`` (one of :class:`BenchTimes`' dictionaries): its own, where the
    benchmark measured the row's variant (``--variant``, under the report's ``label``), else
    its encoding's; and whether it is the row's own."""
    if label in table:
        return table[label], True
    return table.get(pe), label == pe


def add_bench_curves(runs: list[Run], seconds: dict[str, float]) -> tuple[list[str], list[str]]:
    """Give every run the benchmark measured (its variant's step, else its encoding's: see
    :func:`bench_time`; the runs' labels are set, :func:`.runs.group_runs`) the curves of
    :data:`TWINS` (steps times its step seconds); returns the encodings it did not measure and
    the variants drawn with their encoding's step, each sorted."""
    missing, borrowed = set(), set()
    for run in runs:
        step, own = bench_time(seconds, run.label, run.pe)
        if step is None:
            missing.add(run.pe)
            continue
        if not own:
            borrowed.add(run.label)
        for steps, bench in TWINS.items():
            if steps in run.curves:
                x, y = run.curves[steps]
                run.curves[bench] = (np.asarray(x, dtype=float) * step, y)
    return sorted(missing), sorted(borrowed)
