"""posenc's dropout: the same distribution as ``nn.Dropout`` (each element kept with probability
``1 - p``, kept ones scaled so the expectation is the input), reproducible from torch's seed,
with a cheaper mask on CPU."""

from __future__ import annotations

import pytest
import torch

from posenc.model.dropout import Dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_each_element_is_kept_with_probability_one_minus_p_and_the_mean_is_kept(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = Dropout(p).train()(x)
    kept = (y != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 5 * (p * (1 - p) / x.numel()) ** 0.5 + 2e-5
    assert torch.all((y == 0) | torch.isclose(y, torch.full_like(y, 1 / (1 - p)), rtol=1e-4))
    assert abs(y.mean().item() - 1) < 0.01


def test_the_mask_is_uniform_over_positions_and_draws():
    """Each 16-bit uniform comes from a quarter of a 64-bit draw: no quarter is biased."""
    torch.manual_seed(1)
    keep, _ = keep_mask(torch.Size([4, 250_000]), 0.5)
    rates = keep.view(4, -1, 4).float().mean(dim=(0, 1))  # by position within a draw
    assert torch.all((rates - 0.5).abs() < 0.005)


def test_the_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 32, requires_grad=True)
    y = Dropout(0.2).train()(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    kept = y != 0
    assert torch.allclose(grad, kept.float() / (1 - round(0.2 * 65536) / 65536))
    assert torch.allclose(y[kept], x[kept] * grad[kept])


def test_evaluation_mode_and_p_zero_pass_the_input_through():
    x = torch.randn(8, 8)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0).train()(x) is x


def test_the_same_seed_gives_the_same_mask():
    x = torch.ones(100, 100)
    torch.manual_seed(5)
    first = Dropout(0.1).train()(x)
    torch.manual_seed(5)
    assert torch.equal(first, Dropout(0.1).train()(x))


def test_a_probability_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="must be in"):
        Dropout(1.0)
