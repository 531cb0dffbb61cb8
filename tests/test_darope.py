"""Specification of DaRoPE (``pe=darope``): RoPE's fast bands unchanged; a slow band (wavelength
above the training length ``L``) of token ``m`` turns by ``c_h(x_m) theta_j`` with
``c_h = L sigmoid(w_h . x_m + alpha_h logit(clip(m + 0.5, 0.5, L - 0.5) / L))``, per head, as
Levy et al. (2026) write it; a new model is RoPE up to an offset below ``L``."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import Site
from posenc.model.encodings.darope import DataAwareRotaryEncoding, DataAwareRotaryRule
from posenc.model.encodings.rotation import rope_frequencies, rotate, rotation_table, slow_bands

D_MODEL, HEADS, HEAD_DIM = 16, 2, 8


def rule_of(training_length: int = 12, trained: bool = True) -> DataAwareRotaryRule:
    """A decoder layer's rule in float64 (base 10 so that both kinds of band exist at short L);
    ``trained``: random ``w`` and ``alpha``, so coordinates differ by token and head."""
    torch.manual_seed(0)
    encoding = DataAwareRotaryEncoding(
        Site.DECODER, D_MODEL, HEADS, 1, base=10.0, training_length=training_length
    )
    rule = encoding.self_rule(0).double()
    if trained:
        with torch.no_grad():
            rule.coordinate.weight.normal_(0.0, 0.7)
            rule.alpha.copy_(torch.tensor([0.6, 1.8]))
    return rule


def reference_rotated(rule: DataAwareRotaryRule, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Token by token, head by head, pair by pair, from the equations."""
    big_l = rule.training_length
    weight, alpha = rule.coordinate.weight.detach(), rule.alpha.detach()
    batch, heads, length, dim = v.shape
    out = torch.empty_like(v)
    for b in range(batch):
        for h in range(heads):
            for m in range(length):
                p = min(max(m + 0.5, 0.5), big_l - 0.5) / big_l
                z = float(x[b, m] @ weight[h]) + float(alpha[h]) * math.log(p / (1 - p))
                c = big_l / (1 + math.exp(-z))
                for j in range(dim // 2):
                    theta = 10.0 ** (-2 * j / dim)
                    slow = 2 * math.pi / theta > big_l
                    angle = (c if slow else m) * theta
                    first, second = v[b, h, m, 2 * j], v[b, h, m, 2 * j + 1]
                    out[b, h, m, 2 * j] = first * math.cos(angle) - second * math.sin(angle)
                    out[b, h, m, 2 * j + 1] = second * math.cos(angle) + first * math.sin(angle)
    return out


def test_the_rotation_follows_the_equations_token_by_token_beyond_the_training_length_too():
    rule = rule_of()
    x = torch.randn(2, 15, D_MODEL, dtype=torch.float64)  # 15 tokens: 3 beyond L = 12
    q = torch.randn(2, HEADS, 15, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(2, HEADS, 15, HEAD_DIM, dtype=torch.float64)
    rotated_q, rotated_k, state = rule.prepare(q, k, x, torch.arange(15))
    assert state is None  # rotated before the cache: nothing else to keep
    torch.testing.assert_close(rotated_q, reference_rotated(rule, x, q))
    torch.testing.assert_close(rotated_k, reference_rotated(rule, x, k))


def test_a_new_model_scores_as_rope_below_the_training_length():
    """w = 0, alpha = 1: c = m + 1/2, an offset every score cancels."""
    rule = rule_of(training_length=12, trained=False)
    x = torch.randn(1, 12, D_MODEL, dtype=torch.float64)
    q = torch.randn(1, HEADS, 12, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(1, HEADS, 12, HEAD_DIM, dtype=torch.float64)
    rotated_q, rotated_k, _ = rule.prepare(q, k, x, torch.arange(12))
    rope = rotation_table(torch.arange(12), rope_frequencies(HEAD_DIM, 10.0, torch.float64))
    rope = rope.to(torch.complex128)
    expected = rotate(q, rope) @ rotate(k, rope).mT
    torch.testing.assert_close(rotated_q @ rotated_k.mT, expected)
    assert not torch.allclose(rotated_q, rotate(q, rope))  # the slow bands' half-step offset


def test_beyond_the_training_length_a_new_models_slow_bands_stop_and_the_fast_ones_turn_on():
    rule = rule_of(trained=False)
    x = torch.randn(1, 16, D_MODEL, dtype=torch.float64)
    ones = torch.ones(1, HEADS, 16, HEAD_DIM, dtype=torch.float64)
    table = rule.tables(x, torch.arange(16))  # (1, H, 16, D/2)
    slow = rule.slow
    assert slow.tolist() == [False, False, True, True]  # wavelengths 6.3, 11.2 | 19.9, 35.3
    beyond = table[..., 11:, :]  # positions 11-15: m + 0.5 clipped at L - 0.5 = 11.5
    torch.testing.assert_close(
        beyond[..., slow], beyond[..., :1, :][..., slow].expand_as(beyond[..., slow])
    )
    assert not torch.allclose(beyond[..., 1:, ~slow], beyond[..., :-1, ~slow])
    assert rule.prepare(ones, ones, x, torch.arange(16))[0].shape == ones.shape


def test_a_tokens_rotation_depends_on_its_own_input_only():
    """Unlike CARoPE's running sums: changing token 2 moves token 2 alone."""
    rule = rule_of()
    x = torch.randn(1, 5, D_MODEL, dtype=torch.float64)
    changed = x.clone()
    changed[:, 2] = torch.randn(D_MODEL, dtype=torch.float64)
    before, after = rule.tables(x, torch.arange(5)), rule.tables(changed, torch.arange(5))
    moved = ~torch.isclose(before, after).all(-1).all(1)  # (1, L): a token whose table moved
    assert moved.tolist() == [[False, False, True, False, False]]


@pytest.mark.parametrize(("length", "fast"), [(128, 11), (256, 13), (512, 16)])
def test_the_slow_bands_are_hopes_eleven_thirteen_sixteen_fast_of_thirty_two(length, fast):
    """Base 10^4 and head dim 64, as the statement of the rule counts them."""
    slow = slow_bands(rope_frequencies(64), length)
    assert int((~slow).sum()) == fast and not slow[:fast].any()


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="head dim 3 must be even"):
        DataAwareRotaryEncoding(Site.DECODER, 12, 4, 1)
    with pytest.raises(ValueError, match="training_length=0 must be a whole number"):
        DataAwareRotaryEncoding(Site.DECODER, D_MODEL, HEADS, 1, training_length=0)
    with pytest.raises(ValueError, match="no band is slow at training_length=40"):
        DataAwareRotaryEncoding(Site.DECODER, D_MODEL, HEADS, 1, base=10.0, training_length=40)
