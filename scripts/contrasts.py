"""Chosen contrasts between two systems of a sweep, judged as the report judges a finding
(:mod:`posenc.analysis.report.contrasts`)::

    python scripts/contrasts.py SWEEP --pair rpe sinpe --pair learned sinpe \\
        --splits test,tatoeba --bootstrap 10000 --out contrasts.md

Systems are named as the sweep's report labels them (``rope (pe.cross_attention=rotated)``).
``--decoding NAME`` instead sets every system under its runs' standalone evaluation
``RUN/evals/NAME`` (beam 5, say; a glob pattern may name it) against their own evaluation::

    python scripts/contrasts.py SWEEP --decoding 'eval.beam_size=5,step=*' \
        --splits test,tatoeba --bootstrap 10000 --out decoding.md
"""

import argparse
import sys
from pathlib import Path

from posenc.analysis.plan import add_plan_arguments, declared_tests_note, plan_of, provenance
from posenc.analysis.report.contrasts import (
    contrasts_markdown,
    decoding_contrasts,
    decoding_markdown,
    sweep_contrasts,
)
from posenc.analysis.report.findings import tested_p
from posenc.analysis.report.runs import ReportError
from posenc.analysis.report.seeds import seed_selection, seeds_note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep", type=Path)
    family = parser.add_mutually_exclusive_group(required=True)
    family.add_argument("--pair", nargs=2, action="append", metavar=("FIRST", "SECOND"))
    family.add_argument(
        "--decoding",
        metavar="NAME",
        help="every system under its runs' standalone evaluation NAME against their own",
    )
    parser.add_argument("--splits", default="test", help="comma-separated")
    parser.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap resamples")
    parser.add_argument("--eval", help="score each run's standalone evaluation RUN/evals/NAME")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    parser.add_argument(
        "--seeds", type=seed_selection, help="only the runs of these seeds (1-4, 0,2)"
    )
    add_plan_arguments(parser)
    args = parser.parse_args()
    plan = plan_of(args.plan, "contrasts")
    margins = plan.margins if plan is not None else None
    if args.decoding and args.seeds:
        parser.error("--seeds selects the runs of --pair comparisons, not of --decoding")
    if args.decoding and args.eval:
        parser.error("--decoding compares a standalone evaluation with the runs' own: no --eval")
    sweep, splits = args.sweep.expanduser().resolve(), args.splits.split(",")
    try:
        if args.decoding:
            comparison = decoding_contrasts(sweep, args.decoding, splits, args.bootstrap)
            lines = decoding_markdown(comparison, args.bootstrap)
        else:
            pairs = [tuple(pair) for pair in args.pair]
            rows = sweep_contrasts(
                sweep, pairs, splits, args.bootstrap, args.eval, args.seeds, margins
            )
            lines = contrasts_markdown(rows, args.bootstrap, margins)
            lines += ["", seeds_note(args.seeds)] if args.seeds else []
            held = len(tested_p([row.judgement for row in rows if row.judgement is not None]))
            note = declared_tests_note(plan, args.family, held)
            lines = [note, "", *lines] if note else lines
    except ReportError as err:
        sys.exit(f"contrasts: {err}")
    text = "\n".join([provenance(plan, args.family), "", *lines]) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
