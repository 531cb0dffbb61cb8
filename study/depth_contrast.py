"""What depth does to an encoding's gap to a baseline: the difference of differences
``(system - baseline at the deeper model) - (system - baseline at the shallower)`` on BLEU, chrF
and validation loss, judged by the decision rule (:mod:`posenc.analysis.decision`) with the
training run as its unit (``python -m study depth-contrast``).

At each depth a system and the baseline share their seeds, so each seed gives one gap; the two
depths' gaps are compared as two systems' seed scores are (paired by seed where both depths
have the same seeds, Welch otherwise). The test sentences add the deviation of the whole
four-term contrast over resampled test sets (:func:`~posenc.analysis.decision.
contrast_deviation`, one draw for the runs of all four cells). BLEU and chrF of a split form one
comparison, as in the report (:func:`~posenc.analysis.report.findings.judge_family`: a finding
needs both, pointing the same way); every comparison of a call is one family under Holm's
correction, validation loss a second; with a plan's margins a non-finding is tested for
equivalence."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posenc.analysis.decision import (
    Comparison,
    compare_scores,
    contrast_deviation,
)
from posenc.analysis.markdown import system_table
from posenc.analysis.report.findings import (
    LOOP_CEILING,
    METRICS,
    NOISE_FLOOR_BLEU,
    Judgement,
    Sentences,
    StatisticsCache,
    by_seed,
    judge_family,
    judge_single_scores,
    loss_noise,
    named_verdict,
    sentence_noise,
    single_score_verdict,
    tested_p,
)
from posenc.analysis.report.runs import Entry

#: a finding's verdict, by the sign of the difference of differences
WIDER, NARROWER = "gap grows with depth", "gap shrinks with depth"

Systems = Mapping[str, Sequence[Entry]]
"""A split's systems at one depth: name -> entries (one per run)."""
Losses = Mapping[str, Mapping[int, float]]
"""A depth's validation losses: system -> {training seed: best validation loss}."""


@dataclass
class DepthCell:
    """One system on one split (or ``validation loss``): its judgement of the difference of
    differences (None when a cell is missing or the test sets differ) and the verdict."""

    system: str
    split: str
    judgement: Judgement | None

    def verdict(self) -> str:
        """:data:`WIDER`/:data:`NARROWER` for a finding (by BLEU's sign; the system's gap
        over the baseline, so "grows" means the system gains on it with depth), else why not."""
        return named_verdict(self.judgement, WIDER, NARROWER)


def gaps(system: Sequence[Entry], baseline: Sequence[Entry], metric: str) -> dict[int, float]:
    """``{seed: system's score - baseline's}`` on the seeds both have."""
    own, theirs = by_seed(system), by_seed(baseline)
    return {s: own[s].scores[metric] - theirs[s].scores[metric] for s in own if s in theirs}


def judge_cell(
    cells: tuple[Sequence[Entry], Sequence[Entry], Sequence[Entry], Sequence[Entry]],
    samples: int,
    cache: StatisticsCache,
) -> Judgement | None:
    """The unadjusted judgement of ``(system deep, baseline deep, system shallow, baseline
    shallow)``: None when a run lacks its texts or scores, or the four were not scored against
    the same references."""
    sides = [by_seed(c) for c in cells]
    texts = [cache.texts(e) for side in sides for e in side.values()]
    if not texts or any(t is None or t[1] != texts[0][1] for t in texts):  # type: ignore[index]
        return None
    comparisons, seed_scores = {}, {}
    for metric in METRICS:
        if any(e.scores.get(metric) is None for side in sides for e in side.values()):
            return None
        deep, shallow = gaps(cells[0], cells[1], metric), gaps(cells[2], cells[3], metric)
        if not deep or not shallow:
            return None
        tables = [[cache.of(e, metric) for e in side.values()] for side in sides]
        terms = list(zip((1.0, -1.0, -1.0, 1.0), tables, strict=True))
        noise = contrast_deviation(metric, terms, samples=samples)
        comparisons[metric] = compare_scores(deep, shallow, sentence_se=noise)
        seed_scores[metric] = (deep, shallow)
    loops = [statistics.fmean(cache.loops(e) for e in side.values()) for side in sides]
    bleu = [statistics.fmean(e.scores["bleu"] for e in side.values()) for side in sides]
    floor = min(bleu) < NOISE_FLOOR_BLEU or max(loops) >= LOOP_CEILING
    return Judgement(
        comparisons,  # type: ignore[arg-type]
        floor,
        (max(loops[0], loops[2]), max(loops[1], loops[3])),
        seed_scores=seed_scores,  # type: ignore[arg-type]
    )


def depth_contrasts(
    shallow: Mapping[str, Systems],
    deep: Mapping[str, Systems],
    systems: Sequence[str],
    baseline: str,
    samples: int = 1000,
    margins: Mapping[str, float] | None = None,
) -> list[DepthCell]:
    """Every system of ``systems`` on every split of ``deep`` (``split -> systems``, and the same
    split of ``shallow``), one family."""
    cache = StatisticsCache()
    cells = []
    for split, found in deep.items():
        other = shallow.get(split, {})
        for system in systems:
            judgement = None
            wanted = (found, found, other, other)
            names = (system, baseline, system, baseline)
            if all(name in where for name, where in zip(names, wanted, strict=True)):
                four = tuple(where[name] for name, where in zip(names, wanted, strict=True))
                judgement = judge_cell(four, samples, cache)  # type: ignore[arg-type]
            cells.append(DepthCell(system, split, judgement))
    judge_family([c.judgement for c in cells if c.judgement is not None], margins)
    return cells


@dataclass
class DepthLoss:
    """One system's difference of differences in validation loss (nats; negative: the system
    gains on the baseline with depth) at one ``step`` (None: the best validation loss), its
    Holm-adjusted p and equivalence p; ``sentences``: whether resampled validation sentences
    are part of its noise."""

    system: str
    comparison: Comparison | None
    step: int | None = None
    sentences: bool = False
    p_holm: float | None = None
    p_equivalence: float | None = None
    margin: float | None = None

    def verdict(self) -> str:
        """:data:`WIDER` (the system's loss falls further below the baseline's with depth) or
        :data:`NARROWER` for a finding, else why not."""
        return single_score_verdict(self, WIDER, NARROWER)


def depth_losses(
    shallow: Mapping[int | None, Losses],
    deep: Mapping[int | None, Losses],
    systems: Sequence[str],
    baseline: str,
    margin: float | None = None,
    sentences: tuple[Mapping[str, Sentences], Mapping[str, Sentences]] | None = None,
    samples: int = 1000,
) -> list[DepthLoss]:
    """Every system's difference of differences in validation loss at every step of ``deep``
    (``step -> losses``, None the best validation loss; the same step of ``shallow``), one
    family. For the best loss, where every run kept its validation sentences (``sentences``:
    the shallow and the deep sweep's, system -> seed -> statistics), their resampling adds
    the four-term contrast's noise; else the seeds are the only noise."""
    kept_shallow, kept_deep = sentences or ({}, {})
    cells = []
    for step, found in deep.items():
        other = shallow.get(step, {})
        for system in systems:
            sides = [where.get(name) for where in (found, other) for name in (system, baseline)]
            if not all(sides):
                cells.append(DepthLoss(system, None, step))
                continue
            gap_deep = {s: sides[0][s] - sides[1][s] for s in sides[0] if s in sides[1]}
            gap_shallow = {s: sides[2][s] - sides[3][s] for s in sides[2] if s in sides[3]}
            if not gap_deep or not gap_shallow:
                cells.append(DepthLoss(system, None, step))
                continue
            noise = None
            if step is None:
                kept = [kept_deep.get(system), kept_deep.get(baseline)]
                kept += [kept_shallow.get(system), kept_shallow.get(baseline)]
                signs = (1.0, -1.0, -1.0, 1.0)
                terms = [
                    (sign, list(side), k) for sign, side, k in zip(signs, sides, kept, strict=True)
                ]
                noise = loss_noise(terms, samples)  # type: ignore[arg-type]
            comparison = compare_scores(gap_deep, gap_shallow, sentence_se=noise or 0.0)
            cells.append(DepthLoss(system, comparison, step, noise is not None))
    judge_single_scores(cells, margin)
    return cells


def loss_heading(step: int | None) -> str:
    """A validation-loss column's heading: the best loss, or the loss at ``step``."""
    return "validation loss (nats)" if step is None else f"validation loss at step {step:,}"


def depth_table(
    cells: Sequence[DepthCell],
    losses: Sequence[DepthLoss],
    shallow: str,
    deep: str,
    together: bool = False,
) -> list[str]:
    """Markdown: one row per system, one column per split and per validation-loss step: the
    difference of differences with its interval and the verdict; ``together``: the cells and
    losses were judged as one family (:func:`~.findings.judge_together`)."""
    splits = list(dict.fromkeys(c.split for c in cells))
    steps = list(dict.fromkeys(c.step for c in losses))
    at = {(c.system, c.split): c for c in cells}
    loss_at = {(c.system, c.step): c for c in losses}
    systems = list(dict.fromkeys([c.system for c in cells] + [c.system for c in losses]))
    head = [f"{split}: BLEU; chrF" for split in splits] + [loss_heading(s) for s in steps]

    def text(system: str, i: int) -> str | None:
        if i < len(splits):
            cell = at.get((system, splits[i]))
            if cell is None or cell.judgement is None:
                return None
            found = cell.judgement.comparisons
            return f"{found['bleu'].text()}; {found['chrf'].text()} {cell.verdict()}"
        loss = loss_at.get((system, steps[i - len(splits)]))
        if loss is None or loss.comparison is None:
            return None
        return f"{loss.comparison.text(3)} {loss.verdict()}"

    lines = system_table(head, systems, text)
    tests = len(tested_p([c.judgement for c in cells if c.judgement is not None]))
    loss_tests = sum(c.p_holm is not None for c in losses)
    noise = "seeds and, for BLEU and chrF, resampled test sentences as noise" if cells else ""
    if losses:
        noise += ("; validation loss: " if cells else "") + sentence_noise(losses)
    kinds = [
        k
        for k, present in (("BLEU and chrF cells", cells), ("validation losses", losses))
        if present
    ]
    if together or len(kinds) == 1:
        families = f"{' and '.join(kinds)} are one family ({tests + loss_tests} tests)"
    else:
        families = (
            f"BLEU and chrF cells are one family ({tests} tests), validation losses another "
            f"({loss_tests} tests)"
        )
    lines += [
        "",
        f"Each cell: (system minus the baseline at {deep}) minus (the same at {shallow}), the "
        f"mean over seeds with its 95% interval ({noise}); {families}, under Holm's correction.",
    ]
    return lines
