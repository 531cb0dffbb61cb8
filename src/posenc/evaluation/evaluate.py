"""Decode test sets (greedy or beam search, from one checkpoint or an average of the last N) and
score them.

Writes, per split, ``hypotheses.<split>.txt`` and ``references.<split>.txt`` (detokenised) and
``metrics.json`` with sacreBLEU (and signature), chrF, BERTScore (model, layer, hash), the test
loss, the decoding settings (``sampling``: its settings, when it sampled), decoding time and
speed, and BLEU/loss by source-length bucket;
with ``eval.average_last`` > 1 it names the averaged checkpoints (``averaged``), and with
``eval.weights=ema`` (a run trained with ``trainer.ema_decay``) it scores the EMA of the weights
that the checkpoint holds, or their average (``weights: ema``).

The evaluation that training runs goes into the run directory itself; when a continued run is
evaluated again at a later step, the earlier evaluation moves to ``RUN/evals/step=N/`` first.
A standalone evaluation, ``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``, composes
its overrides onto the run's saved config (typos and wrong types refused) and writes into
``RUN/evals/<overrides>,step=N/``: it never replaces what training wrote, and re-running the
same evaluation reads the one already there.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from omegaconf import OmegaConf

from posenc.config import EvalConfig
from posenc.config.metrics import MODEL_METRICS, Metric
from posenc.config.settings import Settings
from posenc.data.corpus import Corpus
from posenc.data.splits import eval_splits, load_corpora
from posenc.data.tokenizer import Tokenizer
from posenc.evaluation.attention_maps import example_attention, plot_attention
from posenc.evaluation.decode import DecodeSettings, decode_sources
from posenc.evaluation.metrics import corpus_scores, length_buckets
from posenc.model.factory import load_run_model, variant_model
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime.averaging import last_step_checkpoints
from posenc.runtime.checkpoint import step_checkpoints
from posenc.runtime.device import resolve_device
from posenc.runtime.files import replacing, write_json, write_text
from posenc.runtime.rundir import EVALUATION_FILES, RunDir, as_run_dir
from posenc.runtime.sentence_losses import SentenceLosses, losses_file, write_losses
from posenc.training.losses import sentence_losses

log = logging.getLogger("posenc.evaluation.evaluate")


def evaluated_part(corpus: Corpus, settings: EvalConfig) -> Corpus:
    """The pairs of ``corpus`` an evaluation scores: all, or the first ``eval.max_sentences``."""
    if not settings.max_sentences:
        return corpus
    limit = settings.max_sentences
    return Corpus(corpus.name, corpus.src[:limit], corpus.tgt[:limit])


def scored_losses(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    targets: list[list[int]],
    batch_tokens: int,
    device: torch.device,
) -> SentenceLosses:
    """Each pair's teacher-forced loss as an evaluation keeps it (source lengths incl. EOS)."""
    nll, counts = sentence_losses(model, tokenizer, sources, targets, batch_tokens, device)
    return SentenceLosses([len(s) + 1 for s in sources], nll, counts)


class ModelScorer(Protocol):
    """A metric computed by a model (:attr:`Metric.scorer`), loaded once per evaluation."""

    def score(
        self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]
    ) -> dict[str, Any]:
        """The metric's keys of one split's ``metrics.json``."""


def model_scorers(settings: EvalConfig, device: torch.device) -> list[tuple[Metric, ModelScorer]]:
    """Each metric a model computes with its scorer, built from its ``eval`` settings group
    (:data:`~posenc.config.metrics.MODEL_METRICS`; the scorer class imported here, so an
    evaluation that scores none loads none)."""
    found = []
    for metric in MODEL_METRICS:
        module, _, name = metric.scorer.partition(":")  # type: ignore[union-attr]
        scorer_class = getattr(importlib.import_module(module), name)
        group = getattr(settings, metric.settings)  # typed by its entry's settings_class
        found.append((metric, scorer_class.of(group, device)))
    return found


def evaluate_split(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    corpus: Corpus,
    settings: EvalConfig,
    decoding: DecodeSettings,
    scorers: Sequence[tuple[Metric, ModelScorer]],
    device: torch.device,
    out_dir: Path,
    split: str,
) -> dict[str, Any]:
    """Decode (as ``decoding`` says) and score one split; writes its hypothesis and reference
    files into ``out_dir``."""
    started = time.perf_counter()
    corpus = evaluated_part(corpus, settings)
    log.info("%s: decoding %d sentences", split, len(corpus.src))
    sources = tokenizer.encode_batch(corpus.src)
    targets = tokenizer.encode_batch(corpus.tgt)
    ids, seconds = decode_sources(model, tokenizer, sources, decoding, device)
    hypotheses = tokenizer.decode_batch(ids)
    write_text(RunDir(out_dir).hypotheses(split), "\n".join(hypotheses) + "\n")
    write_text(RunDir(out_dir).references(split), "\n".join(corpus.tgt) + "\n")
    phases = {"decoding": seconds}
    with _timed(phases, "loss"):
        losses = scored_losses(model, tokenizer, sources, targets, settings.batch_tokens, device)
    write_losses(losses_file(out_dir, split), losses)
    generated = sum(len(row) + 1 for row in ids)
    with _timed(phases, "BLEU/chrF"):
        surface = corpus_scores(hypotheses, corpus.tgt)
    neural: dict[str, Any] = {}
    for metric, scorer in scorers:  # the metrics a model computes (config.metrics)
        with _timed(phases, metric.label):
            neural |= scorer.score(corpus.src, hypotheses, corpus.tgt)
    result: dict[str, Any] = {
        "sentences": len(hypotheses),
        **surface,
        **neural,
        "loss": round(losses.loss, 5),
        "decode_seconds": round(seconds, 3),
        "decode_tokens_per_s": round(generated / max(seconds, 1e-9), 1),
        "decode_sentences_per_s": round(len(ids) / max(seconds, 1e-9), 2),
        "use_cache": decoding.use_cache,
        "beam_size": decoding.beam_size,
        "lenpen": decoding.lenpen,
        "max_len_a": decoding.max_len_a,
        "max_len_b": decoding.max_len_b,
        **({"sampling": asdict(decoding.sampling)} if decoding.sampling else {}),
        "empty_hypotheses": sum(not h.strip() for h in hypotheses),
        "buckets": length_buckets(
            list(settings.length_buckets),
            losses.source_tokens,
            hypotheses,
            corpus.tgt,
            losses.nll,
            losses.target_tokens,
        ),
    }
    if result["empty_hypotheses"] * 2 > len(hypotheses):
        log.warning(
            "%s: %d of %d hypotheses are empty: the model does not translate yet, so its scores "
            "say little; train longer",
            split,
            result["empty_hypotheses"],
            len(hypotheses),
        )
    log.info(
        "%s: BLEU %.2f chrF %.2f BERTScore-F1 %s (%d sentences in %.1f s: %s)",
        split,
        result["bleu"],
        result["chrf"],
        result["bertscore_f1"],
        len(ids),
        time.perf_counter() - started,
        ", ".join(  # decoding, then each other phase that took a visible time
            f"{name} {spent:.1f}"
            for name, spent in phases.items()
            if name == "decoding" or spent >= 0.05
        ),
    )
    return result


@contextmanager
def _timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds the block takes to ``phases[name]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def use_ema(settings: EvalConfig) -> bool:
    """Whether evaluation scores the EMA of the weights (``eval.weights=ema``) rather than the
    weights themselves (``raw``, or null: a run saved before the setting existed)."""
    return settings.weights == "ema"


def kept_for_averaging(settings: EvalConfig, run_dir: RunDir) -> int:
    """What the run's own evaluation after training averages: ``eval.average_last`` step
    checkpoints, or all the run kept when it validated fewer times (with a warning; below two,
    the ``eval.checkpoint`` one), so that a trained run does not fail for want of validations.
    Standalone evaluation asks for exactly ``eval.average_last`` instead."""
    wanted = settings.average_last
    kept = len(step_checkpoints(run_dir.checkpoints)) if wanted > 1 else wanted
    if kept < wanted:
        log.warning(
            "eval.average_last=%d, but the run validated only %d times: %s; validate more "
            "often (trainer.valid_every) to average %d",
            wanted,
            kept,
            f"averaging those {kept}" if kept > 1 else f"evaluating {settings.checkpoint}.pt",
            wanted,
        )
    return max(min(kept, wanted), 1)


def archive_evaluation(run_dir: RunDir, config: Mapping[str, Any]) -> Path:
    """Move the run's own evaluation into a new ``RUN/evals/step=N/`` (``step=N.2``, ... when
    taken), with ``config``, the settings it was made with, as ``eval_config.yaml`` beside it,
    so that a new evaluation replaces nothing; returns where it went."""
    step = (run_dir.metrics() or {}).get("step")
    target = run_dir.evals / f"step={step}"
    copy = 1
    while target.exists():
        copy += 1
        target = run_dir.evals / f"step={step}.{copy}"
    target.mkdir(parents=True)
    for pattern in EVALUATION_FILES:
        for path in run_dir.path.glob(pattern):
            path.replace(target / path.name)
    OmegaConf.save(OmegaConf.create(dict(config)), RunDir(target).eval_config, resolve=True)
    return target


def evaluate(
    settings: Settings,
    run_dir: Path | RunDir,
    out_dir: Path | None = None,
    loaded: tuple | None = None,
    about: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate ``run_dir`` on ``eval.splits``; writes ``metrics.json`` and the other
    files into ``out_dir`` (default: the run directory, whose earlier evaluation of another step
    is archived first) and returns the metrics. ``loaded`` is :func:`load_run_model`'s answer
    when the caller has it already (its model may be an :class:`~posenc.model.ensemble.Ensemble`,
    which has no attention map of its own), and ``about`` goes into the metrics as it is. The
    model decodes on the device it sits on: ``run.device`` for the one loaded here."""
    run_dir = as_run_dir(run_dir)
    own, wanted = out_dir is None, settings.eval
    averaged_count = kept_for_averaging(wanted, run_dir) if own else wanted.average_last
    if loaded is None:
        device = resolve_device(settings.run.device)
        loaded = load_run_model(
            run_dir.path, settings, wanted.checkpoint, device, averaged_count, use_ema(wanted)
        )
    tokenizer, model, step, path = loaded
    if own:
        _archive_other_step(run_dir, settings.composed, step)
    out_dir = run_dir.path if own else out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    corpora = load_corpora(settings.data, with_train=False)
    splits = eval_splits(wanted.splits, corpora)
    metrics = _header(settings, run_dir, path, step, averaged_count, about)
    metrics.update(_scored(settings, model, tokenizer, corpora, splits, out_dir))
    if isinstance(model, Seq2Seq):
        log_to = run_dir if own else None
        title = f"{settings.pe['name']}: layer-0 attention"
        _save_attention_example(
            model, tokenizer, corpora[splits[0]], title, out_dir, model_device(model), step, log_to
        )
    if (summary := run_dir.summary()) is not None:
        metrics["train"] = summary
    write_json(RunDir(out_dir).metrics_file, metrics)
    return metrics


def _header(
    settings: Settings,
    run_dir: RunDir,
    path: Path,
    step: int,
    averaged_count: int,
    about: dict[str, Any] | None,
) -> dict[str, Any]:
    """What an evaluation evaluated: the encoding, the checkpoint and its step, ``splits`` to
    fill, ``about`` as it is, the checkpoints averaged (``averaged``) or the EMA weights
    (``weights``)."""
    header: dict[str, Any] = {
        "pe": settings.pe["name"],
        "checkpoint": str(path.name),
        "step": step,
        "splits": {},
        **(about or {}),
    }
    if averaged_count > 1:
        averaged = last_step_checkpoints(run_dir.checkpoints, averaged_count)
        header["averaged"] = [checkpoint.name for checkpoint in averaged]
    if use_ema(settings.eval):
        header["weights"] = "ema"
    return header


def model_device(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s weights sit on (where it decodes)."""
    return next(model.parameters()).device


def _archive_other_step(run_dir: RunDir, composed: Mapping[str, Any], step: int) -> None:
    """Move the run's own evaluation aside (:func:`archive_evaluation`, with the ``composed``
    config) when it evaluated another step than ``step``."""
    earlier = run_dir.metrics()
    if earlier is not None and earlier.get("step") != step:
        target = archive_evaluation(run_dir, composed)
        log.info("the evaluation at step %s moved to %s", earlier.get("step"), target)


def _scored(
    settings: Settings,
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    corpora: dict[str, Corpus],
    splits: list[str],
    out_dir: Path,
) -> dict[str, Any]:
    """``{"splits": {split: scores}}`` of the model on each split, and ``"variants"``: the same
    for each test-time variant of ``eval.pe_variants``; their files written into ``out_dir``."""
    device = model_device(model)
    decoding = DecodeSettings.of(settings.eval, settings.trainer.progress)
    scorers = model_scorers(settings.eval, device)

    def scores(scored_model: torch.nn.Module, suffix: str = "") -> dict[str, Any]:
        return {
            split: evaluate_split(
                scored_model,
                tokenizer,
                corpora[split],
                settings.eval,
                decoding,
                scorers,
                device,
                out_dir,
                split + suffix,
            )
            for split in splits
        }

    found: dict[str, Any] = {"splits": scores(model)}
    variants = settings.eval.pe_variants or {}
    if variants:
        found["variants"] = {
            name: {
                "pe": dict(overrides),
                "splits": scores(
                    variant_model(settings, overrides, model, tokenizer, device), f".{name}"
                ),
            }
            for name, overrides in variants.items()
        }
    return found


def _save_attention_example(
    model,
    tokenizer,
    corpus: Corpus,
    title: str,
    out_dir: Path,
    device: torch.device,
    step: int,
    log_to: RunDir | None,
) -> None:
    """Layer-0 attention of the first sentence pair of ``corpus`` -> npz and PNG in
    ``out_dir`` (``title``, then the source's first 60 characters); also to the TensorBoard of
    run ``log_to`` when given."""
    maps = example_attention(model, tokenizer, corpus.src[0], corpus.tgt[0], device)
    with replacing(RunDir(out_dir).attention("npz"), "wb") as handle:
        np.savez_compressed(handle, **maps)
    image = plot_attention(
        maps,
        f"{title} on '{corpus.src[0][:60]}'",
        RunDir(out_dir).attention("png"),
    )
    if log_to is not None:
        log_to.logger(resume_step=step, resume_seconds=1e12).image(
            "views/attention_layer0", image, step
        )
