"""Specification of FoPE (``pe=fope``): RoPE's frequencies clipped to those whose period fits the
training length, each of the first ``min(K, D/4)`` pairs a Fourier series over the kept
frequencies, the other pairs a fixed map, as the paper's code computes it."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import Site
from posenc.model.encodings.fope import FoPEEncoding, FoPERule, kept_frequencies


def make(d_model=32, n_heads=2, **settings) -> FoPEEncoding:
    torch.manual_seed(0)
    return FoPEEncoding(Site.DECODER, d_model, n_heads, 1, **settings).double()


def rule_of(encoding: FoPEEncoding) -> FoPERule:
    torch.manual_seed(1)
    return encoding.self_rule(0).double()


def reference_mapped(rule: FoPERule, x: torch.Tensor, positions) -> torch.Tensor:
    """Token by token, head by head, pair by pair: ``C = sum_k cos(w_k t) c[h, k, p]``,
    ``S = sum_k sin(w_k t) s[h, k, p]`` for the first ``P`` pairs, ``C = S = 1`` beyond, and
    ``(x_2p, x_2p+1) -> (x_2p C - x_2p+1 S, x_2p+1 C + x_2p S)``."""
    coefficients = rule.coefficients
    cos_coef, sin_coef = coefficients.cos_coef.detach(), coefficients.sin_coef.detach()
    frequencies = coefficients.frequencies.tolist()
    outputs = cos_coef.shape[2]
    out = torch.empty_like(x)
    for t, position in enumerate(positions.tolist()):
        for h in range(x.shape[1]):
            for p in range(x.shape[-1] // 2):
                if p < outputs:
                    c = sum(
                        math.cos(w * position) * cos_coef[h, k, p]
                        for k, w in enumerate(frequencies)
                    )
                    s = sum(
                        math.sin(w * position) * sin_coef[h, k, p]
                        for k, w in enumerate(frequencies)
                    )
                else:
                    c = s = 1.0
                first, second = x[:, h, t, 2 * p], x[:, h, t, 2 * p + 1]
                out[:, h, t, 2 * p] = first * c - second * s
                out[:, h, t, 2 * p + 1] = second * c + first * s
    return out


def mapped(rule: FoPERule, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    q, _, _ = rule.prepare(x, x, None, positions)
    return q


@pytest.mark.parametrize(("d_model", "n_heads", "max_len"), [(32, 2, 256), (32, 2, 10000)])
def test_map_equals_the_fourier_series_of_the_kept_frequencies_token_by_token(
    d_model, n_heads, max_len
):
    rule = rule_of(make(d_model, n_heads, max_len=max_len))
    x = torch.randn(2, n_heads, 8, d_model // n_heads, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 17, 255, 256, 700])
    torch.testing.assert_close(mapped(rule, x, positions), reference_mapped(rule, x, positions))


def test_only_frequencies_whose_period_fits_the_training_length_are_kept():
    kept = kept_frequencies(16, 256).tolist()
    periods = [2 * math.pi * 10000 ** (2 * i / 16) for i in range(8)]
    expected = [10000 ** (-2 * i / 16) for i, period in enumerate(periods) if period <= 256]
    assert kept == pytest.approx(expected)
    assert len(kept) == 4


def test_coefficients_are_one_series_per_output_pair_capped_at_a_quarter_of_the_head_dim():
    few = rule_of(make(32, 2, max_len=256)).coefficients  # head dim 16: K = 4 = 16 / 4
    many = rule_of(make(32, 2, max_len=10000)).coefficients  # K = 7 > 4
    assert few.cos_coef.shape == (2, 4, 4)
    assert many.cos_coef.shape == (2, 7, 4)


def test_at_zero_gain_the_identity_makes_it_rope_on_kept_frequencies_and_a_fixed_map_beyond():
    rule = rule_of(make(32, 2, max_len=256, gain=0.0))  # K = P = 4 of 8 pairs
    positions = torch.arange(6)
    maps = rule.coefficients.maps(positions)  # (H, L, D/2)
    frequencies = kept_frequencies(16, 256).double()
    rope = torch.polar(torch.ones(6, 4, dtype=torch.float64), positions[:, None] * frequencies)
    torch.testing.assert_close(maps[:, :, :4], rope.expand(2, -1, -1))
    torch.testing.assert_close(maps[:, :, 4:], torch.full_like(maps[:, :, 4:], 1 + 1j))


def test_at_zero_gain_with_more_frequencies_than_outputs_the_identity_steps_over_them():
    rule = rule_of(make(32, 2, max_len=10000, gain=0.0))  # K = 7, P = 4: step 2
    cos_coef = rule.coefficients.cos_coef[0]
    expected = torch.zeros(7, 4, dtype=torch.float64)
    for i in range(4):
        expected[2 * i, i] = 1.0
    torch.testing.assert_close(cos_coef, expected)


def test_initial_noise_is_xavier_normal_of_the_gain_around_the_identity():
    torch.manual_seed(0)
    encoding = FoPEEncoding(Site.DECODER, 512, 8, 1, max_len=512, gain=0.3)  # head 64: K=P=16
    coefficients = encoding.self_rule(0).coefficients
    heads, kept, outputs = coefficients.cos_coef.shape
    noise = coefficients.cos_coef - torch.eye(kept, outputs)
    expected_std = 0.3 * math.sqrt(2 / (kept * outputs + heads * outputs))
    assert noise.std().item() == pytest.approx(expected_std, rel=0.15)
    assert abs(noise.mean().item()) < expected_std / 5


def test_the_released_default_keeps_coefficients_fixed_and_learnable_trains_them():
    fixed = make().self_rule(0)
    assert not list(fixed.parameters())
    assert set(fixed.state_dict()) == {"coefficients.cos_coef", "coefficients.sin_coef"}
    trained = make(learnable=True).self_rule(0)
    assert {name for name, _ in trained.named_parameters()} == {
        "coefficients.cos_coef",
        "coefficients.sin_coef",
    }


def test_each_layer_draws_its_own_coefficients():
    encoding = make()
    first, second = encoding.self_rule(0), encoding.self_rule(1)
    assert not torch.equal(first.coefficients.cos_coef, second.coefficients.cos_coef)


def test_scores_depend_on_the_distance_alone_only_while_the_coefficients_are_the_identity():
    q = torch.randn(1, 2, 1, 16, dtype=torch.float64)
    k = torch.randn(1, 2, 1, 16, dtype=torch.float64)

    def score(rule, i, j):
        return (mapped(rule, q, torch.tensor([i])) * mapped(rule, k, torch.tensor([j]))).sum(-1)

    identity = rule_of(make(gain=0.0))
    torch.testing.assert_close(score(identity, 3, 1), score(identity, 40, 38))
    noisy = rule_of(make(gain=0.3))
    assert not torch.allclose(score(noisy, 3, 1), score(noisy, 40, 38))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"d_model": 12, "n_heads": 4}, "head dim 3 must be even"),
        ({"max_len": 1}, "max_len=1 must be at least 2"),
        ({"max_len": 2, "base": 1e8}, "no frequency has a period within max_len=2"),
    ],
)
def test_bad_settings_are_refused_in_one_line(settings, message):
    d_model, n_heads = settings.pop("d_model", 32), settings.pop("n_heads", 2)
    with pytest.raises(ValueError, match=message):
        FoPEEncoding(Site.DECODER, d_model, n_heads, 1, **settings)
