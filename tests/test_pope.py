"""PoPE (``configs/pe/pope.yaml``): softplus magnitudes from content, phases from position, a
learned key phase bias per head and dim; the logit is
``sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c - delta_c) / sqrt(D)``."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import pe_config, tiny_model

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.polar import PolarEncoding, PolarRule, polar_frequencies

HEADS, HEAD_DIM = 2, 6


def make_pope(site: Site = Site.DECODER, **params) -> PolarEncoding:
    return PolarEncoding(site, HEADS * HEAD_DIM, HEADS, 1, **params)


def polar_qk(encoding: PolarEncoding, q, k, positions):
    """The fast path: phases from ``context``, polar forms from ``PolarRule.prepare``."""
    q, k, _ = PolarRule().prepare(
        q, k, None, positions, context=encoding.context(positions, positions)
    )
    return q, k


def paper_scores(q, k, positions, delta, base=10000.0):
    """The paper's logits with loops: ``sum_c mu_q mu_k cos((t - s) theta_c - delta_hc) /
    sqrt(D)``, ``mu = softplus``, ``theta_c = base^(-c/D)``; ``q, k (B, H, L, D)``,
    ``delta (H, D)`` (already clamped). Returns ``(B, H, L, L)``."""
    b, h, length, d = q.shape
    out = torch.zeros(b, h, length, length, dtype=q.dtype)
    mu_q, mu_k = torch.nn.functional.softplus(q), torch.nn.functional.softplus(k)
    for bi in range(b):
        for hi in range(h):
            for i, t in enumerate(positions.tolist()):
                for j, s in enumerate(positions.tolist()):
                    total = 0.0
                    for c in range(d):
                        theta = base ** (-c / d)
                        angle = (t - s) * theta - delta[hi, c]
                        total = total + mu_q[bi, hi, i, c] * mu_k[bi, hi, j, c] * torch.cos(angle)
                    out[bi, hi, i, j] = total / math.sqrt(d)
    return out


def test_frequencies_are_one_per_dim_as_in_the_paper():
    expected = torch.tensor([10000.0 ** (-c / HEAD_DIM) for c in range(HEAD_DIM)])
    torch.testing.assert_close(polar_frequencies(HEAD_DIM, 10000.0), expected)


@pytest.mark.parametrize("init", ["zero", "uniform"])
def test_logits_match_the_loop_reference_forward_and_backward(init):
    torch.manual_seed(0)
    encoding = make_pope(phase_bias_init=init).double()
    positions = torch.tensor([0, 3, 4, 11, 40])
    q = torch.randn(2, HEADS, 5, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, HEADS, 5, HEAD_DIM, dtype=torch.float64, requires_grad=True)
    pq, pk = polar_qk(encoding, q, k, positions)
    fast = pq @ pk.transpose(-1, -2) * PolarRule().score_scale(pq)
    delta = encoding.phase_bias.clamp(-2 * math.pi, 0.0)
    ref = paper_scores(q, k, positions, delta)
    # theta is stored in float32 (as RoPE's and x-transformers'), the reference is exact
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-6)
    weight = torch.randn(2, HEADS, 5, 5, dtype=torch.float64)
    params = (q, k, encoding.phase_bias)
    fast_grads = torch.autograd.grad((fast * weight).sum(), params)
    ref_grads = torch.autograd.grad((ref * weight).sum(), params)
    for got, expected in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_attention_output_is_softmax_of_the_paper_logits_times_the_values():
    torch.manual_seed(1)
    encoding = make_pope(Site.ENCODER, phase_bias_init="uniform").double()
    positions = torch.arange(6)
    q, k, v = (torch.randn(1, HEADS, 6, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    pad = torch.tensor([[False] * 5 + [True]])
    call = AttentionCall(positions, positions, causal=False, key_padding_mask=pad)
    pq, pk = polar_qk(encoding, q, k, positions)
    out = PolarRule()(pq, pk, v, None, call)
    logits = paper_scores(q, k, positions, encoding.phase_bias.clamp(-2 * math.pi, 0.0))
    weights = logits.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
    torch.testing.assert_close(out, weights @ v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        PolarRule().weights(pq, pk, None, call), weights, rtol=1e-5, atol=1e-6
    )


def test_scores_depend_on_positions_only_through_their_difference():
    encoding = make_pope(phase_bias_init="uniform")
    q, k = torch.randn(1, HEADS, 6, HEAD_DIM), torch.randn(1, HEADS, 6, HEAD_DIM)
    positions = torch.tensor([0, 1, 4, 9, 17, 40])
    scores = []
    for shift in [0, 13, 700]:
        pq, pk = polar_qk(encoding, q, k, positions + shift)
        scores.append(pq @ pk.transpose(-1, -2))
    torch.testing.assert_close(scores[1], scores[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scores[2], scores[0], atol=1e-4, rtol=1e-4)


def test_what_and_where_are_decoupled():
    """With no phase bias, a query and key at the same position score
    ``sum_c softplus(q_c) softplus(k_c)`` whatever the position (content alone), and no
    position makes a score larger (the phase can only shrink it)."""
    encoding = make_pope()
    q, k = torch.randn(1, HEADS, 1, HEAD_DIM), torch.randn(1, HEADS, 1, HEAD_DIM)
    content = (torch.nn.functional.softplus(q) * torch.nn.functional.softplus(k)).sum(-1)
    for at in [0, 7, 500]:
        pq, pk = polar_qk(encoding, q, k, torch.tensor([at]))
        torch.testing.assert_close((pq * pk).sum(-1), content, atol=1e-5, rtol=1e-5)
    pq, _ = polar_qk(encoding, q, k, torch.tensor([30]))
    for key_at in [0, 3, 29, 31, 90]:
        _, pk = polar_qk(encoding, q, k, torch.tensor([key_at]))
        assert ((pq * pk).sum(-1) <= content + 1e-5).all()


def test_the_phase_bias_is_shared_by_the_layers_and_learned_without_weight_decay():
    model = tiny_model("pope")
    biases = [n for n, p in model.named_parameters() if "phase_bias" in n]
    assert len(biases) == 2  # one per stack, not one per layer
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn.rule, PolarRule)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule


def test_the_phase_bias_acts_clamped_to_minus_two_pi_and_zero():
    encoding = make_pope()
    with torch.no_grad():
        encoding.phase_bias.fill_(3.0)
    phases = encoding.context(torch.arange(3), torch.arange(3))
    torch.testing.assert_close(phases.key, phases.query.expand(HEADS, -1, -1))
    with torch.no_grad():
        encoding.phase_bias.fill_(-10.0)
    phases = encoding.context(torch.arange(3), torch.arange(3))
    torch.testing.assert_close(phases.key, (phases.query - 2 * math.pi).expand(HEADS, -1, -1))


def test_uniform_init_lies_in_minus_two_pi_to_zero():
    bias = make_pope(phase_bias_init="uniform").phase_bias
    assert bias.min() >= -2 * math.pi and bias.max() <= 0 and bias.std() > 0.5


@pytest.mark.parametrize(
    ("params", "match"),
    [({"phase_bias_init": "random"}, "phase_bias_init"), ({"base": 1.0}, "base")],
)
def test_bad_settings_fail_in_one_line(params, match):
    with pytest.raises(ValueError, match=match) as error:
        make_pope(**params)
    assert "\n" not in str(error.value)


def test_the_yaml_holds_the_papers_defaults():
    cfg = pe_config("pope")
    assert cfg["base"] == 10000.0 and cfg["phase_bias_init"] == "zero"


def test_equals_x_transformers_polar_embedding():
    """x-transformers' ``PolarEmbedding`` and ``apply_polar_pos_emb`` give the same polar q and
    k (and so the same logits at its ``dim_head ** -0.5``)."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(2)
    ours = make_pope(phase_bias_init="uniform")
    theirs = xt.PolarEmbedding(HEAD_DIM, HEADS)
    with torch.no_grad():
        theirs.learned_bias.copy_(ours.phase_bias[:, None, :])
    positions = torch.arange(9)
    q, k = torch.randn(2, HEADS, 9, HEAD_DIM), torch.randn(2, HEADS, 9, HEAD_DIM)
    freqs, bias = theirs(positions)
    pq, pk = polar_qk(ours, q, k, positions)
    torch.testing.assert_close(pq, xt.apply_polar_pos_emb(q, freqs))
    torch.testing.assert_close(pk, xt.apply_polar_pos_emb(k, freqs + bias))
