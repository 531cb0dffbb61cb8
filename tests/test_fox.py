"""Forgetting Transformer forget gates (``pe=fox``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.fox import ForgetGateRule, ForgettingEncoding


def fox_reference(q, k, v, x, gate, call, bidirectional):
    """FoX attention from the gates themselves, one query and one key at a time.

    ``e_ij = q_i . k_j / sqrt(D) + log prod_{l=j+1..i} f_l`` with ``f_l = sigmoid(w . x_l + b)``
    per head; the encoder form multiplies the gates between the two tokens whichever comes first.
    """
    batch, heads, lq, dim = q.shape
    gates = torch.sigmoid(x @ gate.weight.T + gate.bias)  # (B, L, H)
    rows = []
    for b in range(batch):
        for h in range(heads):
            for i in range(lq):
                qi = int(call.q_pos[i])
                logits = []
                for j in range(k.shape[2]):
                    kj = int(call.k_pos[j])
                    padded = call.key_padding_mask is not None and bool(call.key_padding_mask[b, j])
                    if padded or (not bidirectional and kj > qi):
                        logits.append(torch.tensor(float("-inf")))
                        continue
                    first, last = min(qi, kj), max(qi, kj)
                    decay = torch.ones(())
                    for l in range(first + 1, last + 1):
                        decay = decay * gates[b, l, h]
                    logits.append(q[b, h, i] @ k[b, h, j] / math.sqrt(dim) + torch.log(decay))
                weights = torch.softmax(torch.stack(logits), dim=0)
                rows.append(weights @ v[b, h])
    return torch.stack(rows).view(batch, heads, lq, dim)


def make_rule(bidirectional: bool, d_model: int = 6, heads: int = 2) -> ForgetGateRule:
    torch.manual_seed(1)
    rule = ForgetGateRule(d_model, heads, bidirectional, init_std=0.5)
    with torch.no_grad():
        rule.gate.bias.normal_()  # spread the gates away from 1/2
    return rule


def test_gates_initialise_as_in_the_reference_repo():
    rule = ForgettingEncoding(Site.DECODER, 256, 8, 1).self_rule(0)
    assert rule.gate.weight.shape == (8, 256)
    assert torch.count_nonzero(rule.gate.bias) == 0
    assert abs(rule.gate.weight.std().item() - 0.02) < 0.002
    model = tiny_model("fox")  # nn.Transformer's Xavier pass must not overwrite the gates
    gate = model.decoder.layers[1].self_attn.rule.gate
    assert torch.count_nonzero(gate.bias) == 0 and gate.weight.std() < 0.03


def test_only_self_attention_has_gates():
    model = tiny_model("fox")
    assert model.encoder.layers[0].self_attn.rule.bidirectional is True
    assert model.decoder.layers[0].self_attn.rule.bidirectional is False
    assert type(model.decoder.layers[0].cross_attn.rule) is AttentionRule


@pytest.mark.parametrize(
    ("bidirectional", "q_pos", "k_pos"),
    [
        (False, torch.arange(7), torch.arange(7)),
        (False, torch.tensor([6]), torch.arange(7)),  # cached decoding: newest token only
        (False, torch.arange(4, 7), torch.arange(7)),  # a block of new tokens after a cache
        (True, torch.arange(7), torch.arange(7)),
    ],
)
def test_forward_and_gradients_match_the_explicit_product_of_gates(bidirectional, q_pos, k_pos):
    rule = make_rule(bidirectional)
    padding = torch.tensor([[False] * 7, [False] * 5 + [True] * 2]) if bidirectional else None
    call = AttentionCall(q_pos, k_pos, not bidirectional, padding)
    x = torch.randn(2, 7, 6, requires_grad=True)
    q = torch.randn(2, 2, len(q_pos), 4, requires_grad=True)
    k = torch.randn(2, 2, 7, 4, requires_grad=True)
    v = torch.randn(2, 2, 7, 4, requires_grad=True)
    _, _, log_f = rule.prepare(q, k, x, k_pos)
    fast = rule(q, k, v, log_f, call)
    slow = fox_reference(q, k, v, x, rule.gate, call, bidirectional)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(rule.weights(q, k, log_f, call) @ v, slow)
    probe = torch.randn_like(fast)
    inputs = (q, k, v, x, rule.gate.weight, rule.gate.bias)
    for g_fast, g_slow in zip(
        torch.autograd.grad((fast * probe).sum(), inputs),
        torch.autograd.grad((slow * probe).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_slow)


def test_encoder_bias_is_the_causal_bias_mirrored():
    """On j <= i the encoder bias is the paper's c_i - c_j; it is symmetric in i and j."""
    pos = torch.arange(6)
    x = torch.randn(2, 6, 6)
    causal, encoder = make_rule(False), make_rule(True)
    _, _, log_f = causal.prepare(None, None, x, pos)
    dec = causal.bias(None, None, log_f, AttentionCall(pos, pos, True))
    enc = encoder.bias(None, None, log_f, AttentionCall(pos, pos, False))
    lower = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(enc[..., lower], dec[..., lower])
    torch.testing.assert_close(enc, enc.transpose(-1, -2))
    cumulative = log_f.cumsum(-1)
    torch.testing.assert_close(dec[..., 4, 1], cumulative[..., 4] - cumulative[..., 1])
    torch.testing.assert_close(dec[..., 4, 1], log_f[..., 2:5].sum(-1))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gates_of_one_give_plain_softmax_attention(bidirectional):
    rule = make_rule(bidirectional)
    with torch.no_grad():
        rule.gate.weight.zero_()
        rule.gate.bias.fill_(1e4)
    pos = torch.arange(7)
    call = AttentionCall(pos, pos, not bidirectional)
    q, k, v = torch.randn(3, 2, 2, 7, 4).unbind(0)
    _, _, log_f = rule.prepare(q, k, torch.randn(2, 7, 6), pos)
    assert torch.count_nonzero(log_f) == 0
    torch.testing.assert_close(rule(q, k, v, log_f, call), AttentionRule()(q, k, v, None, call))


def test_the_decoder_never_sees_a_later_token_or_its_gate():
    rule = make_rule(False)
    pos = torch.arange(8)
    call = AttentionCall(pos, pos, True)
    x, q, k, v = torch.randn(2, 8, 6), *torch.randn(3, 2, 2, 8, 4).unbind(0)
    x2, q2, k2, v2 = (t.clone() for t in (x, q, k, v))
    x2[:, 5:] += 3.0
    for t in (q2, k2, v2):
        t[:, :, 5:] = torch.randn(2, 2, 3, 4)
    out = rule(q, k, v, rule.prepare(q, k, x, pos)[2], call)
    out2 = rule(q2, k2, v2, rule.prepare(q2, k2, x2, pos)[2], call)
    torch.testing.assert_close(out[:, :, :5], out2[:, :, :5])


def test_cached_steps_equal_the_full_pass():
    """Gates of new tokens are prepared per step and concatenated, as the k/v cache does."""
    rule = make_rule(False)
    pos = torch.arange(6)
    x, (q, k, v) = torch.randn(2, 6, 6), torch.randn(3, 2, 2, 6, 4).unbind(0)
    full = rule(q, k, v, rule.prepare(q, k, x, pos)[2], AttentionCall(pos, pos, True))
    states = []
    for t in range(6):
        states.append(rule.prepare(q, k, x[:, t : t + 1], pos[t : t + 1])[2])
        step = AttentionCall(pos[t : t + 1], pos[: t + 1], True)
        out = rule(
            q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], torch.cat(states, -1), step
        )
        torch.testing.assert_close(out, full[:, :, t : t + 1])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gates_and_bias_stay_float32_under_bf16_autocast(bidirectional):
    """At 300 tokens the cumulative log gates reach about -200, where bf16 rounds to steps of 1:
    the output must still be the float32 computation on the bf16 q, k, v."""
    rule = make_rule(bidirectional, d_model=8, heads=1)
    with torch.no_grad():
        rule.gate.bias.fill_(0.0)
    pos = torch.arange(300)
    call = AttentionCall(pos, pos, not bidirectional)
    x = torch.randn(1, 300, 8)
    q, k, v = (t.bfloat16() for t in torch.randn(3, 1, 1, 300, 8).unbind(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, _, log_f = rule.prepare(q, k, x, pos)
        out = rule(q, k, v, log_f, call)
    assert log_f.dtype == torch.float32 and out.dtype == torch.bfloat16
    _, _, log_f32 = rule.prepare(q, k, x, pos)
    expected = rule(q.float(), k.float(), v.float(), log_f32, call)
    assert log_f32.cumsum(-1).min() < -150
    torch.testing.assert_close(log_f, log_f32)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
