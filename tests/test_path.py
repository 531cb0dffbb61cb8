"""PaTH (``configs/pe/path.yaml``): query ``i`` sees key ``j <= i`` through the product of the
data-dependent Householder-like matrices ``H_t = I - beta_t w_t w_t^T`` of the tokens after
``j`` up to ``i``; the encoder sees a later key through the same matrices, key side first."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.householder import L2_EPS, PathEncoding, PathRule

HEADS, HEAD_DIM, LENGTH = 2, 4, 6
D_MODEL = HEADS * HEAD_DIM


def make_rule(site: Site = Site.DECODER) -> PathRule:
    torch.manual_seed(0)
    rule = PathEncoding(site, D_MODEL, HEADS, 1, rank=3).self_rule(0).double()
    with torch.no_grad():  # weights of order 1, so that every Householder matters
        for param in rule.parameters():
            param.normal_(0.0, 0.7)
    return rule


def paper_householders(rule: PathRule, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w (B, H, L, D)`` and ``beta (B, H, L)`` token by token: the low-rank projection, the
    causal convolution over the last ``conv_size`` tokens as a loop, SiLU, unit length;
    ``beta = 2 sigmoid(W_b x + b)``."""
    b, length, d = x.shape
    pre = x @ rule.w_down.weight.T @ rule.w_up.weight.T  # (B, L, d)
    size = rule.conv_size
    w = torch.zeros(b, length, d, dtype=x.dtype)
    for t in range(length):
        for m in range(size):
            source = t - (size - 1) + m
            if source >= 0:
                w[:, t] = w[:, t] + rule.w_conv[:, 0, m] * pre[:, source]
    w = F.silu(w).view(b, length, HEADS, HEAD_DIM).transpose(1, 2)
    w = w / torch.sqrt((w * w).sum(-1, keepdim=True) + L2_EPS)
    beta = 2 * torch.sigmoid(x @ rule.beta.weight.T + rule.beta.bias).transpose(1, 2)
    return w, beta


def paper_scores(rule, x, q, k, bidirectional: bool) -> torch.Tensor:
    """``q_i^T H_i ... H_(j+1) k_j / sqrt(D)`` for ``j <= i`` (and ``k_j^T H_j ... H_(i+1) q_i
    / sqrt(D)`` for ``j > i`` when ``bidirectional``), each product a loop of ``D x D``
    matrices. Returns ``(B, H, L, L)``, 0 where the decoder may not look."""
    w, beta = paper_householders(rule, x)
    b, h, length, d = q.shape
    eye = torch.eye(d, dtype=q.dtype)
    out = torch.zeros(b, h, length, length, dtype=q.dtype)

    def householder(bi: int, hi: int, t: int) -> torch.Tensor:
        return eye - beta[bi, hi, t] * torch.outer(w[bi, hi, t], w[bi, hi, t])

    for bi in range(b):
        for hi in range(h):
            for i in range(length):
                for j in range(length):
                    product = eye
                    if j <= i:
                        for t in range(j + 1, i + 1):
                            product = householder(bi, hi, t) @ product  # H_i ... H_(j+1)
                        out[bi, hi, i, j] = q[bi, hi, i] @ product @ k[bi, hi, j]
                    elif bidirectional:
                        for t in range(i + 1, j + 1):
                            product = householder(bi, hi, t) @ product  # H_j ... H_(i+1)
                        out[bi, hi, i, j] = k[bi, hi, j] @ product @ q[bi, hi, i]
    return out / math.sqrt(d)


def inputs(seed: int = 1):
    torch.manual_seed(seed)
    x = torch.randn(2, LENGTH, D_MODEL, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, HEADS, LENGTH, HEAD_DIM, dtype=torch.float64)
    return x, q, k, v


def call_for(site: Site, length: int = LENGTH) -> AttentionCall:
    positions = torch.arange(length)
    return AttentionCall(positions, positions, causal=site is Site.DECODER)


@pytest.mark.parametrize("site", [Site.DECODER, Site.ENCODER])
def test_attention_equals_softmax_of_the_loop_reference_forward_and_backward(site):
    rule = make_rule(site)
    x, q, k, v = inputs()
    call = call_for(site)
    q2, k2, state = rule.prepare(q, k, x, call.q_pos)
    out = rule(q2, k2, v, state, call)
    scores = paper_scores(rule, x, q, k, bidirectional=site is Site.ENCODER)
    if site is Site.DECODER:
        scores = scores.masked_fill(~torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril(), -math.inf)
    ref = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rule.weights(q2, k2, state, call), torch.softmax(scores, -1))
    weight = torch.randn_like(ref)
    params = (x, q, k, *rule.parameters())
    got = torch.autograd.grad((out * weight).sum(), params)
    expected = torch.autograd.grad((ref * weight).sum(), params)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_a_cached_key_is_the_key_through_every_householder_since():
    rule = make_rule()
    x, q, k, v = inputs()
    call = call_for(Site.DECODER)
    _, _, state = rule.prepare(q, k, x, call.q_pos)
    w, beta = paper_householders(rule, x)
    _, cached = rule.attend_cached(q, k, v, state, call)
    for j in range(LENGTH):
        key = k[0, 1, j]
        for t in range(j + 1, LENGTH):
            key = key - beta[0, 1, t] * (w[0, 1, t] @ key) * w[0, 1, t]
        torch.testing.assert_close(cached[0, 1, j], key)


def test_the_logit_depends_on_the_tokens_between_query_and_key_and_on_no_others():
    """The position information is the content of the tokens in between: changing token
    ``m`` changes ``H_m`` and, through the convolution, the next ``conv_size - 1``; so the
    pairs ``j < m <= i`` move, pairs before ``m`` or with ``j >= m + conv_size - 1`` do not."""
    rule = make_rule()
    x, q, k, _ = inputs()
    m, reach = 2, rule.conv_size - 1
    changed = x.detach().clone()
    changed[:, m] += 1.0
    before = paper_scores(rule, x, q, k, bidirectional=False).detach()
    after = paper_scores(rule, changed, q, k, bidirectional=False).detach()
    moved = (before - after).abs() > 1e-9
    for i in range(LENGTH):
        for j in range(i + 1):
            expected = j < m + reach and i >= m and j < i
            assert bool(moved[0, 0, i, j]) == expected, (i, j)


def test_with_reflections_the_transform_keeps_every_key_length():
    """``beta = 2`` and unit ``w`` make each ``H_t`` a reflection, so the product is orthogonal:
    the transformed keys keep their lengths (as a rotation would), unlike ``beta`` below 2."""
    rule = make_rule()
    x, q, k, v = inputs()
    call = call_for(Site.DECODER)
    with torch.no_grad():
        rule.beta.weight.zero_()
        rule.beta.bias.fill_(50.0)  # sigmoid(50) == 1 in float64
        rule.w_conv.mul_(100.0)  # |w|^2 far above the normalisation's epsilon
        _, _, state = rule.prepare(q, k, x, call.q_pos)
        _, cached = rule.attend_cached(q, k, v, state, call)
    torch.testing.assert_close(cached.norm(dim=-1), k.detach().norm(dim=-1))
    assert not torch.allclose(cached, k.detach())
    with torch.no_grad():
        rule.beta.bias.fill_(0.0)  # beta = 1: projections, which shorten
        _, _, state = rule.prepare(q, k, x, call.q_pos)
        shorter = rule.attend_cached(q, k, v, state, call)[1].norm(dim=-1)
    assert (shorter[..., :-1] < k.detach().norm(dim=-1)[..., :-1]).all()


def test_beta_zero_is_attention_without_positions():
    rule = make_rule()
    x, q, k, v = inputs()
    call = call_for(Site.DECODER)
    with torch.no_grad():
        rule.beta.weight.zero_()
        rule.beta.bias.fill_(-800.0)  # sigmoid underflows to exactly 0
        q2, k2, state = rule.prepare(q, k, x, call.q_pos)
        out = rule(q2, k2, v, state, call)
    plain = F.scaled_dot_product_attention(q.detach(), k.detach(), v, is_causal=True)
    torch.testing.assert_close(out, plain)


def test_parameters_initialise_as_the_reference_models():
    rule = PathEncoding(Site.DECODER, 64, 4, 1).self_rule(0)
    assert rule.w_down.weight.shape == (32, 64) and rule.w_conv.shape == (64, 1, 3)
    assert rule.w_up.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert rule.beta.bias.abs().max().item() == 0.0  # beta starts at 2 sigmoid(0) = 1
