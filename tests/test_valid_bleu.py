"""Validation BLEU during training (``trainer.valid_bleu``, fairseq's ``--eval-bleu``): at each
validation a fixed, seeded subset of the validation pairs is decoded greedily and scored as the
final evaluation scores; ``trainer.best_metric=bleu`` lets it choose ``best.pt`` and drive
early stopping."""

from __future__ import annotations

import json
import logging

import pytest
import sacrebleu
import torch
from conftest import SMOKE, compose
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_run_control import scalars

from posenc.config import data as typed
from posenc.config.settings import Settings
from posenc.data.splits import validation_split
from posenc.data.tokenizer import load_tokenizer
from posenc.job import run
from posenc.model.factory import build_model, token_ids
from posenc.runtime import checkpoint
from posenc.training.loop import train
from posenc.training.validation import EXAMPLES, SUBSET_SEED, valid_subset

OVERRIDES = (*SMOKE, "pe=nonepe", "eval.enabled=false", "trainer.valid_every=10")


def test_the_subset_is_a_seeded_sample_in_corpus_order_and_the_same_every_time():
    subset = valid_subset(500, 40)
    assert subset == sorted(subset) and len(set(subset)) == 40 and max(subset) < 500
    assert valid_subset(500, 40) == subset and SUBSET_SEED == 0
    assert valid_subset(30, 40) == list(range(30))  # more asked than there are: every pair


def test_each_validation_logs_bleu_and_chrf_of_the_subset_as_evaluation_scores_them(
    tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="posenc")
    cfg = compose(*OVERRIDES, "trainer.valid_bleu=16", "trainer.max_steps=20")
    run_dir = tmp_path / "run"
    run(cfg, run_dir)
    bleu, chrf = scalars(run_dir, "valid/bleu"), scalars(run_dir, "valid/chrf")
    assert sorted(bleu) == sorted(chrf) == [10, 20]
    assert "step 20: valid loss" in caplog.text and "on 16 pairs" in caplog.text
    # the last validation's BLEU, recomputed from the final weights by hand
    tokenizer = load_tokenizer(run_dir / "tokenizer")
    settings = Settings.of(cfg)
    model = build_model(settings.model, settings.pe, *token_ids(tokenizer))
    model.load_state_dict(checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"])
    valid = validation_split(typed.data_config(settings.data))
    keep = valid_subset(len(valid.src), 16)
    sources = tokenizer.encode_batch([valid.src[i] for i in keep])
    hypotheses = []
    for source in sources:
        src = torch.tensor([[*source, tokenizer.eos_id]])  # sources end in EOS
        ids = model.generate(src, cfg.eval.max_len_a, cfg.eval.max_len_b)
        hypotheses.append(tokenizer.decode_batch(ids)[0])
    expected = sacrebleu.corpus_bleu(hypotheses, [[valid.tgt[i] for i in keep]]).score
    assert bleu[20] == pytest.approx(expected, abs=1e-3)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["best_valid_bleu"] == pytest.approx(max(bleu.values()), abs=1e-3)


def test_best_metric_bleu_chooses_best_pt_by_bleu_and_counts_patience_in_bleu(tmp_path):
    cfg = compose(
        *OVERRIDES,
        "trainer.valid_bleu=16",
        "trainer.best_metric=bleu",
        "trainer.max_steps=40",
        "trainer.valid_every=5",
    )
    run_dir = tmp_path / "run"
    run(cfg, run_dir)
    bleu = scalars(run_dir, "valid/bleu")
    assert len(set(bleu.values())) > 1  # BLEU moves, so the choice below says something
    best_step = checkpoint.load(run_dir / "checkpoints" / "best.pt")["state"]["step"]
    first_best = min(step for step, value in bleu.items() if value == max(bleu.values()))
    assert best_step == first_best


def test_without_valid_bleu_nothing_is_decoded_during_training(tmp_path):
    run_dir = tmp_path / "run"
    run(compose(*OVERRIDES, "trainer.max_steps=10"), run_dir)
    with pytest.raises(KeyError):
        scalars(run_dir, "valid/bleu")
    assert json.loads((run_dir / "train_summary.json").read_text())["best_valid_bleu"] is None


@pytest.mark.parametrize(
    ("overrides", "scorer", "match"),
    [
        (("trainer.best_metric=bleu",), True, "best_metric=bleu needs trainer.valid_bleu"),
        (("trainer.valid_bleu=8",), False, "valid_bleu needs a scorer"),
        (("trainer.best_metric=chrf",), True, "best_metric='chrf' must be one of"),
        (("trainer.valid_bleu=0",), True, "valid_bleu=0 must be an integer >= 1"),
    ],
)
def test_bad_settings_are_refused_in_one_line_before_training(tmp_path, overrides, scorer, match):
    cfg = compose(*OVERRIDES, *overrides)
    with pytest.raises(ValueError, match=match) as error:
        train(
            Settings.of(cfg),
            tmp_path / "run",
            scorer=(lambda *a: {"bleu": 0, "chrf": 0}) if scorer else None,
        )
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_each_validation_shows_a_few_translations_in_tensorboards_text_tab(tmp_path):
    """As fairseq users log them: the subset's first pairs, source, reference and the model's
    translation at that step."""
    run_dir = tmp_path / "run"
    run(compose(*OVERRIDES, "trainer.valid_bleu=8", "trainer.max_steps=20"), run_dir)
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("valid/examples/text_summary")
    assert [e.step for e in events] == [10, 20]
    table = events[-1].tensor_proto.string_val[0].decode()
    lines = table.splitlines()
    assert lines[0] == "source | reference | translation" and len(lines) == 2 + EXAMPLES
    assert all(line.count(" | ") == 2 for line in lines[2:])
