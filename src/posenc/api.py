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

from posenc.config import EvalConfig
from posenc.config.settings import Settings
from posenc.data.streams import MAX_LINE_CHARS
from posenc.data.tokenizer import Tokenizer
from posenc.evaluation.decode import DecodeSettings, decode_nbest, decode_sources
from posenc.evaluation.standalone import load_runs, run_configs
from posenc.model.seq2seq import Translator
from posenc.runtime.device import resolve_device


class RunNotFoundError(FileNotFoundError):
    """The path is no posenc run, or the run has no checkpoint to load (one line saying which)."""


class RunSettingError(ValueError):
    """An override is not one of the run's settings, or not of its type (one line)."""


@dataclass(repr=False)
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
    decoding: DecodeSettings

    def __repr__(self) -> str:
        return (
            f"TrainedRun({str(self.path)!r}, pe={self.config.pe.name}, step={self.step}, "
            f"checkpoint={self.checkpoint.name}, device={self.device})"
        )

    def translate(
        self, sentences: Sequence[str], beam_size: int | None = None, nbest: int = 1
    ) -> list[str] | list[list[tuple[float, str]]]:
        """The detokenised translation of each sentence (greedy, or beam search of
        ``beam_size``; default: the run's ``eval`` settings). With ``nbest`` > 1, each
        sentence's ``nbest`` best ``(score, translation)`` pairs, best first, from a beam at
        least that wide."""
        settings = self.decoding
        if beam_size is not None:
            EvalConfig.settings()["eval.beam_size"].check("beam_size", beam_size)
            settings = replace(settings, beam_size=beam_size)
        EvalConfig.settings()["eval.beam_size"].check("nbest", nbest)  # the same range
        sentences = list(sentences)
        for number, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(f"sentence {number} is a {type(sentence).__name__}, not a str")
            if len(sentence) > MAX_LINE_CHARS:
                raise ValueError(
                    f"sentence {number} has {len(sentence):,} characters, over the "
                    f"{MAX_LINE_CHARS:,} a sentence may have: split it into sentences"
                )
        if nbest > settings.beam_size:
            raise ValueError(
                f"nbest={nbest} needs a beam at least that wide (beam_size={settings.beam_size})"
            )
        sources = self.tokenizer.encode_batch(sentences)
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
        RunNotFoundError: ``path`` is no posenc run, or it has no checkpoint (a
            ``FileNotFoundError``; one line, as the command line says it).
        RunSettingError: an override is not one of the run's settings or not of its type (a
            ``ValueError``).
    """
    run_dir = Path(path)
    if not (run_dir / "config.yaml").is_file():
        raise RunNotFoundError(f"{run_dir} is no posenc run: it holds no config.yaml")
    try:
        cfg = run_configs([run_dir], list(overrides))[0]
    except (SystemExit, ValueError) as refused:
        raise RunSettingError(_said(refused)) from None
    try:
        (tokenizer, model, step, checkpoint), _ = load_runs([run_dir], [cfg])
    except SystemExit as refused:
        raise RunNotFoundError(_said(refused)) from None
    settings = Settings.of(cfg)
    device = resolve_device(settings.run.device)
    decoding = DecodeSettings.of(settings.eval, settings.trainer.progress)
    model = model.to(device).eval()
    return TrainedRun(run_dir, cfg, tokenizer, model, step, checkpoint, device, decoding)


def _said(refused: BaseException) -> str:
    """The one line a command-line refusal (``SystemExit``) or error carries."""
    text = str(refused.code if isinstance(refused, SystemExit) else refused)
    return text.splitlines()[0] if text else type(refused).__name__
