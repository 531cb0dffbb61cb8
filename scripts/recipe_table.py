"""The CPU recipe sweep's table: validation loss of every run at fixed minutes of training.

``python scripts/recipe_table.py SWEEP_DIR [--minutes 0.5,1,1.5,2,2.5] [--out FILE]`` reads each
run's validation loss against training seconds (TensorBoard, ``vs_train_seconds/valid_loss``),
interpolates it linearly at the given minutes (blank past the run's last validation or before its
first), and prints a markdown table sorted by the loss at the latest of those minutes that every run
reached, best first. ``--out`` also writes the rows as JSON. A run's setting is its directory name
(the overrides it was launched with, beside ``experiment=recipe``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from posenc.analysis.report.runs import read_curves
from posenc.runtime.files import read_json
from posenc.runtime.rundir import find_run_dirs


def loss_at(curve: tuple[np.ndarray, np.ndarray], seconds: float) -> float:
    """The loss of a ``(seconds, loss)`` curve at ``seconds``, linearly interpolated; NaN
    outside the validated range."""
    x, y = curve
    if len(x) == 0 or seconds < x[0] or seconds > x[-1]:
        return math.nan
    return float(np.interp(seconds, x, y))


def recipe_rows(sweep: Path, minutes: list[float]) -> list[dict]:
    """One row per run of ``sweep``: its setting, the loss at each of ``minutes``, and the
    steps, tokens per second and parameters of its training summary."""
    rows = []
    for run_dir in find_run_dirs(sweep, sweep / "report"):
        curve = read_curves(run_dir).get("time")
        if curve is None:
            continue
        summary = read_json(run_dir / "train_summary.json") or {}
        rows.append(
            {
                "setting": run_dir.relative_to(sweep).as_posix(),
                "loss": {f"{m:g}": loss_at(curve, 60 * m) for m in minutes},
                "steps": summary.get("steps"),
                "tokens_per_s": summary.get("train_tokens_per_s"),
                "parameters": summary.get("parameters"),
            }
        )
    keys = [f"{m:g}" for m in minutes]
    shared = [k for k in keys if rows and all(not math.isnan(r["loss"][k]) for r in rows)]
    rank_by = shared[-1] if shared else keys[-1]  # the latest minute every run reached
    return sorted(rows, key=lambda r: (math.isnan(r["loss"][rank_by]), r["loss"][rank_by]))


def markdown(rows: list[dict], minutes: list[float]) -> str:
    """The rows as a markdown table."""
    head = ["setting", *(f"loss @ {m:g} min" for m in minutes), "steps", "tokens/s", "params"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        losses = [
            "" if math.isnan(v) else f"{v:.3f}" for v in (row["loss"][f"{m:g}"] for m in minutes)
        ]
        params = f"{row['parameters'] / 1e6:.1f}M" if row["parameters"] else ""
        speed = f"{row['tokens_per_s']:,.0f}" if row["tokens_per_s"] else ""
        lines.append(
            f"| `{row['setting']}` | " + " | ".join(losses) + f" | {row['steps'] or ''} | "
            f"{speed} | {params} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--minutes", default="0.5,1,1.5,2,2.5")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    minutes = [float(m) for m in args.minutes.split(",")]
    rows = recipe_rows(args.sweep, minutes)
    if not rows:
        raise SystemExit(f"no run with a validation curve under {args.sweep}")
    print(markdown(rows, minutes))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
