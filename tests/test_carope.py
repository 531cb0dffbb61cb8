"""Specification of CARoPE (``pe=carope``): pair ``i`` of q and k of token ``m`` rotated by the
cumulative sum over tokens up to ``m`` of a per-head step ``f(x_t) = 1 / (softplus(x_t W) + 1)``
raised to the power ``i``, as the paper writes it."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.carope import ContextRotaryEncoding, ContextRotaryRule
from posenc.model.encodings.rotation import rope_frequencies, rotate, rotation_table


def rule_of(rope_init=True, d_model=16, n_heads=2) -> ContextRotaryRule:
    torch.manual_seed(0)
    encoding = ContextRotaryEncoding(Site.DECODER, d_model, n_heads, 1, rope_init=rope_init)
    rule = encoding.self_rule(0).double()
    with torch.no_grad():  # a trained-looking projection, so steps differ by token
        rule.step.weight.normal_(0.0, 0.5)
    return rule


def call_for(length: int) -> AttentionCall:
    positions = torch.arange(length)
    return AttentionCall(q_pos=positions, k_pos=positions, causal=True)


def reference_rotated(rule: ContextRotaryRule, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Token by token, head by head, pair by pair: ``f = 1 / (softplus(x_t . w_h + b_h) + 1)``,
    ``phi_i(m) = sum_{t <= m} f_t^i``, ``(v_2i, v_2i+1)`` turned by ``phi_i(m)``."""
    weight = rule.step.weight.detach()
    bias = rule.step.bias.detach() if rule.step.bias is not None else torch.zeros(weight.shape[0])
    batch, heads, length, dim = v.shape
    out = torch.empty_like(v)
    for b in range(batch):
        for h in range(heads):
            steps = [
                1.0 / (math.log1p(math.exp(float(x[b, t] @ weight[h] + bias[h]))) + 1.0)
                for t in range(length)
            ]
            for m in range(length):
                for i in range(dim // 2):
                    phase = sum(steps[t] ** i for t in range(m + 1))
                    c, s = math.cos(phase), math.sin(phase)
                    first, second = v[b, h, m, 2 * i], v[b, h, m, 2 * i + 1]
                    out[b, h, m, 2 * i] = first * c - second * s
                    out[b, h, m, 2 * i + 1] = second * c + first * s
    return out


@pytest.mark.parametrize("rope_init", [True, False])
def test_rotation_follows_the_cumulative_token_steps_token_by_token(rope_init):
    rule = rule_of(rope_init)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    q = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    _, _, steps = rule.prepare(q, q, x, torch.arange(6))
    rotated_q, _ = rule.rotated(q, q, steps, call_for(6))
    torch.testing.assert_close(rotated_q, reference_rotated(rule, x, q))


def test_a_new_model_is_rope_exactly():
    torch.manual_seed(0)
    rule = ContextRotaryEncoding(Site.DECODER, 16, 2, 1).self_rule(0).double()
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    _, _, steps = rule.prepare(q, q, x, torch.arange(5))
    torch.testing.assert_close(steps, torch.full_like(steps, 10000 ** (-2 / 8)))
    rotated_q, _ = rule.rotated(q, q, steps, call_for(5))
    rope = rotation_table(torch.arange(1, 6), rope_frequencies(8).double())
    torch.testing.assert_close(rotated_q, rotate(q, rope.to(torch.complex128)))


def test_scores_depend_on_the_tokens_in_between_not_on_the_distance_alone():
    rule = rule_of()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    same = torch.randn(1, 2, 1, 8, dtype=torch.float64).expand(-1, -1, 6, -1)  # q = k everywhere

    def scores(inputs):
        _, _, steps = rule.prepare(same, same, inputs, torch.arange(6))
        q, k = rule.rotated(same, same, steps, call_for(6))
        return q @ k.mT

    changed = x.clone()
    changed[:, 2] = torch.randn(16, dtype=torch.float64)
    before, after = scores(x), scores(changed)
    torch.testing.assert_close(before[..., 1, 0], after[..., 1, 0])  # token 2 is not between
    assert not torch.allclose(before[..., 4, 0], after[..., 4, 0])  # token 2 is between


def test_the_papers_bare_form_has_no_bias_a_small_projection_and_steps_in_zero_one():
    torch.manual_seed(0)
    rule = ContextRotaryEncoding(Site.DECODER, 256, 4, 1, rope_init=False).self_rule(0)
    assert rule.step.bias is None
    assert rule.step.weight.std().item() == pytest.approx(0.02, rel=0.1)
    x = torch.randn(1, 7, 256)
    _, _, steps = rule.prepare(x, x, x, torch.arange(7))
    assert ((steps > 0) & (steps < 1)).all()
    assert steps.unique().numel() > 1


def test_an_odd_head_dim_is_refused_in_one_line():
    with pytest.raises(ValueError, match="head dim 3 must be even"):
        ContextRotaryEncoding(Site.DECODER, 12, 4, 1)
