"""Training time that compares fairly: runs that shared two cores with other runs measure their
neighbours as much as their encoding, so the report can put its learning curves on a
*benchmark time* axis instead: a run's steps times its encoding's training-step time measured in
one quiet, interleaved benchmark (``scripts/bench.py`` at the runs' shape, e.g. ``--model cpu
--tokens 1024``). The measured wall clock stays beside it (``valid_loss_vs_time.png``)."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from posenc.analysis.report.runs import Run
from posenc.runtime.untrusted import FINITE, INT, STR, Fields, ListOf, MapOf, check, read_json

#: the part of a benchmark's JSON read here: per encoding and length, the median step seconds
BENCH = Fields(
    {
        "settings": Fields({"model": STR, "tokens": INT}, {"lengths": ListOf(INT)}),
        "summary": Fields({"train": MapOf(MapOf(Fields({"median_s": FINITE})))}),
    }
)
#: the curves given a benchmark-time twin: validation and training loss against steps
TWINS = {"steps": "bench", "train_steps": "train_bench"}


def bench_step_seconds(path: Path) -> tuple[dict[str, float], str]:
    """Per encoding, its training-step seconds in the benchmark ``path`` (the mean over the
    lengths it measured of the median step time), and the benchmark's shape in words.

    Raises:
        UntrustedFileError: the file is unreadable or not a benchmark's JSON (one line).
    """
    data = check(read_json(path), BENCH, path)
    seconds = {
        name: statistics.fmean(float(by_length["median_s"]) for by_length in lengths.values())
        for name, lengths in data["summary"]["train"].items()
        if lengths
    }
    settings = data["settings"]
    lengths = ", ".join(str(n) for n in settings.get("lengths", []))
    shape = f"model={settings['model']}, {settings['tokens']} tokens a batch, lengths {lengths}"
    return seconds, shape


def add_bench_curves(runs: list[Run], seconds: dict[str, float]) -> list[str]:
    """Give every run whose encoding the benchmark measured the curves of :data:`TWINS` (steps
    times its step seconds); returns the encodings it did not measure, sorted."""
    missing = set()
    for run in runs:
        step = seconds.get(run.pe)
        if step is None:
            missing.add(run.pe)
            continue
        for steps, bench in TWINS.items():
            if steps in run.curves:
                x, y = run.curves[steps]
                run.curves[bench] = (np.asarray(x, dtype=float) * step, y)
    return sorted(missing)
