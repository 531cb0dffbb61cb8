"""Stick-breaking attention (Tan et al. 2024): the fast rule equals explicit stick products."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.stickbreaking import StickBreakingEncoding

B, H, L, D = 2, 2, 7, 4


def build(site: str, length: int = L, padding=None, attend_current: bool = False):
    """A stick-breaking rule and a self-attention call over ``length`` tokens."""
    encoding = StickBreakingEncoding(Site(site), H * D, H, 1, attend_current=attend_current)
    pos = torch.arange(length)
    call = AttentionCall(pos, pos, site == "decoder", padding, encoding.context(pos, pos))
    return encoding.self_rule(0), call


def breaking_order(i: int, length: int, causal: bool, attend_current: bool) -> list[int]:
    """Keys in the order they break query ``i``'s stick: nearest first; in the encoder the
    earlier key first at equal distance."""
    own = [i] if attend_current else []
    if causal:
        return own + list(range(i - 1, -1, -1))
    outward = []
    for d in range(1, length):
        outward += [j for j in (i - d, i + d) if 0 <= j < length]
    return own + outward


def reference(q, k, v, causal, attend_current=False, padding=None):
    """``A_ij = beta_ij prod_{t before j in the order} (1 - beta_it)`` written as explicit
    products; the remainder ``1 - sum_j A_ij`` goes to the query's own value."""
    length = q.shape[2]
    out = []
    for b in range(q.shape[0]):
        heads = []
        for h in range(q.shape[1]):
            rows = []
            for i in range(length):
                order = [
                    j
                    for j in breaking_order(i, length, causal, attend_current)
                    if padding is None or not padding[b, j]
                ]
                beta = {j: torch.sigmoid(q[b, h, i] @ k[b, h, j] / math.sqrt(D)) for j in order}
                weights = [
                    beta[j] * math.prod((1 - beta[t] for t in order[:n]), start=torch.tensor(1.0))
                    for n, j in enumerate(order)
                ]
                mixed = sum((w * v[b, h, j] for w, j in zip(weights, order, strict=True)), 0.0)
                remainder = 1 - sum(weights, torch.tensor(0.0))
                rows.append(mixed + remainder * v[b, h, i])
            heads.append(torch.stack(rows))
        out.append(torch.stack(heads))
    return torch.stack(out)


def qkv(length: int = L, scale: float = 1.0):
    return [(scale * torch.randn(B, H, length, D)).requires_grad_() for _ in range(3)]


def assert_same_forward_and_grads(out, ref, inputs):
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), inputs)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attend_current", [False, True])
def test_decoder_matches_explicit_stick_products(attend_current):
    rule, call = build("decoder", attend_current=attend_current)
    q, k, v = qkv(scale=2.0)
    out = rule(q, k, v, None, call)
    assert_same_forward_and_grads(out, reference(q, k, v, True, attend_current), (q, k, v))


@pytest.mark.parametrize("attend_current", [False, True])
def test_encoder_breaks_one_stick_outward_with_padding(attend_current):
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[1, 4:] = True
    rule, call = build("encoder", padding=padding, attend_current=attend_current)
    q, k, v = qkv(scale=2.0)
    out = rule(q, k, v, None, call)
    ref = reference(q, k, v, False, attend_current, padding)
    assert_same_forward_and_grads(out, ref, (q, k, v))


@pytest.mark.parametrize("site", ["encoder", "decoder"])
def test_weights_are_a_distribution_that_reproduces_the_output(site):
    rule, call = build(site, length=12)
    q, k, v = qkv(12, scale=3.0)
    with torch.no_grad():
        weights = rule.weights(q, k, None, call)
        out = rule(q, k, v, None, call)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, 12))
    stick = weights * (1 - torch.eye(12))  # without the remainder on the query's own key
    assert (stick.sum(-1) <= 1 + 1e-6).all()
    torch.testing.assert_close(weights @ v, out)
    if site == "decoder":
        assert torch.all(weights.triu(1) == 0)
        torch.testing.assert_close(weights[..., 0, 0], torch.ones(B, H))  # nothing to break


def test_the_decoder_never_looks_ahead():
    rule, call = build("decoder", length=9)
    q, k, v = qkv(9)
    out = rule(q, k, v, None, call)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 6:] = torch.randn(B, H, 3, D)
    v2[:, :, 6:] = torch.randn(B, H, 3, D)
    torch.testing.assert_close(rule(q, k2, v2, None, call)[:, :, :6], out[:, :, :6])
    grad_k, grad_v = torch.autograd.grad(out[:, :, 3].sum(), (k, v))
    assert torch.all(grad_k[:, :, 4:] == 0) and torch.all(grad_v[:, :, 4:] == 0)


def test_equal_logits_give_geometric_recency_and_a_direction_in_the_encoder():
    """With q.k = 0 every beta is 1/2: the d-th key in breaking order gets 2^-d."""
    q = torch.zeros(1, 1, 5, D)
    k = torch.randn(1, 1, 5, D)
    decoder, decoder_call = build("decoder", length=5)
    encoder, encoder_call = build("encoder", length=5)
    dec = decoder.weights(q, k, None, decoder_call)[0, 0]
    torch.testing.assert_close(dec[4], torch.tensor([1 / 16, 1 / 8, 1 / 4, 1 / 2, 1 / 16]))
    enc = encoder.weights(q, k, None, encoder_call)[0, 0]
    # query 2 breaks 1, 3, 0, 4: the left neighbour first, so direction is visible
    torch.testing.assert_close(enc[2], torch.tensor([1 / 8, 1 / 2, 1 / 16, 1 / 4, 1 / 16]))


def test_a_single_cached_query_matches_the_last_row_of_the_full_pass():
    encoding = StickBreakingEncoding(Site.DECODER, H * D, H, 1)
    rule = encoding.self_rule(0)
    q, k, v = qkv()
    pos = torch.arange(L)
    full = rule(q, k, v, None, AttentionCall(pos, pos, True, context=encoding.context(pos, pos)))
    last = pos[-1:]
    step_call = AttentionCall(last, pos, True, context=encoding.context(last, pos))
    torch.testing.assert_close(rule(q[:, :, -1:], k, v, None, step_call), full[:, :, -1:])


def test_large_logits_stay_finite_and_match_float64_products():
    rule, call = build("decoder", length=10)
    q, k, v = qkv(10, scale=6.0)  # |z| up to ~100: sigmoid saturates in float32
    out = rule(q, k, v, None, call)
    ref = reference(q.double(), k.double(), v.double(), causal=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


def test_bf16_autocast_computes_the_stick_in_float32():
    rule, call = build("decoder", length=12)
    q, k, v = (x.detach().bfloat16() for x in qkv(12))
    with torch.no_grad():
        exact = rule.weights(q.float(), k.float(), None, call)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            weights = rule.weights(q, k, None, call)
    torch.testing.assert_close(weights.float(), exact, atol=4e-3, rtol=1e-2)  # bf16 output only


def test_cross_attention_is_plain_softmax():
    encoding = StickBreakingEncoding(Site.DECODER, H * D, H, 2)
    assert type(encoding.cross_rule(1)) is AttentionRule
    assert not list(encoding.parameters())
