"""CoPE (Golovneva et al. 2024): the fast rule equals the paper's formula written with loops."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.cope import CoPEEncoding

B, H, L, D = 2, 2, 6, 4


def build(site: str, npos: int, length: int = L, padding: torch.Tensor | None = None):
    """A one-layer CoPE stack with a random table, its rule, and a call over ``length`` tokens."""
    encoding = CoPEEncoding(Site(site), d_model=H * D, n_heads=H, n_layers=1, npos=npos)
    rule = encoding.self_rule(0)
    with torch.no_grad():
        rule.pos_emb.normal_()
    pos = torch.arange(length)
    call = AttentionCall(
        pos, pos, site == "decoder", key_padding_mask=padding, context=encoding.context(pos, pos)
    )
    return rule, call


def reference(q, k, v, table, npos, causal, padding=None):
    """The paper's formula, one (batch, head, query) at a time: explicit gate sums and explicit
    interpolation between the vectors e[floor p] and e[ceil p]. In the encoder, keys after the
    query count from the query forward and read the second half of ``table``."""
    rows = []
    for b in range(q.shape[0]):
        heads = []
        for h in range(q.shape[1]):
            outs = []
            for i in range(q.shape[2]):
                keys = [
                    j
                    for j in range(k.shape[2])
                    if (not causal or j <= i) and (padding is None or not padding[b, j])
                ]
                qi = q[b, h, i]
                gate = {t: torch.sigmoid(qi @ k[b, h, t] / math.sqrt(D)) for t in keys}
                logits = []
                for j in keys:
                    lo, hi = min(i, j), max(i, j)
                    p = sum(gate[t] for t in keys if lo <= t <= hi).clamp(max=npos - 1)
                    e = table[:npos] if j <= i else table[npos:]
                    fl, ce = int(p.floor()), int(p.ceil())
                    e_p = (p - fl) * e[ce] + (1 - p + fl) * e[fl]
                    logits.append((qi @ k[b, h, j] + qi @ e_p) / math.sqrt(D))
                attn = torch.softmax(torch.stack(logits), dim=0)
                outs.append(sum(a * v[b, h, j] for a, j in zip(attn, keys, strict=True)))
            heads.append(torch.stack(outs))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def qkv(length: int = L, scale: float = 1.0):
    return [(scale * torch.randn(B, H, length, D)).requires_grad_() for _ in range(3)]


def assert_same_forward_and_grads(rule, call, q, k, v, padding, causal):
    """Forward and gradients (w.r.t. q, k, v and the table) of ``rule`` equal the reference."""
    out = rule(q, k, v, None, call)
    ref = reference(q, k, v, rule.pos_emb, rule.npos, causal, padding)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    weight = torch.randn_like(out)
    inputs = (q, k, v, rule.pos_emb)
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    ref_grads = torch.autograd.grad((ref * weight).sum(), inputs)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_decoder_matches_the_papers_formula_forward_and_gradients():
    rule, call = build("decoder", npos=3)  # gates sum past 2 within 6 keys: the clamp is hit
    q, k, v = qkv()
    assert_same_forward_and_grads(rule, call, q, k, v, None, causal=True)


def test_encoder_matches_the_two_sided_formula_with_padding():
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[1, 4:] = True
    rule, call = build("encoder", npos=3, padding=padding)
    q, k, v = qkv()
    assert_same_forward_and_grads(rule, call, q, k, v, padding, causal=False)


def test_positions_count_gates_back_from_the_query_and_stop_at_npos_minus_1():
    npos = 8
    rule, call = build("decoder", npos=npos, length=40)
    q, k, _ = qkv(40)
    with torch.no_grad():
        p = rule.positions(q, k, call)
        gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(D)).tril()
    unclamped = gates.flip(-1).cumsum(-1).flip(-1)  # sum_{t=j..i} g_it
    torch.testing.assert_close(p, unclamped.clamp(max=npos - 1))
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    assert torch.all(p[..., :, :-1] >= p[..., :, 1:])  # non-increasing in j, exactly
    assert torch.all(p[..., ~causal] == 0)
    assert p.max() == npos - 1 and (p == npos - 1).any()  # the clamp is reached
    diagonal = p.diagonal(dim1=-2, dim2=-1)
    torch.testing.assert_close(diagonal, gates.diagonal(dim1=-2, dim2=-1))  # p_ii = g_ii


def test_the_encoder_counts_outward_from_the_query_on_both_sides():
    length = 9
    decoder_rule, decoder_call = build("decoder", npos=64, length=length)
    rule, call = build("encoder", npos=64, length=length)
    q, k, _ = qkv(length)
    with torch.no_grad():
        p = rule.positions(q, k, call)
        causal_p = decoder_rule.positions(q, k, decoder_call)
        gates = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(D))
    before = torch.ones(length, length, dtype=torch.bool).tril()
    # keys at or before the query: exactly the paper's causal count
    torch.testing.assert_close(p[..., before], causal_p[..., before])
    # keys after it: sum_{t=i..j} g_it
    forward_count = gates.triu().cumsum(-1)
    torch.testing.assert_close(p[..., ~before], forward_count[..., ~before])


def test_keys_after_the_query_read_their_own_table():
    rule, call = build("encoder", npos=16)
    q, k, _ = qkv()
    with torch.no_grad():
        base = rule.weights(q, k, None, call)
        rule.pos_emb[16:].normal_()  # change only the "after" table
        ratio = rule.weights(q, k, None, call) / base
    before = torch.ones(L, L, dtype=torch.bool).tril()
    # logits of keys at or before the query are unchanged: their weights only renormalise
    row_factor = ratio[..., :1].expand_as(ratio)
    torch.testing.assert_close(ratio[..., before], row_factor[..., before])
    assert not torch.allclose(ratio[..., ~before], row_factor[..., ~before])


def test_with_a_zero_table_cope_is_plain_softmax_attention():
    for site in ("encoder", "decoder"):
        rule, call = build(site, npos=8)
        with torch.no_grad():
            rule.reset_parameters()
        q, k, v = qkv()
        plain = AttentionRule()(q, k, v, None, call)
        torch.testing.assert_close(rule(q, k, v, None, call), plain, atol=1e-6, rtol=1e-5)


def test_the_decoder_never_looks_ahead():
    rule, call = build("decoder", npos=4, length=8)
    q, k, v = qkv(8)
    out = rule(q, k, v, None, call)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 5:] = torch.randn(B, H, 3, D)
    v2[:, :, 5:] = torch.randn(B, H, 3, D)
    torch.testing.assert_close(rule(q, k2, v2, None, call)[:, :, :5], out[:, :, :5])
    grad_k, grad_v = torch.autograd.grad(out[:, :, 2].sum(), (k, v))
    assert torch.all(grad_k[:, :, 3:] == 0) and torch.all(grad_v[:, :, 3:] == 0)


def test_a_single_cached_query_matches_the_last_row_of_the_full_pass():
    encoding = CoPEEncoding(Site.DECODER, d_model=H * D, n_heads=H, n_layers=1, npos=4)
    rule = encoding.self_rule(0)
    with torch.no_grad():
        rule.pos_emb.normal_()
    q, k, v = qkv()
    pos = torch.arange(L)
    full = rule(q, k, v, None, AttentionCall(pos, pos, True, context=encoding.context(pos, pos)))
    last = pos[-1:]
    step = rule(
        q[:, :, -1:],
        k,
        v,
        None,
        AttentionCall(last, pos, True, context=encoding.context(last, pos)),
    )
    torch.testing.assert_close(step, full[:, :, -1:])


def test_padding_keys_contribute_no_gates():
    padding = torch.zeros(B, L + 3, dtype=torch.bool)
    padding[:, L:] = True
    rule, short_call = build("encoder", npos=4)
    pos = torch.arange(L + 3)
    encoding = CoPEEncoding(Site.ENCODER, d_model=H * D, n_heads=H, n_layers=1, npos=4)
    long_call = AttentionCall(pos, pos, False, padding, context=encoding.context(pos, pos))
    q, k, v = qkv(L + 3, scale=3.0)
    short = rule(q[:, :, :L], k[:, :, :L], v[:, :, :L], None, short_call)
    long = rule(q, k, v, None, long_call)
    torch.testing.assert_close(long[:, :, :L], short)
    p = rule.positions(q, k, long_call)
    torch.testing.assert_close(
        p[:, :, :L, :L], rule.positions(q[:, :, :L], k[:, :, :L], short_call)
    )


@pytest.mark.parametrize("site", ["encoder", "decoder"])
def test_bf16_autocast_keeps_gates_and_positions_in_float32(site):
    rule, call = build(site, npos=4, length=12)
    q, k, v = (x.detach().bfloat16() for x in qkv(12))
    with torch.no_grad():
        exact = rule.positions(q.float(), k.float(), call)
        full = rule(q.float(), k.float(), v.float(), None, call)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            positions = rule.positions(q, k, call)
            out = rule(q, k, v, None, call)
    assert positions.dtype == torch.float32
    torch.testing.assert_close(positions, exact)
    torch.testing.assert_close(out.float(), full, atol=0.03, rtol=0.03)


def test_cross_attention_is_plain_softmax_and_tables_are_per_layer():
    encoding = CoPEEncoding(Site.DECODER, d_model=H * D, n_heads=H, n_layers=3, npos=10)
    assert type(encoding.cross_rule(0)) is AttentionRule
    tables = {id(encoding.self_rule(i).pos_emb) for i in range(3)}
    assert len(tables) == 3
    assert encoding.self_rule(0).pos_emb.shape == (10, D)  # one table shared by the heads
    encoder = CoPEEncoding(Site.ENCODER, d_model=H * D, n_heads=H, n_layers=1, npos=10)
    assert encoder.self_rule(0).pos_emb.shape == (20, D)  # before / after the query
