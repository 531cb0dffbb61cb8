"""Learned attention sinks (``pe.sinks=true``, :mod:`posenc.model.sinks`): a logit per head joins
every softmax, so with scores ``s_j`` and the head's sink ``c`` the weights are ``exp(s_j) /
(sum_k exp(s_k) + exp(c))`` (gpt-oss's sinks, x-transformers' ``head_learned_sink``). Checked
against that formula written out query by query, and through cached decoding."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from test_every_encoding import _decode_in_chunks

from posenc.model.encodings.base import AttentionCall, AttentionRule
from posenc.model.sinks import SinkRule


class Slope(AttentionRule):
    """A bias rule: ALiBi's shape with one slope, so the sink meets a bias too."""

    def bias(self, q, k, key_state, call):
        distance = (call.q_pos[:, None] - call.k_pos[None, :]).abs().to(q.dtype)
        return -0.3 * distance[None, None]


def reference(q, k, v, sink, bias, allowed):
    """The formula, one query at a time, in float64."""
    batch, heads, lq, dim = q.shape
    out = torch.zeros(batch, heads, lq, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for i in range(lq):
                logits = [
                    float(q[b, h, i] @ k[b, h, j]) / math.sqrt(dim) + float(bias[0, 0, i, j])
                    for j in range(k.shape[2])
                ]
                kept = [j for j in range(k.shape[2]) if allowed[b, i, j]]
                total = sum(math.exp(logits[j]) for j in kept) + math.exp(float(sink[h]))
                for j in kept:
                    out[b, h, i] += math.exp(logits[j]) / total * v[b, h, j].double()
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_the_sink_joins_the_softmax_as_its_formula_says(causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    positions = torch.arange(5)
    call = AttentionCall(q_pos=positions, k_pos=positions, causal=causal, key_padding_mask=padding)
    rule = SinkRule(Slope(), 3).double()
    with torch.no_grad():
        rule.logit.copy_(torch.tensor([-1.0, 0.5, 2.0]))
    allowed = ~padding[:, None, :].expand(2, 5, 5)
    if causal:
        allowed = allowed & torch.ones(5, 5, dtype=torch.bool).tril()
    bias = Slope().bias(q, k, None, call)
    expected = reference(q, k, v, rule.logit.detach(), bias, allowed)
    torch.testing.assert_close(rule(q, k, v, None, call), expected)
    weights = rule.weights(q, k, None, call)
    torch.testing.assert_close(weights @ v, expected)
    assert bool((weights.sum(-1) < 1).all())  # the sink takes its share: a head may look away


def test_a_sink_far_below_the_scores_is_plain_attention_and_far_above_attends_to_nothing():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    call = AttentionCall(q_pos=torch.arange(4), k_pos=torch.arange(4), causal=False)
    rule = SinkRule(AttentionRule(), 2)
    with torch.no_grad():
        rule.logit.fill_(-60.0)
        torch.testing.assert_close(rule(q, k, v, None, call), AttentionRule()(q, k, v, None, call))
        rule.logit.fill_(60.0)
        assert rule(q, k, v, None, call).abs().max() < 1e-12


@pytest.mark.parametrize("name", ["nonepe", "rope", "alibi", "t5"])
def test_cached_decoding_with_sinks_equals_teacher_forcing(name):
    model = tiny_model(name, sinks=True).eval()
    with torch.no_grad():
        for rule in model.modules():
            if isinstance(rule, SinkRule):
                rule.logit.add_(torch.linspace(-1.0, 1.0, 4))  # away from their initial 0
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 9))
    src[1, 5:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        chunked = _decode_in_chunks(model, src, tgt, (1, 3, 5))
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-4)
    sinks = [m for m in model.modules() if isinstance(m, SinkRule)]
    assert len(sinks) == 6  # encoder self, decoder self and cross: 2 layers each


def test_an_encoding_that_computes_attention_its_own_way_is_refused():
    with pytest.raises(ValueError, match=r"pe=rpe: pe.sinks=true joins the default softmax"):
        tiny_model("rpe", sinks=True)
    with pytest.raises(ValueError, match=r"pe.sinks='yes' must be true, false or null"):
        tiny_model("rope", sinks="yes")
