"""The translate command, like ``fairseq-interactive``::

    python -m posenc.translate run_dir=RUN [input=FILE] [output=FILE] [nbest=N] [KEY=VALUE ...]

reads raw source sentences, one per line, from ``input=FILE`` or stdin (until its end),
translates them in token-bucketed batches with the run's own tokenizer and checkpoint (or the
average of its last checkpoints, ``eval.average_last``), and writes the detokenised
translations, one per line in input order, to ``output=FILE`` or stdout. A blank line stays
blank. Overrides apply to the run's saved config as in standalone evaluation
(``eval.beam_size=5``, ``eval.lenpen=0.6``, ``eval.sampling=true eval.top_p=0.9 eval.seed=1``,
``eval.checkpoint=last``, ``device=cpu``, ``trainer.progress=true`` for a progress bar on
stderr); log lines go to stderr.

``run_dir=A run_dir=B ...`` translates with an ensemble of the runs (their probabilities
averaged at each step, each with its own encoding and cache: :mod:`posenc.model.ensemble`),
sources read by A's tokenizer, which every run must share, and decoded as A's config says.

``nbest=N`` (N > 1, at most ``eval.beam_size``, not with sampling) writes beam search's N best
hypotheses of every sentence instead, like ``fairseq-generate --nbest N``: one line each,
:data:`NBEST_FORMAT`, best first, sentences in input order; ``sentence_index`` counts input
lines from 0, ``rank`` from 1; a blank line has no hypotheses.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path

import torch

from posenc.config import Setting
from posenc.config.roles import Role, keys_with
from posenc.config.settings import Settings
from posenc.data.streams import MAX_LINE_CHARS
from posenc.data.tokenizer import Tokenizer
from posenc.evaluation.decode import DecodeSettings, decode_nbest, decode_sources
from posenc.evaluation.evaluate import use_ema
from posenc.evaluation.standalone import RUN_DIR_HELP, load_runs, run_configs
from posenc.model.seq2seq import Translator
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.cli import Command, one_line_errors
from posenc.runtime.device import resolve_device
from posenc.runtime.files import write_text

log = logging.getLogger("posenc.translate")

COMMAND = Command(
    "posenc.translate",
    {
        "run_dir": RUN_DIR_HELP,
        "input": "source sentences, one a line (default: stdin)",
        "output": "where the translations go, one a line (default: stdout)",
        "nbest": "N > 1 (at most eval.beam_size, not with eval.sampling): beam search's N best "
        "hypotheses of each sentence, one a line, best first, tab-separated: "
        "sentence_index<TAB>rank<TAB>score<TAB>log_prob<TAB>translation (index: the input "
        "line's, from 0; rank from 1; log_prob: summed log-probability of the tokens and EOS; "
        "score = log_prob / length ** eval.lenpen, the length counting EOS); default 1: the "
        "translations alone, one a line",
    },
    ("run_dir",),
    "Translate text with a trained run, by the run's own tokenizer and decoding settings.",
    "python -m posenc.translate run_dir=outputs/runs/default/pe=rope@1a2b3c4d input=fr.txt "
    "eval.beam_size=5 nbest=3",
    values={"nbest": Setting("int", low=1)},
    repeatable=("run_dir",),
    ignores=tuple(sorted(keys_with(Role.SCORING))),  # translate reads its own input
)

#: what :meth:`str.splitlines` reads as the end of a line: a translation (byte-level BPE may
#: produce any character) writes each as a space, so that it stays one line
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")

#: one line of ``nbest=N``'s output (tab-separated; ``score`` ranks, ``log_prob`` is the summed
#: log-probability of the tokens and EOS, ``score = log_prob / (tokens + 1) ** eval.lenpen``)
NBEST_FORMAT = "sentence_index<TAB>rank<TAB>score<TAB>log_prob<TAB>translation"


#: the most bytes of input read (a book is a few MB); more ends the command in one line
MAX_INPUT_BYTES = 200_000_000


def read_lines(source: Path | None) -> list[str]:
    """The lines of ``source`` (stdin when None), split at ``\n`` only: a line ending ``\r\n``
    loses its ``\r``, and any other character that ends a line (:data:`LINE_BREAKS`) inside a
    line becomes a space, so that the output has exactly one line per input line. SystemExit
    (one line) when the input is unreadable, not UTF-8, or over :data:`MAX_INPUT_BYTES`."""
    name = "standard input" if source is None else f"input={source}"
    try:
        if source is None:
            stream = getattr(sys.stdin, "buffer", None)  # a text stream without one: its text
            if stream is None:
                data = sys.stdin.read(MAX_INPUT_BYTES + 1).encode("utf-8")
            else:
                data = stream.read(MAX_INPUT_BYTES + 1)
        else:
            with open(source, "rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as err:
        raise SystemExit(f"cannot read {name}: {err.strerror}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise SystemExit(
            f"cannot read {name}: it holds more than {MAX_INPUT_BYTES:,} bytes; translate it in "
            "parts"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SystemExit(
            f"cannot read {name}: not UTF-8 (byte offset {err.start}: {err.reason}); convert "
            "it with iconv -t UTF-8"
        ) from None
    if not text:
        return []
    lines = (text[:-1] if text.endswith("\n") else text).split("\n")
    return [one_line(line.removesuffix("\r")) for line in lines]


def translate_lines(
    lines: list[str],
    tokenizer: Tokenizer,
    model: Translator,
    settings: DecodeSettings,
    device: torch.device,
    nbest: int = 1,
) -> list[str]:
    """The detokenised translation of each of ``lines``, in order; a blank line stays blank.
    With ``nbest`` > 1, beam search's ``nbest`` best hypotheses of each line instead, one
    output line each as :data:`NBEST_FORMAT` says (a blank line has none). A sampled line
    draws from the generator of its index in ``lines`` (from 0), whatever its batch."""
    wanted = [i for i, line in enumerate(lines) if line.strip()]
    if nbest > 1:
        return nbest_lines(lines, wanted, tokenizer, model, settings, device, nbest)
    translations = [""] * len(lines)
    if wanted:
        sources = tokenizer.encode_batch([lines[i] for i in wanted])
        ids, _ = decode_sources(model, tokenizer, sources, settings, device, sentence_ids=wanted)
        for i, text in zip(wanted, tokenizer.decode_batch(ids), strict=True):
            translations[i] = one_line(text)
    return translations


def nbest_lines(
    lines: list[str],
    wanted: list[int],
    tokenizer: Tokenizer,
    model: Translator,
    settings: DecodeSettings,
    device: torch.device,
    nbest: int,
) -> list[str]:
    """The ``nbest`` best hypotheses of the ``wanted`` lines of ``lines``, as
    :data:`NBEST_FORMAT` says, sentences in input order."""
    if not wanted:
        return []
    sources = tokenizer.encode_batch([lines[i] for i in wanted])
    found, _ = decode_nbest(model, tokenizer, sources, settings, device, nbest)
    texts = iter(tokenizer.decode_batch([h.tokens for hypotheses in found for h in hypotheses]))
    return [
        f"{i}\t{rank}\t{h.score:.6f}\t{h.log_prob:.6f}\t{one_line(next(texts))}"
        for i, hypotheses in zip(wanted, found, strict=True)
        for rank, h in enumerate(hypotheses, start=1)
    ]


def one_line(text: str) -> str:
    """``text`` with every character that ends a line (:data:`LINE_BREAKS`) made a space."""
    return LINE_BREAKS.sub(" ", text)


def write_lines(lines: list[str], target: Path | None) -> None:
    """``lines`` to ``target`` or stdout; SystemExit (one line) when it cannot be written. A
    regular file (or a new one) is written atomically, through a temporary file renamed over
    it; a FIFO, a device or ``/dev/stdout`` is written directly, never replaced."""
    text = "".join(f"{line}\n" for line in lines)
    if target is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        if target.exists() and not target.is_file():
            if target.is_dir():
                raise SystemExit(f"cannot write output={target}: it is a folder")
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(text)
        else:
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
    nbest = paths.get("nbest", 1)
    configs = run_configs(paths["run_dir"], overrides)
    cfg = configs[0]
    run = Settings.of(cfg)
    settings = DecodeSettings.of(run.eval, run.trainer.progress)
    check_nbest(nbest, settings)
    lines = read_lines(paths.get("input"))
    check_lengths(lines)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s", stream=sys.stderr)
    (tokenizer, model, step, checkpoint), members = load_runs(paths["run_dir"], configs)
    averaged = run.eval.average_last
    weights = checkpoint.name if averaged == 1 else f"the average of the last {averaged}"
    weights += " (EMA weights)" if use_ema(run.eval) else ""
    weights += f" (step {step})"
    if len(members) > 1:
        others = ", ".join(f"{m['run']} ({m['checkpoint']}, step {m['step']})" for m in members[1:])
        weights = f"an ensemble of {members[0]['run']}'s {weights} and {others}"
    started = time.perf_counter()
    device = resolve_device(run.run.device)
    translations = translate_lines(lines, tokenizer, model, settings, device, nbest)
    write_lines(translations, paths.get("output"))
    log.info(
        "%d lines translated in %.1f s: %s, %s%s",
        len(lines),
        time.perf_counter() - started,
        weights,
        settings.describe(),
        f", {nbest} best each" if nbest > 1 else "",
    )


def check_lengths(lines: list[str]) -> None:
    """SystemExit (one line) at the first line over :data:`MAX_LINE_CHARS` characters, the
    limit beyond which the test splits drop a line as broken input: decoding one costs minutes
    to hours, and no sentence is that long."""
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_CHARS:
            raise SystemExit(
                f"posenc.translate: input line {number} has {len(line):,} characters, over the "
                f"{MAX_LINE_CHARS:,} a sentence may have (test splits drop such lines); split it "
                "into sentences"
            )


def check_nbest(nbest: int, settings: DecodeSettings) -> None:
    """SystemExit (one line) unless ``nbest`` hypotheses can be listed: 1 always; more only
    from a beam search at least as wide, never from sampling (one draw per sentence)."""
    if nbest == 1:
        return
    if settings.sampling is not None:
        raise SystemExit(
            f"posenc.translate: nbest={nbest} lists beam search's hypotheses, and "
            "eval.sampling=true draws one translation per sentence: drop one of them"
        )
    if nbest > settings.beam_size:
        raise SystemExit(
            f"posenc.translate: nbest={nbest} needs a beam search at least that wide "
            f"(eval.beam_size={settings.beam_size}): add eval.beam_size={nbest} or more"
        )


if __name__ == "__main__":
    main()
