"""Decoding a list of tokenised sentences (evaluation and the translate command): translations
come back in input order under the decoding settings asked for, whatever the batching, and the
progress bar writes to stderr and changes nothing else."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import torch
from conftest import PE_NAMES, tiny_model

from posenc.evaluation.decode import DecodeSettings, decode_sources

SPECIALS = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2)
"""What decoding needs of a tokenizer: its special ids."""
CPU = torch.device("cpu")


def sentences() -> list[list[int]]:
    return [torch.randint(3, 40, (n,)).tolist() for n in (7, 2, 9, 4, 1, 6)]


def test_beam_translations_come_back_in_input_order_whatever_the_batches():
    model = tiny_model(PE_NAMES[0]).double().eval()
    sources = sentences()
    settings = DecodeSettings(batch_tokens=12, max_len_a=1.0, max_len_b=4, beam_size=3, lenpen=0.6)
    batched, _ = decode_sources(model, SPECIALS, sources, settings, CPU)
    one_batch, _ = decode_sources(
        model, SPECIALS, sources, replace(settings, batch_tokens=999), CPU
    )
    alone = [
        model.generate(torch.tensor([[*s, 2]]), 1.0, 4, beam_size=3, lenpen=0.6)[0] for s in sources
    ]
    assert batched == one_batch == alone


def test_the_progress_bar_changes_no_translation_and_stays_off_a_pipe(capsys):
    """Asked for, the bar is drawn on a terminal only (``posenc.runtime.progress``): into a
    captured stream it writes nothing."""
    model = tiny_model(PE_NAMES[0]).eval()
    sources = sentences()
    quiet = DecodeSettings(batch_tokens=12, max_len_a=1.0, max_len_b=4)
    without, _ = decode_sources(model, SPECIALS, sources, quiet, CPU)
    silent = capsys.readouterr()
    with_bar, _ = decode_sources(model, SPECIALS, sources, replace(quiet, progress=True), CPU)
    piped = capsys.readouterr()
    assert with_bar == without
    assert silent.err == silent.out == piped.out == piped.err == ""


def test_decoding_stops_where_a_learned_table_ends_instead_of_failing_there():
    """A learned table of 6 positions, asked for up to 50 tokens: greedy decoding and beam
    search stop at 6 tokens, EOS included (5 and the forced EOS: BOS and 5 tokens fill the
    table's 6 decoder positions), where asking for a 7th position would fail."""
    model = tiny_model("learned", max_len=6).eval()
    model.eos_id = -1  # never chosen: every row runs to its limit
    src = torch.randint(3, 40, (2, 4))
    assert model.position_limit == 6
    assert [len(row) for row in model.generate(src, max_len_a=0.0, max_len_b=50)] == [5, 5]
    model.eos_id = 2
    found = model.generate(src, max_len_a=0.0, max_len_b=50, beam_size=2)
    assert all(len(row) <= 5 for row in found)
