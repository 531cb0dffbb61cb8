"""Sentence losses for runs evaluated before evaluation kept them:
``python scripts/sentence_losses.py RUN_OR_SWEEP... [--splits test]`` writes
``losses.<split>.tsv`` (:mod:`posenc.runtime.sentence_losses`) into every evaluation that
lacks it (a run's own and its standalone ones under ``evals/``, test-time variants included),
from the checkpoint its ``metrics.json`` names. An evaluation is refused (one line, the others
go on) where that checkpoint is not the evaluated step, or the recomputed loss of a split is not
the recorded one, so the file always describes the evaluation beside it."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import OmegaConf

from posenc.config.settings import Settings
from posenc.data.corpus import Corpus, DataError
from posenc.data.splits import load_corpora
from posenc.evaluation.evaluate import evaluated_part, scored_losses
from posenc.model.factory import load_run_model, variant_model
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.rundir import RunDir, find_run_dirs
from posenc.runtime.sentence_losses import losses_file, write_losses

#: how far the recomputed loss may be from the recorded one (kept to 5 decimals; another thread
#: count sums in another order, which moves the 6th)
TOLERANCE = 2e-5


class BackfillError(ValueError):
    """A run whose sentence losses cannot be written to match its evaluation."""


def backfill(
    results: Path,
    splits: Sequence[str],
    device: torch.device,
    corpora: dict[str, dict[str, Corpus]] | None = None,
) -> list[str]:
    """Write the sentence losses of ``splits`` (those scored and lacking the file, test-time
    variants' ``split.NAME`` included) into ``results``: a run directory, scored by its own
    evaluation, or a standalone evaluation ``RUN/evals/NAME`` (its ``eval_config.yaml`` is the
    config it was made with); returns the splits written (none for a run not evaluated yet, whose
    evaluation will write them). ``corpora`` keeps the held-out splits read, by data settings,
    for the next call (a sweep's runs share them).

    Raises:
        BackfillError: the evaluation averaged checkpoints or used the EMA, its checkpoint is at
            another step than the evaluated one, or a recomputed split differs (one line).
    """
    files = RunDir(results)
    metrics_path = files.metrics_file
    if not metrics_path.is_file():
        return []  # not evaluated (yet): its evaluation will write the file
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    # file key (split, or split.VARIANT) -> (split, variant or None, its recorded scores)
    scored = {split: (split, None, scores) for split, scores in metrics.get("splits", {}).items()}
    for name, variant in (metrics.get("variants") or {}).items():
        for split, scores in variant.get("splits", {}).items():
            scored[f"{split}.{name}"] = (split, name, scores)
    wanted = [
        key
        for key, (split, _, _) in scored.items()
        if split in splits and not losses_file(results, key).exists()
    ]
    if not wanted:
        return []
    if metrics.get("averaged") or metrics.get("weights") == "ema":
        raise BackfillError(
            f"{results}: its evaluation averaged checkpoints or used the EMA weights, which this "
            "does not rebuild; evaluate it again (python -m posenc.evaluation) instead"
        )
    standalone = files.eval_config.is_file()
    run = results.parent.parent if standalone else results
    settings = Settings.of(OmegaConf.load(files.eval_config if standalone else files.config))
    which = Path(str(metrics.get("checkpoint", ""))).stem
    tokenizer, model, step, _ = load_run_model(run, settings, which, device)
    if step != metrics.get("step"):
        raise BackfillError(
            f"{results}: {which}.pt is at step {step}, its evaluation at step "
            f"{metrics.get('step')}; evaluate the run again instead"
        )
    data = json.dumps(settings.composed["data"], sort_keys=True, default=str)
    cache = {} if corpora is None else corpora
    if data not in cache:
        cache[data] = load_corpora(settings.data, with_train=False)
    held_out = cache[data]
    encoded: dict[str, tuple[list[list[int]], list[list[int]]]] = {}
    for key in wanted:
        split, name, recorded = scored[key]
        if split not in encoded:
            corpus = evaluated_part(held_out[split], settings.eval)
            encoded[split] = tokenizer.encode_batch(corpus.src), tokenizer.encode_batch(corpus.tgt)
        scorer = (
            model
            if name is None
            else variant_model(settings, settings.eval.pe_variants[name], model, tokenizer, device)
        )
        batch_tokens = settings.eval.batch_tokens
        losses = scored_losses(scorer, tokenizer, *encoded[split], batch_tokens, device)
        sentences = len(losses.nll)
        if (
            sentences != recorded.get("sentences")
            or abs(losses.loss - recorded["loss"]) > TOLERANCE
        ):
            raise BackfillError(
                f"{results}: {key} recomputes to {sentences} sentences at loss {losses.loss:.5f}, "
                f"but was evaluated on {recorded.get('sentences')} at {recorded['loss']}: the "
                "data or the checkpoint changed since; evaluate the run again instead"
            )
        write_losses(losses_file(results, key), losses)
    return wanted


def evaluations(paths: Sequence[Path]) -> list[Path]:
    """The evaluations of the runs in ``paths`` (runs or sweeps, as the report finds them):
    each run directory and each of its standalone evaluations (``evals/*/eval_config.yaml``)."""
    found = []
    for path in paths:
        for run in find_run_dirs(path, path / "report"):
            found.append(run)
            found.extend(sorted(p.parent for p in run.glob("evals/*/eval_config.yaml")))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="+", type=Path, help="run or sweep directories (their evals/ too)"
    )
    parser.add_argument("--splits", default="test", help="comma-separated (default: test)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    splits = args.splits.split(",")
    refused = 0
    corpora: dict[str, dict[str, Corpus]] = {}
    for run in evaluations(args.paths):
        try:
            written = backfill(run, splits, torch.device("cpu"), corpora)
        except (BackfillError, CheckpointError, DataError, OSError) as error:
            refused += 1
            print(f"refused: {error}", flush=True)
            continue
        print(f"{run}: {', '.join(written) if written else 'nothing to write'}", flush=True)
    return 1 if refused else 0
