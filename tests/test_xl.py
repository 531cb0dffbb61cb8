"""Transformer-XL relative attention (``pe=xl``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from transformers import XLNetConfig, XLNetModel

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.transformer_xl import RelativeXLRule, TransformerXLEncoding

D_MODEL, HEADS = 8, 2
DIM = D_MODEL // HEADS


def sinusoid(distance: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """``R_distance`` ``(d,)`` float64: dim ``2m`` is ``sin(distance / base^(2m/d))``, dim
    ``2m + 1`` its cosine."""
    values = []
    for m in range(d_model // 2):
        angle = distance / base ** (2 * m / d_model)
        values += [math.sin(angle), math.cos(angle)]
    return torch.tensor(values, dtype=torch.float64)


def xl_reference(q, k, v, w_r, u, v_bias, call):
    """The paper's four terms, one query and one key at a time::

        score_ij = (q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}) / sqrt(D)

    then a softmax over the allowed keys (the decoder's future keys and padding get -inf)."""
    batch, heads, lq, dim = q.shape
    rows = []
    for b in range(batch):
        for h in range(heads):
            for i in range(lq):
                scores = []
                for j in range(k.shape[2]):
                    distance = int(call.q_pos[i]) - int(call.k_pos[j])
                    padded = call.key_padding_mask is not None and bool(call.key_padding_mask[b, j])
                    if (call.causal and distance < 0) or padded:
                        scores.append(torch.tensor(float("-inf"), dtype=q.dtype))
                        continue
                    r = (w_r @ sinusoid(distance, w_r.shape[1])).view(heads, dim)[h]
                    a = q[b, h, i] @ k[b, h, j]
                    b_term = q[b, h, i] @ r
                    c = u[h] @ k[b, h, j]
                    d = v_bias[h] @ r
                    scores.append((a + b_term + c + d) / math.sqrt(dim))
                weights = torch.softmax(torch.stack(scores), dim=0)
                rows.append(weights @ v[b, h])
    return torch.stack(rows).view(batch, heads, lq, dim)


def make(site: Site) -> tuple[TransformerXLEncoding, RelativeXLRule]:
    """A float64 stack encoding with non-trivial ``u`` and ``v`` and its layer-0 rule."""
    torch.manual_seed(1)
    encoding = TransformerXLEncoding(site, D_MODEL, HEADS, n_layers=1).double()
    with torch.no_grad():
        encoding.u.normal_()
        encoding.v.normal_()
    return encoding, encoding.self_rule(0).double()


def qkv(lq: int, lk: int, dtype=torch.float64, batch: int = 2) -> list[torch.Tensor]:
    shapes = [(batch, HEADS, lq, DIM), (batch, HEADS, lk, DIM), (batch, HEADS, lk, DIM)]
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos"),
    [
        (Site.ENCODER, torch.arange(7), torch.arange(7)),
        (Site.DECODER, torch.arange(7), torch.arange(7)),
        (Site.DECODER, torch.tensor([6]), torch.arange(7)),  # cached decoding: newest token only
        (Site.DECODER, torch.arange(4, 7), torch.arange(7)),  # a block of new tokens after a cache
    ],
)
def test_forward_and_gradients_match_the_papers_four_terms_computed_one_pair_at_a_time(
    site, q_pos, k_pos
):
    encoding, rule = make(site)
    padding = (
        torch.tensor([[False] * 7, [False] * 5 + [True] * 2]) if site is Site.ENCODER else None
    )
    call = AttentionCall(
        q_pos, k_pos, site is Site.DECODER, padding, encoding.context(q_pos, k_pos)
    )
    q, k, v = qkv(len(q_pos), len(k_pos))
    fast = rule(q, k, v, None, call)
    w_r = rule.position_proj.weight
    slow = xl_reference(q, k, v, w_r, encoding.u, encoding.v, call)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(fast)
    inputs = (q, k, v, w_r, encoding.u, encoding.v)
    for g_fast, g_slow in zip(
        torch.autograd.grad((fast * probe).sum(), inputs),
        torch.autograd.grad((slow * probe).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_slow, rtol=1e-10, atol=1e-12)


def xlnet_attention(attn_type: str, rule: RelativeXLRule, encoding: TransformerXLEncoding):
    """transformers' XLNet (a tiny model built offline) with its relative attention set to the
    same ``u`` (``r_w_bias``), ``v`` (``r_r_bias``) and ``W_R`` (``r``). XLNet's sinusoid lists
    the sines then the cosines where posenc interleaves them, so ``W_R``'s columns are permuted:
    posenc's dim ``2m`` is XLNet's ``m``, its dim ``2m + 1`` XLNet's ``d/2 + m``."""
    config = XLNetConfig(
        vocab_size=10, d_model=D_MODEL, n_layer=1, n_head=HEADS, d_inner=16, dropout=0.0
    )
    config.attn_type = attn_type
    model = XLNetModel(config).eval()
    attention = model.layer[0].rel_attn
    half = D_MODEL // 2
    xlnet_column = torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten()
    r = torch.zeros(D_MODEL, D_MODEL)
    r[xlnet_column] = rule.position_proj.weight.detach().float().T
    with torch.no_grad():
        attention.r.copy_(r.view(D_MODEL, HEADS, DIM))
        attention.r_w_bias.copy_(encoding.u)
        attention.r_r_bias.copy_(encoding.v)
    return model, attention


@pytest.mark.parametrize(("site", "attn_type"), [(Site.ENCODER, "bi"), (Site.DECODER, "uni")])
def test_equals_transformers_xlnet_relative_attention_on_the_same_weights(site, attn_type):
    """XLNet's ``rel_attn_core`` (relative shift, ``r_w_bias``/``r_r_bias``) is Transformer-XL's
    attention; its ``bi`` form is posenc's encoder form, its ``uni`` form (with the causal mask)
    the paper's decoder form."""
    encoding, rule = make(site)
    encoding, rule = encoding.float(), rule.float()
    model, attention = xlnet_attention(attn_type, rule, encoding)
    batch, length = 2, 7
    pos = torch.arange(length)
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, 5:] = site is Site.ENCODER
    call = AttentionCall(pos, pos, site is Site.DECODER, padding, encoding.context(pos, pos))
    q, k, v = (t.detach() for t in qkv(length, length, torch.float32, batch))
    masked = padding[:, None, :] | (call.causal & (pos[None, :] > pos[:, None]))[None]  # (B, i, j)
    heads_last = [t.permute(2, 0, 1, 3) for t in (q, k, v)]  # XLNet's (L, B, H, D)
    with torch.no_grad():
        r = model.relative_positional_encoding(length, length, bsz=batch)
        k_head_r = torch.einsum("ibh,hnd->ibnd", r, attention.r)
        theirs = attention.rel_attn_core(
            *heads_last, k_head_r, attn_mask=masked.permute(1, 2, 0)[..., None].float()
        )
        ours = rule(q, k, v, None, call)
    torch.testing.assert_close(ours, theirs.permute(1, 2, 0, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
def test_scores_depend_on_positions_only_through_i_minus_j(site):
    """Shift invariance: the same sequence placed later gives the same output, and with one
    content vector at every position the logits are constant along each diagonal i - j."""
    encoding, rule = make(site)
    causal = site is Site.DECODER
    q, k, v = (t.detach() for t in qkv(6, 6))
    outputs = []
    for start in (0, 11):
        pos = torch.arange(start, start + 6)
        outputs.append(
            rule(q, k, v, None, AttentionCall(pos, pos, causal, None, encoding.context(pos, pos)))
        )
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)

    pos = torch.arange(8)
    same = torch.randn(1, HEADS, 1, DIM, dtype=torch.float64).expand(1, HEADS, 8, DIM)
    bias = rule.bias(
        same, same, None, AttentionCall(pos, pos, causal, None, encoding.context(pos, pos))
    )
    for shift in range(1, 8):
        lower = torch.ones(8 - shift, 8 - shift).tril().bool() if causal else slice(None)
        torch.testing.assert_close(
            bias[..., shift:, shift:][..., lower], bias[..., : 8 - shift, : 8 - shift][..., lower]
        )


def test_the_encoder_tells_left_from_right_through_the_sine_half():
    """``R_{-d}`` flips the sines of ``R_d`` and keeps its cosines: with zero content only the
    position terms remain, and a key at ``-d`` scores differently from one at ``+d``."""
    encoding, rule = make(Site.ENCODER)
    pos = torch.arange(5)
    context = encoding.context(pos, pos)
    table, index = context.sinusoids, context.index
    ahead, behind = table[index[0, 3]], table[index[3, 0]]  # distances -3 and +3
    torch.testing.assert_close(ahead[1::2], behind[1::2])
    torch.testing.assert_close(ahead[0::2], -behind[0::2])
    zeros = torch.zeros(1, HEADS, 5, DIM, dtype=torch.float64)
    bias = rule.bias(zeros, zeros, None, AttentionCall(pos, pos, False, None, context))
    assert not torch.allclose(bias, bias.transpose(-1, -2))


def test_no_absolute_positions_u_v_per_stack_and_w_r_per_layer():
    model = tiny_model("xl", layers=3)
    x = torch.randn(2, 5, 32)
    for stack in (model.encoder, model.decoder):
        encoding = stack.encoding
        assert encoding.embed(x, torch.arange(5)) is x
        assert dict(encoding.named_parameters()).keys() == {"u", "v"}
        assert encoding.u.shape == encoding.v.shape == (4, 8)
        rules = [layer.self_attn.rule for layer in stack.layers]
        weights = [rule.position_proj.weight for rule in rules]
        assert all(w.shape == (32, 32) for w in weights)
        assert not torch.equal(weights[0], weights[1])
        assert all(rule.position_proj.bias is None for rule in rules)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
