"""How monotone each trained system's cross-attention is, by depth: the alignment probe of
:mod:`study.alignment` over the runs of several sweeps that still have checkpoints.

Usage: ``python -m study alignment-probe --sweep "1+1 layers=outputs/sweeps/compare" --sweep
"3+3 layers=outputs/sweeps/scaling" --systems nonepe,sinpe,rope [--split test --pairs 200]
--out docs/study/alignment.md``. A run whose training finished is probed from its ``best.pt``,
evaluated or not; one unfinished or without that checkpoint is left out (and counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from posenc.analysis.report.runs import group_runs, load_run
from posenc.api import load_run as load_trained
from posenc.config.data import data_config
from posenc.config.variants import split_labels
from posenc.data.splits import load_corpora
from posenc.runtime.files import write_text
from posenc.runtime.rundir import RunDir, find_run_dirs
from study.alignment import probe


def pairs_of(
    run_dir: Path, split: str, count: int, lengths: tuple[int, int], overrides: list[str]
) -> tuple[list[str], list[str]]:
    """The first ``count`` pairs of ``split`` (as the run's data config loads it) whose source
    has ``lengths[0]``-``lengths[1]`` words."""
    trained = load_trained(run_dir, *overrides)
    corpus = load_corpora(data_config(trained.config.data), with_train=False)[split]
    chosen = [
        (s, t)
        for s, t in zip(corpus.src, corpus.tgt, strict=True)
        if lengths[0] <= len(s.split()) <= lengths[1]
    ][:count]
    return [s for s, _ in chosen], [t for _, t in chosen]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="append", required=True, help="LABEL=SWEEP_DIR")
    parser.add_argument("--systems", required=True, help="comma-separated, as reports name them")
    parser.add_argument("--split", default="test")
    parser.add_argument("--pairs", type=int, default=200, help="sentence pairs per run")
    parser.add_argument("--words", default="8,40", help="MIN,MAX source words of a pair")
    parser.add_argument("--data-dir", help="the data folder, when the runs' own has moved")
    parser.add_argument("--out", type=Path, required=True, help="markdown table (and .json)")
    args = parser.parse_args(argv)
    systems = split_labels(args.systems)
    low, high = (int(x) for x in args.words.split(","))
    found: dict[tuple[str, str], list[dict]] = {}
    missing = 0
    texts = None
    overrides = ["device=cpu", *([f"data.dir={args.data_dir}"] if args.data_dir else [])]
    for item in args.sweep:
        depth, _, folder = item.partition("=")
        path = Path(folder)
        groups = group_runs([load_run(r, path) for r in find_run_dirs(path, path / "report")])
        for group in groups:
            if group.label not in systems:
                continue
            for run in sorted(group.runs, key=lambda r: r.seed):
                if not run.train or not RunDir(run.path).best.is_file():
                    missing += 1  # unfinished, or its checkpoints are gone (scores not needed)
                    continue
                if texts is None:
                    texts = pairs_of(run.path, args.split, args.pairs, (low, high), overrides)
                result = probe(load_trained(run.path, *overrides), *texts)
                score, layer, head = result.best_head()
                found.setdefault((group.label, depth), []).append(
                    {
                        "seed": run.seed,
                        "last_layer": result.last_layer(),
                        "best_head": score,
                        "best_at": f"layer {layer}, head {head}",
                        "scores": result.scores.round(4).tolist(),
                    }
                )
                print(group.label, depth, run.seed, f"{result.last_layer():.3f}", flush=True)
    if not found:
        sys.exit("alignment_probe: no run of those systems has a checkpoint")
    lines = [
        "| system | depth | seeds | last layer, mean of heads | most monotone head |",
        "|---|---|---|---|---|",
    ]
    for system in systems:
        for depth in (item.partition("=")[0] for item in args.sweep):
            rows = found.get((system, depth))
            if not rows:
                continue
            cells = [_mean_sd([r[key] for r in rows]) for key in ("last_layer", "best_head")]
            seeds = ",".join(str(r["seed"]) for r in rows)
            lines.append(f"| {system} | {depth} | {seeds} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        f"Monotonicity of the cross-attention (the correlation between the target position and "
        f"the expected source position, mean over {len(texts[0])} pairs of `{args.split}` with "
        f"{low}-{high} source words, teacher-forced), mean ± SD over the seeds"
        + (f"; {missing} runs unfinished or without a checkpoint left out." if missing else "."),
    ]
    write_text(args.out, "\n".join(lines) + "\n")
    write_text(
        args.out.with_suffix(".json"),
        json.dumps({f"{s} | {d}": rows for (s, d), rows in found.items()}, indent=1),
    )
    print("\n".join(lines))
    return 0


def _mean_sd(values: list[float]) -> str:
    """``0.712 ± 0.031`` (the SD only with two values or more)."""
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"
