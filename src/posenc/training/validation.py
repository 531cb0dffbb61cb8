"""Validation during training and the checkpoints it saves: the validation loss (and the EMA
weights' loss; the best loss's sentence losses in ``valid_losses.tsv``), BLEU and chrF of a
fixed subset of the validation pairs (fairseq's ``--eval-bleu``), which validation is the best,
early stopping, and ``last.pt``/``best.pt``.

``trainer.valid_bleu=N`` decodes the same ``N`` validation pairs (a seeded sample, in corpus
order) greedily at every validation; ``trainer.best_metric`` (``loss``, the default, or
``bleu``) chooses ``best.pt`` and drives ``trainer.patience``. Decoding and scoring belong to
evaluation, a later phase: the job hands training a :data:`Scorer` built from evaluation's own
decoding and sacreBLEU settings, so the numbers mean what the final evaluation's mean.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posenc.config import TrainerConfig
from posenc.config.metrics import VALIDATION_METRICS
from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime import checkpoint, distributed
from posenc.runtime.sentence_losses import SentenceLosses, write_losses
from posenc.training import advice
from posenc.training.advice import TrainingError
from posenc.training.losses import validation_loss
from posenc.training.start import TrainState, checkpoint_payload

if TYPE_CHECKING:
    from posenc.training.setup import Training

log = logging.getLogger("posenc.training.loop")

Scorer = Callable[[Seq2Seq, Tokenizer, list[list[int]], list[str]], dict]
"""``(model, tokenizer, source ids, reference texts) -> {"bleu", "chrf", ..., "hypotheses"}``:
greedy decoding of the sources, detokenised (``hypotheses``, one a source, may be absent) and
scored against the references."""

EXAMPLES = 3
"""How many of the subset's pairs each validation shows in TensorBoard's Text tab."""

SUBSET_SEED = 0
"""The seed of the validation subset: one subset for every run of a data set."""


def valid_subset(pairs: int, size: int) -> list[int]:
    """Indices of ``min(size, pairs)`` validation pairs, a seeded sample in corpus order."""
    if size >= pairs:
        return list(range(pairs))
    return sorted(random.Random(SUBSET_SEED).sample(range(pairs), size))


@dataclass
class ValidBleu:
    """The validation subset and how it is scored.

    Attributes:
        scorer: decodes and scores (:data:`Scorer`).
        sources: token ids of the subset's sources.
        references: the subset's reference texts.
    """

    scorer: Scorer
    sources: list[list[int]]
    references: list[str]

    @classmethod
    def of(
        cls, scorer: Scorer, sources: list[list[int]], references: list[str], size: int
    ) -> ValidBleu:
        """The subset of ``size`` pairs (:func:`valid_subset`) of the validation split."""
        keep = valid_subset(len(sources), size)
        return cls(scorer, [sources[i] for i in keep], [references[i] for i in keep])

    def __call__(self, model: Seq2Seq, tokenizer: Tokenizer) -> tuple[dict[str, float], str]:
        """The model's greedy translations of the subset scored (``{NAME: score}`` of
        :data:`~posenc.config.metrics.VALIDATION_METRICS`, and ``seconds``), and
        its first :data:`EXAMPLES` pairs with their translations as a markdown table (empty
        when the scorer gives no translations)."""
        started = time.perf_counter()
        with torch.no_grad():
            scores = self.scorer(model, tokenizer, self.sources, self.references)
        seconds = time.perf_counter() - started
        hypotheses = (scores.get("hypotheses") or [])[:EXAMPLES]
        sources = tokenizer.decode_batch(self.sources[: len(hypotheses)])
        rows = [
            " | ".join(map(_cell, texts))
            for texts in zip(sources, self.references, hypotheses, strict=False)
        ]
        table = "\n".join(["source | reference | translation", "--- | --- | ---", *rows])
        scored = {name: float(scores[name]) for name in VALIDATION_METRICS}
        return scored | {"seconds": seconds}, table if rows else ""


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: its pipes escaped, its line breaks spaces."""
    return " ".join(text.split()).replace("|", "\\|")


def check_best_metric(trainer: TrainerConfig, scorer: Scorer | None) -> None:
    """Refuse, in one line, a ``best_metric`` of ``bleu`` without ``valid_bleu``, and
    ``valid_bleu`` without a scorer (training called outside a job)."""
    if trainer.best_metric == "bleu" and not trainer.valid_bleu:
        raise ValueError(
            "trainer.best_metric=bleu needs trainer.valid_bleu=N, the validation pairs decoded "
            "at each validation (e.g. 200)"
        )
    if trainer.valid_bleu and scorer is None:
        raise ValueError(
            "trainer.valid_bleu needs a scorer: train through train.py (posenc.job), or pass "
            "train(..., scorer=...)"
        )


def improved(
    metric: str | None, loss: float, best_loss: float, bleu: float | None, best_bleu: float | None
) -> bool:
    """Whether this validation is the best so far: a lower loss, or with ``metric`` ``bleu`` a
    higher BLEU (the first validation always is)."""
    if metric == "bleu":
        return bleu is not None and (best_bleu is None or bleu > best_bleu)
    return loss < best_loss


def stop_early(patience: int | None, since_best: int | None, device: torch.device) -> bool:
    """Whether ``patience`` validations in a row have not improved on the best (rank 0's
    ``since_best``, None elsewhere; every rank gets the answer)."""
    worse = float(since_best) if since_best is not None else 0.0
    worse = distributed.all_reduce([worse], device, "max")[0]
    return bool(patience) and worse >= patience


def best_metric_name(metric: str | None) -> str:
    """How train.log names the metric that chooses the best validation."""
    return "validation BLEU" if metric == "bleu" else "validation loss"


def validate(run: Training) -> None:
    """Rank 0 computes the validation loss (and, with ``trainer.valid_bleu``, the subset's BLEU
    and chrF), logs them and checkpoints (``best.pt`` too when it is the best so far by
    ``trainer.best_metric``); the other ranks wait, so no rank counts this wait as training
    time. A loss that is not finite saves nothing and raises :class:`TrainingError`."""
    state, loss = run.state, 0.0
    if run.logger is not None:
        loss, nll, tokens = losses_of(run, run.model)
        if loss < state.best_valid_loss:  # the sentences of the best loss, kept for the report
            sources = [len(s) + 1 for s in run.data.valid_src]
            write_losses(run.run_dir.valid_losses, SentenceLosses(sources, nll, tokens))
    loss = distributed.all_reduce([loss], run.device)[0]  # rank 0's loss, on every rank
    if not math.isfinite(loss):
        raise TrainingError(advice.nan_validation(loss, state.step, run.run_dir.checkpoints))
    metric = run.trainer.best_metric
    if run.logger is not None:
        scores, examples = run.valid_bleu(run.model, run.tokenizer) if run.valid_bleu else ({}, "")
        bleu = scores.get("bleu")
        best = improved(metric, loss, state.best_valid_loss, bleu, state.best_valid_bleu)
        state.best_step = state.step if best else state.best_step
        state.best_valid_loss = min(loss, state.best_valid_loss)
        if bleu is not None and (state.best_valid_bleu is None or bleu > state.best_valid_bleu):
            state.best_valid_bleu = bleu
        state.validations_since_best = 0 if best else state.validations_since_best + 1
        entry = {"step": state.step, "seconds": state.train_seconds, "valid_loss": loss}
        state.history.append(entry | {f"valid_{k}": v for k, v in scores.items()})
        run.logger.scalars(state.step, {"valid/loss": loss})
        run.logger.against_time("valid_loss", loss, state.train_seconds)
        if scores:
            run.logger.scalars(
                state.step, {f"valid/{name}": scores[name] for name in VALIDATION_METRICS}
            )
            run.logger.against_time("valid_bleu", bleu, state.train_seconds)
        if examples:  # TensorBoard's Text tab, as fairseq users log a few translations
            run.logger.writer.add_text("valid/examples", examples, state.step)
        validate_ema(run)
        run.logger.writer.flush()
        save(run, best)
        bleu_text = (
            f", BLEU {bleu:.2f} chrF {scores['chrf']:.2f} on {len(run.valid_bleu.sources)} "
            f"pairs ({scores['seconds']:.1f} s)"
            if scores
            else ""
        )
        log.info("step %d: valid loss %.4f%s%s", state.step, loss, bleu_text, " (best)" * best)
    since_best = state.validations_since_best if run.logger is not None else None
    if stop_early(run.trainer.patience, since_best, run.device) and not state.stopped_early:
        state.stopped_early = True
        if run.logger is not None:
            log.info(
                "early stop at step %d: %d validations without improving on the best %s "
                "(trainer.patience)",
                state.step,
                run.trainer.patience,
                best_metric_name(metric),
            )
    distributed.barrier()


def losses_of(run: Training, model: torch.nn.Module) -> tuple[float, list[float], list[int]]:
    """``model``'s validation loss and each validation pair's summed NLL and target tokens."""
    data = run.data
    return validation_loss(
        model,  # type: ignore[arg-type]
        data.valid_src,
        data.valid_tgt,
        run.tokenizer,
        run.trainer.max_tokens,
        run.device,
        run.amp,
    )


def validate_ema(run: Training) -> None:
    """With ``trainer.ema_decay``, the validation loss of the EMA weights as ``valid/loss_ema``
    (rank 0). It is logged only: ``best.pt`` is chosen on the raw weights, as without EMA."""
    if run.ema is None or run.logger is None:
        return
    loss, _, _ = losses_of(run, run.ema.module)
    run.logger.scalars(run.state.step, {"valid/loss_ema": loss})
    log.info("step %d: EMA weights' valid loss %.4f", run.state.step, loss)


def save(run: Training, best: bool) -> None:
    """``last.pt`` (the one before kept as ``previous.pt``), and ``best.pt`` when ``best`` (a
    hard link of that ``last.pt``); with ``eval.average_last=N`` > 1 and a validated step also
    the weights as ``step_<step>.pt``, the newest N kept (evaluation averages them). Weights
    that are not all finite are never saved: :class:`TrainingError` naming the step."""
    if not checkpoint.all_finite(run.model.state_dict()):
        raise TrainingError(advice.nan_weights(run.state.step, run.run_dir.checkpoints))
    run.steps.saved_step = run.state.step
    payload = checkpoint_payload(
        run.model, run.optimizer, run.scheduler, run.state, run.settings, run.ema
    )
    checkpoint.save_atomic(payload, run.run_dir.last, keep_previous=True)
    if best:
        checkpoint.link_over(run.run_dir.last, run.run_dir.best)
    keep = run.settings.eval.average_last
    if keep > 1 and validated_at(run.state, run.state.step):
        checkpoint.save_step(payload, run.run_dir.checkpoints, keep)


def validated_at(state: TrainState, step: int) -> bool:
    return bool(state.history) and state.history[-1]["step"] == step
