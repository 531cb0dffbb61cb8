"""The study's headline tables and figures: each system against a baseline, by split and depth,
on BLEU, chrF and validation loss, and what became of each verdict from the first depth to the
second.

Usage: ``python -m study headline --sweep "1+1 layers=outputs/sweeps/compare" --sweep
"3+3 layers=outputs/sweeps/scaling" --systems sinpe,rpe,rope [--baseline NAME] --splits
tatoeba-clean,test,europarl --out docs/study/headline [--plan docs/study/plans/NAME.yaml --family
NAME]``; see :mod:`study.headline`. Without a plan's family the page says its verdicts
are exploratory (:mod:`posenc.analysis.plan`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from posenc.analysis.plan import HOLM_FACTORS, declared_tests_note, plan_of, provenance
from posenc.analysis.report.findings import tested_p
from posenc.analysis.report.runs import ReportError
from posenc.analysis.report.seeds import seeds_note
from posenc.config.variants import split_labels
from posenc.runtime.files import write_text
from study.headline import (
    MAX_SYSTEMS,
    add_comparison_arguments,
    correction_note,
    depth_changes,
    headline,
    headline_table,
    judge_headline,
    loss_headline,
    loss_table,
    plot_headline,
    plot_loss_headline,
    read_sweep,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="append", required=True, help="LABEL=SWEEP_DIR")
    add_comparison_arguments(parser, "tatoeba-clean,test,europarl", "headline.md, PNGs")
    args = parser.parse_args(argv)
    plan = plan_of(args.plan, "headline")
    splits = args.splits.split(",")
    systems = split_labels(args.systems)
    if len(systems) > MAX_SYSTEMS:
        sys.exit(
            f"headline: {len(systems)} systems in --systems; a figure draws at most {MAX_SYSTEMS}: "
            "give fewer (or run the script once per group)"
        )
    with tempfile.TemporaryDirectory() as scratch:  # the clean splits' files, while read
        sweeps, losses, sentences = {}, {}, {}
        try:
            for item in args.sweep:
                label, _, folder = item.partition("=")
                reading = read_sweep(Path(folder), splits, Path(scratch) / label, args.seeds)
                sweeps[label], losses[label] = reading.entries, reading.losses()
                sentences[label] = reading.sentences()
            margins = plan.margins if plan else None
            cells = headline(sweeps, systems, args.baseline, args.bootstrap, margins)
        except ReportError as err:
            sys.exit(f"headline: {err}")
    margin = plan.margins.get("valid_loss") if plan else None
    loss_cells = loss_headline(
        losses, systems, args.baseline, margin, sentences, samples=args.bootstrap
    )
    family = plan.family(args.family) if plan is not None and args.family else None
    within = family.holm_within if family is not None else HOLM_FACTORS
    judge_headline(cells, loss_cells, plan.margins if plan else None, within)
    correction = correction_note(cells, loss_cells, within)
    args.out.mkdir(parents=True, exist_ok=True)
    title = "# Headline: each system against " + args.baseline
    held = len(tested_p([c.judgement for c in cells if c.judgement is not None]))
    note = declared_tests_note(
        plan, args.family, held + sum(c.p_holm is not None for c in loss_cells)
    )
    lines = [title, "", provenance(plan, args.family), "", *([note, ""] if note else [])]
    lines += [seeds_note(args.seeds), ""] if args.seeds else []
    for metric in ("bleu", "chrf"):
        name = f"headline_{metric}.png"
        plot_headline(cells, metric, args.baseline, args.out / name)
        lines += [
            f"## {metric}",
            "",
            *headline_table(cells, metric, args.baseline, correction),
            "",
            f"![{metric}]({name})",
            "",
        ]
    plot_loss_headline(loss_cells, args.baseline, args.out / "headline_loss.png")
    lines += [
        "## validation loss",
        "",
        *loss_table(loss_cells, args.baseline, correction),
        "",
        "![validation loss](headline_loss.png)",
        "",
    ]
    depths = list(sweeps)
    for shallow, deep in zip(depths, depths[1:], strict=False):
        lines += [
            f"## From {shallow} to {deep}",
            "",
            *depth_changes(cells, loss_cells, shallow, deep),
            "",
            "Each row: the verdict against "
            f"{args.baseline} at each depth (BLEU and chrF together on a split) and what became "
            "of it: holds, reverses, appears (a finding only deeper), not found (a finding only "
            "shallower, the deeper tested), neither, or untested (a side with one seed, missing "
            "or below the quality floor).",
            "",
        ]
    write_text(args.out / "headline.md", "\n".join(lines))
    print("\n".join(lines))
    return 0
