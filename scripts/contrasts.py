"""Chosen contrasts between two systems of a sweep, judged as the report judges a finding
(:mod:`posenc.analysis.report.contrasts`)::

    python scripts/contrasts.py SWEEP --pair rpe sinpe --pair learned sinpe \\
        --splits test,tatoeba --bootstrap 10000 --out contrasts.md

Systems are named as the sweep's report labels them (``rope (pe.cross_attention=rotated)``).
"""

import argparse
import sys
from pathlib import Path

from posenc.analysis.report.contrasts import contrasts_markdown, sweep_contrasts
from posenc.analysis.report.runs import ReportError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep", type=Path)
    parser.add_argument(
        "--pair", nargs=2, action="append", required=True, metavar=("FIRST", "SECOND")
    )
    parser.add_argument("--splits", default="test", help="comma-separated")
    parser.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap resamples")
    parser.add_argument("--eval", help="score each run's standalone evaluation RUN/evals/NAME")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = parser.parse_args()
    try:
        rows = sweep_contrasts(
            args.sweep.expanduser().resolve(),
            [tuple(pair) for pair in args.pair],
            args.splits.split(","),
            args.bootstrap,
            args.eval,
        )
    except ReportError as err:
        sys.exit(f"contrasts: {err}")
    text = "\n".join(contrasts_markdown(rows, args.bootstrap)) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
