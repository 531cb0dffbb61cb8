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
from posenc.training.losses import (
    SmoothedCrossEntropy,
    sentence_losses,
    summed_losses,
    validation_loss,
)

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
        batch = collate(src, tgt, 0, 1, 2)
        _, batch_nll = summed_losses(model, batch, 0, 0.1)
        n = int(batch[2].ne(0).sum())
    assert count == [len(t) + 1 for t in tgt] and sum(count) == n  # EOS counted
    assert sum(nll) == pytest.approx(float(batch_nll), rel=1e-5)
    model.train()
    mean, sentences, tokens = validation_loss(model, src, tgt, SPECIALS, 40, device, None)
    assert mean == pytest.approx(float(batch_nll) / n, rel=1e-5)
    assert (sentences, tokens) == (nll, count)
    assert model.training  # the mode is restored


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_the_training_loss_is_pytorchs_label_smoothed_cross_entropy(smoothing):
    """One log-softmax gives both numbers; they equal F.cross_entropy's, padding excluded, and
    so do their gradients."""
    model = tiny_model("sinpe").train()
    src, tgt_in, tgt_out = collate(*pairs(6, seed=3), 0, 1, 2)
    torch.manual_seed(0)
    loss, nll = summed_losses(model, (src, tgt_in, tgt_out), 0, smoothing)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    logits = model(src, tgt_in).float().view(-1, model.output.out_features)
    gold = tgt_out.view(-1)
    expected = torch.nn.functional.cross_entropy(
        logits, gold, ignore_index=0, label_smoothing=smoothing, reduction="sum"
    )
    expected_nll = torch.nn.functional.cross_entropy(logits, gold, ignore_index=0, reduction="sum")
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(nll) == pytest.approx(float(expected_nll), rel=1e-5)
    for got, want in zip(
        grads, torch.autograd.grad(expected, list(model.parameters())), strict=True
    ):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)


def test_rows_left_out_get_a_zero_gradient_even_when_their_logits_are_not_finite():
    """Padding positions are not scored, so nothing computed there may reach the weights: a
    NaN or infinite logit on a padding row leaves the loss and every gradient finite."""
    logits = torch.randn(4, 7)
    logits[2], logits[3, 4] = float("nan"), float("inf")
    logits.requires_grad_()
    gold = torch.tensor([1, 2, 0, 0])
    real = torch.tensor([True, True, False, False])
    loss, nll = SmoothedCrossEntropy.apply(logits, gold, real, 0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    assert loss.isfinite() and nll.isfinite()
    assert grad.isfinite().all() and not grad[2:].any() and grad[:2].abs().sum() > 0
