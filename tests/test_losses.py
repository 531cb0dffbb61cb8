"""One teacher-forced loss serves training, validation and evaluation: the validation loss is the
token-weighted mean of the per-sentence NLLs that evaluation reports, and both equal the NLL
the training loss computes on the same batch."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model

from posenc.data.batching import collate
from posenc.training.losses import sentence_losses, token_loss, validation_loss

SPECIALS = SimpleNamespace(pad_id=0, bos_id=1, eos_id=2)


def pairs(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    src = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 9))] for _ in range(n)]
    tgt = [[rng.randrange(3, 40) for _ in range(rng.randrange(1, 9))] for _ in range(n)]
    return src, tgt


def test_sentence_nll_sums_to_the_training_nll_and_validation_averages_it():
    model = tiny_model("rope").train()
    src, tgt = pairs(9)
    device = torch.device("cpu")
    nll, count = sentence_losses(model, SPECIALS, src, tgt, 40, device)  # several batches
    with torch.no_grad():
        model.eval()
        _, batch_nll, n = token_loss(model, collate(src, tgt, 0, 1, 2), 0, 0.1)
    assert count == [len(t) + 1 for t in tgt] and sum(count) == n  # EOS counted
    assert sum(nll) == pytest.approx(float(batch_nll), rel=1e-5)
    model.train()
    mean = validation_loss(model, src, tgt, SPECIALS, 40, device, None)
    assert mean == pytest.approx(float(batch_nll) / n, rel=1e-5)
    assert model.training  # the mode is restored
