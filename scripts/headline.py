"""The study's headline table and figure: each system against a baseline, by split and depth.

Usage: ``python scripts/headline.py --sweep "1+1 layers=outputs/sweeps/compare" --sweep
"3+3 layers=outputs/sweeps/scaling" --systems sinpe,rpe,rope [--baseline NAME] --splits
tatoeba-clean,test,europarl --out docs/study/headline``; see :mod:`posenc.analysis.headline`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from posenc.analysis.headline import headline, headline_table, plot_headline
from posenc.analysis.report.clean import SUFFIX, clean_entries
from posenc.analysis.report.runs import ReportError, group_runs, load_run, split_entries
from posenc.config import reference_encoding
from posenc.runtime.files import write_text
from posenc.runtime.rundir import find_run_dirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="append", required=True, help="LABEL=SWEEP_DIR")
    parser.add_argument("--systems", required=True, help="comma-separated, as reports name them")
    parser.add_argument(
        "--baseline", default=reference_encoding(), help="default: the reference encoding"
    )
    parser.add_argument("--splits", default="tatoeba-clean,test,europarl")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resampled test sets")
    parser.add_argument("--out", type=Path, required=True, help="folder for headline.md, PNGs")
    args = parser.parse_args()
    splits = args.splits.split(",")
    systems = [s for s in args.systems.split(",") if s]
    with tempfile.TemporaryDirectory() as scratch:  # the clean splits' files, while read
        sweeps = {}
        for item in args.sweep:
            label, _, folder = item.partition("=")
            path = Path(folder)
            runs = [load_run(run, path) for run in find_run_dirs(path, path / "report")]
            if not runs:
                sys.exit(f"headline: no run under {path}")
            groups = group_runs(runs)
            bases = [s.removesuffix(SUFFIX) for s in splits if s.endswith(SUFFIX)]
            clean = clean_entries(groups, bases, Path(scratch) / label)
            sweeps[label] = {
                s: clean.get(s, {}) if s.endswith(SUFFIX) else split_entries(groups, s)
                for s in splits
            }
        try:
            cells = headline(sweeps, systems, args.baseline, args.bootstrap)
        except ReportError as err:
            sys.exit(f"headline: {err}")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["# Headline: each system against " + args.baseline, ""]
    for metric in ("bleu", "chrf"):
        name = f"headline_{metric}.png"
        plot_headline(cells, metric, args.baseline, args.out / name)
        lines += [
            f"## {metric}",
            "",
            *headline_table(cells, metric, args.baseline),
            "",
            f"![{metric}]({name})",
            "",
        ]
    write_text(args.out / "headline.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
