"""posenc from Python, as Hugging Face and fairseq users expect: load a trained run, translate.

    import posenc

    run = posenc.load_run("outputs/runs/default/pe=rope@1a2b3c4d")
    run.translate(["Bonjour le monde ."])                  # ['Hello world .']
    run.translate(["Bonjour ."], beam_size=5, nbest=3)     # [[(score, 'Hello .'), ...]]

A run is loaded as ``python -m posenc.translate`` loads it (its own config, tokenizer and
checkpoint, with ``KEY=VALUE`` overrides of its ``eval`` settings checked as there), and
translates with the same code, so the two give the same translations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig

from posenc.data.tokenizer import Tokenizer
from posenc.evaluation.decode import DecodeSettings, decode_nbest, decode_sources
from posenc.evaluation.standalone import load_runs, run_configs
from posenc.model.seq2seq import Translator
from posenc.runtime.device import resolve_device


@dataclass
class TrainedRun:
    """A run's model on its device with its tokenizer and decoding settings
    (:func:`load_run`)."""

    path: Path
    config: DictConfig
    tokenizer: Tokenizer
    model: Translator
    step: int
    checkpoint: Path
    device: torch.device

    def translate(
        self, sentences: Sequence[str], beam_size: int | None = None, nbest: int = 1
    ) -> list[str] | list[list[tuple[float, str]]]:
        """The detokenised translation of each sentence (greedy, or beam search of
        ``beam_size``; default: the run's ``eval`` settings). With ``nbest`` > 1, each
        sentence's ``nbest`` best ``(score, translation)`` pairs, best first, from a beam at
        least that wide."""
        settings = DecodeSettings.of(self.config)
        if beam_size is not None:
            settings = replace(settings, beam_size=beam_size)
        if nbest > settings.beam_size:
            raise ValueError(
                f"nbest={nbest} needs a beam at least that wide (beam_size={settings.beam_size})"
            )
        sources = self.tokenizer.encode_batch(list(sentences))
        if nbest == 1:
            ids, _ = decode_sources(self.model, self.tokenizer, sources, settings, self.device)
            return self.tokenizer.decode_batch(ids)
        found, _ = decode_nbest(self.model, self.tokenizer, sources, settings, self.device, nbest)
        texts = iter(self.tokenizer.decode_batch([h.tokens for hyps in found for h in hyps]))
        return [[(h.score, next(texts)) for h in hyps] for hyps in found]


def load_run(path: str | Path, *overrides: str) -> TrainedRun:
    """The trained run in ``path`` at the checkpoint its ``eval.checkpoint`` names (``best``
    unless overridden: ``load_run(path, "eval.checkpoint=last", "device=cpu")``).

    Raises:
        SystemExit: ``path`` is no posenc run, or it has no checkpoint (one line, as the
            command line says it).
        ValueError: an override is not one of the run's settings or not of its type.
    """
    run_dir = Path(path)
    cfg = run_configs([run_dir], list(overrides))[0]
    (tokenizer, model, step, checkpoint), _ = load_runs([run_dir], [cfg])
    device = resolve_device(cfg.device)
    return TrainedRun(run_dir, cfg, tokenizer, model.to(device).eval(), step, checkpoint, device)
