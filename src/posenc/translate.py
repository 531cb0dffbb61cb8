"""The translate command, like ``fairseq-interactive``::

    python -m posenc.translate run_dir=RUN [input=FILE] [output=FILE] [KEY=VALUE ...]

reads raw source sentences, one per line, from ``input=FILE`` or stdin (until its end),
translates them in token-bucketed batches with the run's own tokenizer and checkpoint (or the
average of its last checkpoints, ``eval.average_last``), and writes the detokenised
translations, one per line in input order, to ``output=FILE`` or stdout. A blank line stays
blank. Overrides apply to the run's saved config as in standalone evaluation
(``eval.beam_size=5``, ``eval.lenpen=0.6``, ``eval.checkpoint=last``, ``device=cpu``,
``trainer.progress=true`` for a progress bar on stderr); log lines go to stderr.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from posenc.data.tokenizer import Tokenizer
from posenc.evaluation.decode import DecodeSettings, translate
from posenc.evaluation.evaluate import average_last
from posenc.evaluation.standalone import check_run_dir, compose_run_config, load_checked
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.cli import Command, one_line_errors
from posenc.runtime.device import resolve_device
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.translate")

COMMAND = Command(
    "posenc.translate",
    {
        "run_dir": "the trained run (a directory with config.yaml and checkpoints/)",
        "input": "source sentences, one a line (default: stdin)",
        "output": "where the translations go, one a line (default: stdout)",
    },
    ("run_dir",),
    "Translate text with a trained run, by the run's own tokenizer and decoding settings.",
    "python -m posenc.translate run_dir=outputs/runs/default/pe=rope@1a2b3c4d input=fr.txt "
    "eval.beam_size=5",
)


def read_lines(source: Path | None) -> list[str]:
    """The lines of ``source`` (stdin when None); SystemExit (one line) when it is unreadable."""
    if source is None:
        return sys.stdin.read().splitlines()
    try:
        return source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else f"not UTF-8 ({err.reason})"
        raise SystemExit(f"cannot read input={source}: {reason}") from None


def translate_lines(
    lines: list[str],
    tokenizer: Tokenizer,
    model: Seq2Seq,
    settings: DecodeSettings,
    device: torch.device,
) -> list[str]:
    """The detokenised translation of each of ``lines``, in order; a blank line stays blank."""
    wanted = [i for i, line in enumerate(lines) if line.strip()]
    translations = [""] * len(lines)
    if wanted:
        sources = tokenizer.encode_batch([lines[i] for i in wanted])
        ids, _ = translate(model, tokenizer, sources, settings, device)
        for i, text in zip(wanted, tokenizer.decode_batch(ids), strict=True):
            translations[i] = text
    return translations


def write_lines(lines: list[str], target: Path | None) -> None:
    """``lines`` to ``target`` (written atomically) or stdout; SystemExit (one line) when the
    file cannot be written."""
    text = "".join(f"{line}\n" for line in lines)
    if target is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        write_text(target, text)
    except OSError as err:
        raise SystemExit(f"cannot write output={target}: {err.strerror}") from None


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.translate run_dir=RUN [input=FILE] [output=FILE]
    [KEY=VALUE ...]`` (see the module's doc); every error ends it with one line, and the output
    file is written whole or not at all."""
    with one_line_errors("posenc.translate", (ValueError, CheckpointError)):
        _main(list(sys.argv[1:] if argv is None else argv))


def _main(args: list[str]) -> None:
    paths, overrides = COMMAND.read(args)
    run_dir = paths["run_dir"]
    check_run_dir(run_dir)
    cfg = compose_run_config(run_dir, overrides)
    lines = read_lines(paths.get("input"))
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stderr)
    tokenizer, model, step, checkpoint = load_checked(run_dir, cfg)
    settings = DecodeSettings.of(cfg)
    averaged = average_last(cfg)
    weights = checkpoint.name if averaged == 1 else f"the average of the last {averaged}"
    started = time.perf_counter()
    translations = translate_lines(lines, tokenizer, model, settings, resolve_device(cfg.device))
    write_lines(translations, paths.get("output"))
    log.info(
        "%d lines translated in %.1f s: %s (step %d), beam %d",
        len(lines),
        time.perf_counter() - started,
        weights,
        step,
        settings.beam_size,
    )


if __name__ == "__main__":
    main()
