"""Specification of TUPE, untied positional attention (``pe=tupe``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.model.attention import first_calls
from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.tupe import TupeEncoding, UntiedRule
from posenc.model.layers import DecoderCache


def make_encoding(site: Site, relative: bool = True, **settings) -> TupeEncoding:
    """A float64 TUPE encoding (d 12, 3 heads of 4 dims) whose LayerNorm and projection biases
    are moved off their initial values, so that every parameter shapes the term."""
    torch.manual_seed(0)
    encoding = TupeEncoding(site, 12, 3, 2, relative=relative, **settings).double()
    with torch.no_grad():
        for param in (
            encoding.norm.weight,
            encoding.norm.bias,
            encoding.query.bias,
            encoding.key.bias,
        ):
            param.add_(0.3 * torch.randn_like(param))
        encoding.table.mul_(25.0)  # spread the positions (init std 0.02)
    return encoding


def reference_term(encoding: TupeEncoding, q_pos, k_pos) -> torch.Tensor:
    """``(p_i U^Q_h) . (p_j U^K_h) / sqrt(2D) + b[bucket(j - i), h]``, one scalar at a time, with
    ``p_i`` the LayerNorm of table row ``min(i, max_len - 1)`` written out and the bucket of
    transformers' T5."""
    heads, dim = encoding.n_heads, encoding.d_model // encoding.n_heads
    norm = encoding.norm

    def position(i: int) -> torch.Tensor:
        row = encoding.table[min(i, encoding.max_len - 1)]
        centred = row - row.mean()
        return centred / torch.sqrt((centred**2).mean() + norm.eps) * norm.weight + norm.bias

    values = []
    for h in range(heads):
        head = slice(h * dim, (h + 1) * dim)
        for i in q_pos.tolist():
            for j in k_pos.tolist():
                u_q = encoding.query.weight[head] @ position(i) + encoding.query.bias[head]
                u_k = encoding.key.weight[head] @ position(j) + encoding.key.bias[head]
                value = u_q @ u_k / math.sqrt(2 * dim)
                if encoding.relative_table is not None:
                    bucket = T5Attention._relative_position_bucket(
                        torch.tensor(j - i),
                        bidirectional=encoding.site is Site.ENCODER,
                        num_buckets=encoding.num_buckets,
                        max_distance=encoding.max_distance,
                    )
                    value = value + encoding.relative_table[int(bucket), h]
                values.append(value)
    return torch.stack(values).view(1, heads, len(q_pos), len(k_pos))


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos", "max_len"),
    [
        (Site.ENCODER, torch.arange(14), torch.arange(14), 512),
        (Site.DECODER, torch.arange(14), torch.arange(14), 512),
        (Site.DECODER, torch.tensor([13]), torch.arange(14), 512),  # one cached step
        (Site.DECODER, torch.tensor([10, 11, 12, 13]), torch.arange(14), 512),  # a chunk
        (Site.ENCODER, torch.arange(14), torch.arange(14), 10),  # clamped beyond the table
    ],
)
def test_positional_term_and_its_gradients_equal_a_loop_reference(
    site, q_pos, k_pos, max_len, relative
):
    encoding = make_encoding(site, relative, max_len=max_len, max_distance=9, num_buckets=8)
    params = list(encoding.parameters())
    fast = encoding.context(q_pos, k_pos)
    slow = reference_term(encoding, q_pos, k_pos)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(fast)
    g_fast = torch.autograd.grad((fast * weights).sum(), params)
    g_slow = torch.autograd.grad((slow * weights).sum(), params)
    for fast_grad, slow_grad in zip(g_fast, g_slow, strict=True):
        torch.testing.assert_close(fast_grad, slow_grad, rtol=1e-10, atol=1e-12)


def reference_attention(q, k, v, term, call: AttentionCall) -> torch.Tensor:
    """``softmax_j(q_i . k_j / sqrt(2D) + term_hij) v`` over the keys the call allows, one query
    at a time."""
    batch, heads, lq, dim = q.shape
    rows = []
    for b in range(batch):
        for h in range(heads):
            for i in range(lq):
                logits = []
                for j in range(k.shape[2]):
                    future = call.causal and int(call.k_pos[j]) > int(call.q_pos[i])
                    padded = call.key_padding_mask is not None and bool(call.key_padding_mask[b, j])
                    content = q[b, h, i] @ k[b, h, j] / math.sqrt(2 * dim)
                    logits.append(content + term[0, h, i, j] if not (future or padded) else None)
                allowed = torch.stack([x for x in logits if x is not None])
                weights = torch.softmax(allowed, dim=0)
                keep = [j for j, x in enumerate(logits) if x is not None]
                rows.append(weights @ v[b, h, keep])
    return torch.stack(rows).view(batch, heads, lq, dim)


@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos", "padded"),
    [
        (Site.ENCODER, torch.arange(7), torch.arange(7), True),
        (Site.DECODER, torch.arange(7), torch.arange(7), False),
        (Site.DECODER, torch.tensor([4, 5, 6]), torch.arange(7), False),
    ],
)
def test_both_terms_are_scaled_by_one_over_sqrt_2d_in_sdpa_and_in_the_plotted_weights(
    site, q_pos, k_pos, padded
):
    encoding = make_encoding(site)
    padding = torch.zeros(2, len(k_pos), dtype=torch.bool)
    padding[1, 5:] = padded
    call = AttentionCall(
        q_pos,
        k_pos,
        site is Site.DECODER,
        padding if padded else None,
        encoding.context(q_pos, k_pos),
    )
    q = torch.randn(2, 3, len(q_pos), 4, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(2, 2, 3, len(k_pos), 4, dtype=torch.float64).unbind(0)
    k, v = k.requires_grad_(), v.requires_grad_()
    inputs = [q, k, v, *encoding.parameters()]
    expected = reference_attention(q, k, v, call.context, call)
    rule = encoding.self_rule(0)
    out = rule(q, k, v, None, call)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(rule.weights(q, k, None, call) @ v, expected)
    weights = torch.randn_like(out)
    g_fast = torch.autograd.grad((out * weights).sum(), inputs, retain_graph=True)
    g_slow = torch.autograd.grad((expected * weights).sum(), inputs)
    for fast_grad, slow_grad in zip(g_fast, g_slow, strict=True):
        torch.testing.assert_close(fast_grad, slow_grad)


def test_positional_term_ignores_the_tokens_and_content_term_ignores_the_positions():
    """The defining property of untying: no position reaches the tokens' q and k (the input gets
    no position vector, so permuting the source permutes q and k and nothing else), and the
    positional term is the same whatever the tokens; the logit is their sum."""
    model = tiny_model("tupe").eval()
    attention = model.encoder.layers[0].self_attn
    src = torch.randint(3, 40, (1, 9))
    perm = torch.randperm(9)
    seen = []
    for tokens in (src, src[:, perm], torch.randint(3, 40, (1, 9))):
        with torch.no_grad(), first_calls(attention.rule) as (rule_call,):
            model.encode(tokens)
        seen.append(rule_call.args)  # q, k, v, key_state, call
    (q, k, _, _, call), (q_perm, k_perm, _, _, call_perm), (_, _, _, _, call_other) = seen
    torch.testing.assert_close(q_perm, q[:, :, perm])
    torch.testing.assert_close(k_perm, k[:, :, perm])
    assert torch.equal(call.context, call_perm.context)
    assert torch.equal(call.context, call_other.context)
    logits = q @ k.transpose(-1, -2) / math.sqrt(2 * q.shape[-1]) + call.context
    weights = attention.rule.weights(q, k, None, call)
    torch.testing.assert_close(weights, torch.softmax(logits, dim=-1))
    x = torch.randn(1, 9, 32)
    assert torch.equal(model.encoder.encoding.embed(x, torch.arange(9)), x)


def test_one_set_of_positions_per_stack_shared_by_every_layer():
    model = tiny_model("tupe", layers=3)
    for stack in (model.encoder, model.decoder):
        shapes = {name: tuple(p.shape) for name, p in stack.encoding.named_parameters()}
        assert shapes == {
            "table": (512, 32),
            "norm.weight": (32,),
            "norm.bias": (32,),
            "query.weight": (32, 32),
            "query.bias": (32,),
            "key.weight": (32, 32),
            "key.bias": (32,),
            "relative_table": (32, 4),
        }
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert all(rule is rules[0] for rule in rules) and isinstance(rules[0], UntiedRule)
        assert not list(rules[0].parameters())
        assert all(type(layer.cross_attn.rule) is AttentionRule for layer in model.decoder.layers)
    tupe_a = tiny_model("tupe", relative=False)
    assert "relative_table" not in dict(tupe_a.encoder.encoding.named_parameters())


def test_init_is_berts_after_the_models_xavier_pass():
    encoding = tiny_model("tupe", d_model=64, n_heads=4).encoder.encoding
    for weight in (encoding.table, encoding.query.weight, encoding.key.weight):
        assert abs(weight.std().item() - 0.02) < 0.002
    assert abs(encoding.relative_table.std().item() - 0.02) < 0.008
    assert not encoding.query.bias.any() and not encoding.key.bias.any()


def test_positions_beyond_the_table_reuse_its_last_row_or_raise():
    clamped = make_encoding(Site.ENCODER, relative=False, max_len=6)
    beyond = clamped.context(torch.tensor([5, 7, 9]), torch.tensor([5, 7, 9]))[0]
    last = clamped.context(torch.tensor([5]), torch.tensor([5]))[0]
    torch.testing.assert_close(beyond, last.expand_as(beyond))
    strict = make_encoding(Site.ENCODER, max_len=6, clamp=False)
    with pytest.raises(ValueError, match="max_len=6"):
        strict.context(torch.arange(7), torch.arange(7))


@pytest.mark.parametrize("relative", [True, False])
def test_cached_decoding_in_chunks_equals_teacher_forcing(relative):
    model = tiny_model("tupe", relative=relative).eval()
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 10))
    src[1, 5:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache, steps, start = DecoderCache(), [], 0
        for size in (3, 1, 4, 2):
            steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
            start += size
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
