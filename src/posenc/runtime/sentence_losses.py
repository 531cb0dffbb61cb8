"""Sentences' teacher-forced losses as a run keeps them: every test sentence's, beside an
evaluation's hypotheses (``losses.<split>.tsv``), and every validation pair's at the best
validation loss (``valid_losses.tsv``). One row a sentence in the split's order, with its source
length (tokens incl. EOS, the length buckets' measure), the summed negative log-likelihood of
its reference (nats, no label smoothing) and the reference's token count (incl. EOS). A split's
loss is ``sum(nll) / sum(target_tokens)``; differences of loss on a length bucket are tested
over these sentences (:mod:`study.bucket_contrasts`), and validation-loss contrasts
resample them (:func:`posenc.analysis.decision.corpus_score`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from posenc.runtime.files import write_text
from posenc.runtime.rundir import RunDir
from posenc.runtime.untrusted import read_text

HEADER = ("source_tokens", "nll", "target_tokens")
#: the largest sentence-loss file read (newstest2014's is about 60 kB)
MAX_BYTES = 100_000_000


def losses_file(directory: Path, split: str) -> Path:
    """Where an evaluation in ``directory`` keeps ``split``'s sentence losses."""
    return RunDir(directory).losses(split)


@dataclass(frozen=True)
class SentenceLosses:
    """Per sentence, in the split's order: ``source_tokens``, ``nll`` (summed over the
    reference's tokens) and ``target_tokens``."""

    source_tokens: list[int]
    nll: list[float]
    target_tokens: list[int]

    def __post_init__(self) -> None:
        if not len(self.source_tokens) == len(self.nll) == len(self.target_tokens):
            raise ValueError(
                f"sentence losses of unequal lengths: {len(self.source_tokens)} sources, "
                f"{len(self.nll)} losses, {len(self.target_tokens)} targets"
            )

    @property
    def loss(self) -> float:
        """The split's loss per target token."""
        return sum(self.nll) / max(sum(self.target_tokens), 1)


def write_losses(path: Path, losses: SentenceLosses) -> None:
    """Write ``losses`` to ``path`` (atomically), the NLL to 6 decimals."""
    rows = zip(losses.source_tokens, losses.nll, losses.target_tokens, strict=True)
    lines = ["\t".join(HEADER), *(f"{s}\t{n:.6f}\t{t}" for s, n, t in rows)]
    write_text(path, "\n".join(lines) + "\n")


def read_losses(path: Path) -> SentenceLosses:
    """The sentence losses of ``path``, a file of a run directory and so untrusted input.

    Raises:
        ValueError: the file is missing, not a regular file, larger than :data:`MAX_BYTES` or
            not in the format :func:`write_losses` writes (one line naming the file, the line
            and what is wrong).
    """
    lines = read_text(path, MAX_BYTES).splitlines()
    if not lines or tuple(lines[0].split("\t")) != HEADER:
        raise ValueError(
            f"{path}: line 1 is not the header {' '.join(HEADER)!r}; write the file again "
            "with scripts/sentence_losses.py"
        )
    sources, nll, targets = [], [], []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        try:
            if len(fields) != len(HEADER):
                raise ValueError
            source, loss, target = int(fields[0]), float(fields[1]), int(fields[2])
        except ValueError:
            raise ValueError(
                f"{path}, line {number}: expected source_tokens, nll and target_tokens (an "
                f"integer, a number, an integer) separated by tabs, got {line[:60]!r}"
            ) from None
        if source < 1 or target < 1 or not math.isfinite(loss) or loss < 0:
            raise ValueError(
                f"{path}, line {number}: token counts must be positive and the NLL a finite "
                f"number >= 0, got {line[:60]!r}"
            )
        sources.append(source)
        nll.append(loss)
        targets.append(target)
    return SentenceLosses(sources, nll, targets)
