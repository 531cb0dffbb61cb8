"""What depth does to each system's gap to a baseline, from a shallower and a deeper sweep of
the same recipe: the difference of differences on BLEU, chrF and validation loss, each with its
interval and verdict (:mod:`study.depth_contrast`).

Usage: ``python -m study depth-contrast --shallow "1+1 layers=outputs/sweeps/scaling_1layer"
--deep "3+3 layers=outputs/sweeps/scaling" --systems "sinpe,rpe,rope,rope
(pe.cross_attention=rotated)" [--baseline nonepe] --splits tatoeba-clean,europarl-clean,test
--out docs/study/depth_recipe [--plan docs/study/plans/depth_recipe.yaml --family "depth at
equal recipe"]``. Without a plan's family the page says its verdicts are exploratory.

With ``--steps 2000,4000`` it judges the validation losses the curves logged at those steps
instead (one family, no test set scored) and writes ``depth_steps.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from posenc.analysis.plan import declared_tests_note, plan_of, provenance
from posenc.analysis.report.findings import judge_together, tested_p
from posenc.analysis.report.runs import ReportError
from posenc.analysis.report.seeds import seeds_note
from posenc.config.variants import split_labels
from posenc.runtime.files import write_text
from study.depth_contrast import depth_contrasts, depth_losses, depth_table
from study.headline import add_comparison_arguments, read_sweep


def steps_of(text: str) -> tuple[int, ...]:
    """``2000,4000`` -> ``(2000, 4000)``; a clear error for anything else."""
    try:
        steps = tuple(int(part) for part in text.split(","))
    except ValueError:
        steps = ()
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive steps (2000,4000)")
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shallow", required=True, help="LABEL=SWEEP_DIR")
    parser.add_argument("--deep", required=True, help="LABEL=SWEEP_DIR")
    add_comparison_arguments(parser, "tatoeba-clean,europarl-clean,test", "depth.md")
    parser.add_argument(
        "--steps", type=steps_of, default=(), help="comma-separated steps: losses at equal steps"
    )
    args = parser.parse_args(argv)
    plan = plan_of(args.plan, "depth_contrast")
    margins = plan.margins if plan else None
    systems = split_labels(args.systems)
    splits = [] if args.steps else args.splits.split(",")  # losses at steps score no test set
    (shallow, shallow_dir), (deep, deep_dir) = (
        (label, Path(folder))
        for label, _, folder in (item.partition("=") for item in (args.shallow, args.deep))
    )
    at = list(args.steps) or [None]
    with tempfile.TemporaryDirectory() as scratch:
        try:
            low = read_sweep(shallow_dir, splits, Path(scratch) / "1", args.seeds)
            high = read_sweep(deep_dir, splits, Path(scratch) / "2", args.seeds)
            cells = depth_contrasts(
                low.entries, high.entries, systems, args.baseline, args.bootstrap, margins
            )
        except ReportError as err:
            sys.exit(f"depth_contrast: {err}")
    margin = margins.get("valid_loss") if margins else None
    losses = depth_losses(
        {step: low.losses(step) for step in at},
        {step: high.losses(step) for step in at},
        systems,
        args.baseline,
        margin,
        (low.sentences(), high.sentences()),
        args.bootstrap,
    )
    found = plan.family(args.family) if plan is not None and args.family else None
    together = found is not None and "kind" not in found.holm_within
    if together:  # the plan's family joins losses, BLEU and chrF: one Holm over them all
        judge_together([c.judgement for c in cells if c.judgement is not None], losses, margins)
    held = len(tested_p([c.judgement for c in cells if c.judgement is not None]))
    held += sum(loss.p_holm is not None for loss in losses)
    note = declared_tests_note(plan, args.family, held)
    lines = [
        f"# What depth does: each system's gap to {args.baseline}, {deep} against {shallow}",
        "",
        provenance(plan, args.family),
        "",
        *([note, ""] if note else []),
        *([seeds_note(args.seeds), ""] if args.seeds else []),
        *depth_table(cells, losses, shallow, deep, together),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / ("depth_steps.md" if args.steps else "depth.md"), "\n".join(lines))
    print("\n".join(lines))
    return 0
