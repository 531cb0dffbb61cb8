"""DeBERTa's disentangled attention (``pe=deberta``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from transformers import DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import (
    DisentangledSelfAttention,
    build_relative_position,
    make_log_bucket_position,
)

from posenc.model.attention import MultiHeadAttention
from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.deberta import DeBERTaEncoding, DisentangledRule, log_bucket_position
from posenc.model.layers import DecoderCache

D_MODEL, HEADS = 8, 2
DIM = D_MODEL // HEADS
CLIPPED = {"max_relative_positions": 3, "position_buckets": 0}
BUCKETED = {"max_relative_positions": 10, "position_buckets": 8}
SETTINGS = pytest.mark.parametrize("settings", [CLIPPED, BUCKETED], ids=["clipped", "buckets"])


def paper_delta(relative: int, max_relative_positions: int, position_buckets: int) -> int:
    """The paper's ``delta``, ``clip(r, -k, k - 1) + k``, of one signed distance ``r``, after
    DeBERTa-v2's log bucket when ``position_buckets = S > 0`` (then ``k = S``)."""
    k = max_relative_positions
    if position_buckets > 0:
        mid, k = position_buckets // 2, position_buckets
        if abs(relative) > mid:
            ratio = math.log(abs(relative) / mid) / math.log((max_relative_positions - 1) / mid)
            relative = int(math.copysign(mid + math.ceil(ratio * (mid - 1)), relative))
    return min(max(relative, -k), k - 1) + k


@pytest.mark.parametrize(("buckets", "max_position"), [(256, 512), (8, 10), (64, 300), (32, 128)])
def test_log_buckets_equal_transformers_deberta_v2(buckets, max_position):
    relative = torch.arange(-3000, 3001)
    ours = log_bucket_position(relative, buckets, max_position)
    theirs = make_log_bucket_position(relative, buckets, max_position).long()
    assert torch.equal(ours, theirs)
    expected = [paper_delta(r, max_position, buckets) - buckets for r in relative.tolist()]
    assert ours.clamp(-buckets, buckets - 1).tolist() == expected


def test_delta_clips_to_minus_k_and_k_minus_one():
    encoding = DeBERTaEncoding(Site.ENCODER, D_MODEL, HEADS, 1, **CLIPPED)
    assert encoding.table.shape == (6, D_MODEL)
    rows = encoding.relative_index(torch.arange(-6, 7)).tolist()
    assert rows == [0, 0, 0, 0, 1, 2, 3, 4, 5, 5, 5, 5, 5]


@SETTINGS
def test_row_indices_equal_transformers_c2p_and_p2c_positions(settings):
    """The rows the stack gathers are transformers' ``c2p_pos`` (``delta(i,j)`` at ``[i, j]``)
    and ``p2c_pos`` (``delta(j,i)`` at ``[i, j]``, the paper's p2c rows). transformers then
    gathers its key-major p2c scores with ``p2c_pos`` read as ``[j, i]``, which is
    ``delta(i,j)``: the ``i-j`` option (tests below)."""
    length = 15
    encoding = DeBERTaEncoding(Site.ENCODER, D_MODEL, HEADS, 1, **settings)
    span = encoding.span
    layer = torch.zeros(1, length, 1)
    buckets, max_position = settings["position_buckets"] or -1, settings["max_relative_positions"]
    relative = build_relative_position(layer, layer, buckets, max_position)[0]
    pos = torch.arange(length)
    context = encoding.context(pos, pos)
    c2p = torch.clamp(relative + span, 0, 2 * span - 1)
    p2c = torch.clamp(-relative + span, 0, 2 * span - 1)
    for rows, index, positions in [
        (context.key_rows, context.c2p_index, c2p),
        (context.query_rows, context.p2c_index.T, p2c),
    ]:
        first, last = int(positions.min()), int(positions.max())
        assert torch.equal(index + first, positions)
        assert torch.equal(rows, encoding.table[first : last + 1])


def deberta_reference(q, k, v, table, rule: DisentangledRule, settings: dict, p2c: str, call):
    """The paper's eq. 4, one query and one key at a time::

        score_ij = (q_i.k_j + q_i.K^r_delta(i,j) + k_j.Q^r_delta(j,i)) / sqrt(3D)

    with ``K^r = P W_{k,r}``, ``Q^r = P W_{q,r} + b_{q,r}``; masked keys get -inf. With
    ``p2c = "i-j"``, p2c reads ``Q^r_delta(i,j)`` instead (the authors' code)."""
    batch, heads, lq, dim = q.shape
    w_k, w_q, b_q = rule.pos_key_proj.weight, rule.pos_query_proj.weight, rule.pos_query_proj.bias
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
                    key_r = (w_k @ table[paper_delta(distance, **settings)]).view(heads, dim)
                    seen_from_key = -distance if p2c == "j-i" else distance
                    query_r = w_q @ table[paper_delta(seen_from_key, **settings)] + b_q
                    c2c = q[b, h, i] @ k[b, h, j]
                    c2p = q[b, h, i] @ key_r[h]
                    p2c_term = k[b, h, j] @ query_r.view(heads, dim)[h]
                    scores.append((c2c + c2p + p2c_term) / math.sqrt(3 * dim))
                weights = torch.softmax(torch.stack(scores), dim=0)
                rows.append(weights @ v[b, h])
    return torch.stack(rows).view(batch, heads, lq, dim)


def make(
    site: Site, settings: dict, dtype=torch.float64, p2c: str = "j-i"
) -> tuple[DeBERTaEncoding, DisentangledRule]:
    """A stack encoding with a unit-scale ``P`` and non-zero ``b_{q,r}``, and its layer-0 rule."""
    torch.manual_seed(1)
    encoding = DeBERTaEncoding(site, D_MODEL, HEADS, 1, p2c_distance=p2c, **settings).to(dtype)
    rule = encoding.self_rule(0).to(dtype)
    with torch.no_grad():
        encoding.table.normal_()
        rule.pos_query_proj.bias.normal_()
    return encoding, rule


def qkv(lq: int, lk: int, dtype=torch.float64, batch: int = 2) -> list[torch.Tensor]:
    shapes = [(batch, HEADS, lq, DIM), (batch, HEADS, lk, DIM), (batch, HEADS, lk, DIM)]
    return [torch.randn(s, dtype=dtype, requires_grad=True) for s in shapes]


@SETTINGS
@pytest.mark.parametrize("p2c", ["j-i", "i-j"])
@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos"),
    [
        (Site.ENCODER, torch.arange(13), torch.arange(13)),
        (Site.DECODER, torch.arange(13), torch.arange(13)),
        (Site.DECODER, torch.tensor([12]), torch.arange(13)),  # cached decoding: newest token
        (Site.DECODER, torch.arange(9, 13), torch.arange(13)),  # new tokens after a cache
    ],
)
def test_forward_and_gradients_match_the_papers_formula_one_pair_at_a_time(
    settings, p2c, site, q_pos, k_pos
):
    encoding, rule = make(site, settings, p2c=p2c)
    padding = None
    if site is Site.ENCODER:
        padding = torch.zeros(2, 13, dtype=torch.bool)
        padding[1, 10:] = True
    call = AttentionCall(
        q_pos, k_pos, site is Site.DECODER, padding, encoding.context(q_pos, k_pos)
    )
    q, k, v = qkv(len(q_pos), len(k_pos))
    fast = rule(q, k, v, None, call)
    slow = deberta_reference(q, k, v, encoding.table, rule, settings, p2c, call)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rule.weights(q, k, None, call) @ v, fast, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(fast)
    inputs = (q, k, v, encoding.table, *rule.parameters())
    for g_fast, g_slow in zip(
        torch.autograd.grad((fast * probe).sum(), inputs),
        torch.autograd.grad((slow * probe).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_slow, rtol=1e-10, atol=1e-12)


def transformers_attention(rule: DisentangledRule, attention: MultiHeadAttention, settings: dict):
    """transformers' DeBERTa-v2 ``DisentangledSelfAttention`` (c2p|p2c, separate position
    projections) holding the same content and position projections; its position-key bias,
    which the paper's code does not have, is zero."""
    config = DebertaV2Config(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        share_att_key=False,
        max_relative_positions=settings["max_relative_positions"],
        position_buckets=settings["position_buckets"] or -1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    theirs = DisentangledSelfAttention(config).eval()
    key_weight, value_weight = attention.kv_proj.weight.chunk(2)
    key_bias, value_bias = attention.kv_proj.bias.chunk(2)
    with torch.no_grad():
        for target, weight, bias in [
            (theirs.query_proj, attention.q_proj.weight, attention.q_proj.bias),
            (theirs.key_proj, key_weight, key_bias),
            (theirs.value_proj, value_weight, value_bias),
            (theirs.pos_key_proj, rule.pos_key_proj.weight, torch.zeros(D_MODEL)),
            (theirs.pos_query_proj, rule.pos_query_proj.weight, rule.pos_query_proj.bias),
        ]:
            target.weight.copy_(weight)
            target.bias.copy_(bias)
    return theirs


def ours_and_transformers(settings: dict, site: Site, p2c: str):
    """Outputs ``(B, L, d)`` (before the output projection) of posenc's rule and of
    transformers' attention on the same weights and input ``x``; also ``x`` and ``P``. The
    decoder form is transformers' attention under a causal mask."""
    encoding, rule = make(site, settings, torch.float32, p2c)
    attention = MultiHeadAttention(D_MODEL, HEADS, rule)
    theirs = transformers_attention(rule, attention, settings)
    batch, length = 2, 15
    pos = torch.arange(length)
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, 11:] = site is Site.ENCODER
    causal = site is Site.DECODER
    call = AttentionCall(pos, pos, causal, padding, encoding.context(pos, pos))
    x = torch.randn(batch, length, D_MODEL, requires_grad=True)
    q, k, v, _ = attention._project(x, call, None, None)
    ours = rule(q, k, v, None, call).transpose(1, 2).reshape(batch, length, D_MODEL)
    allowed = ~padding[:, None, None, :] & ~(causal & (pos[None, :] > pos[:, None]))
    reference, _ = theirs(x, allowed, rel_embeddings=encoding.table)
    return ours, reference, (x, encoding.table)


@SETTINGS
@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
def test_equals_transformers_deberta_v2_on_the_same_weights(settings, site):
    """With transformers' p2c distance (``i-j``): the same outputs, and the same gradients for
    the input and ``P``."""
    ours, reference, inputs = ours_and_transformers(settings, site, "i-j")
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    probe = torch.randn_like(ours)
    for g_ours, g_theirs in zip(
        torch.autograd.grad((ours * probe).sum(), inputs),
        torch.autograd.grad((reference * probe).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
def test_the_papers_p2c_distance_is_not_the_one_transformers_reads(site):
    """The paper's ``Q^r_delta(j,i)`` (the default) differs from transformers' p2c, which reads
    ``Q^r_delta(i,j)``: the loop reference above pins both."""
    ours, reference, _ = ours_and_transformers(CLIPPED, site, "j-i")
    assert (ours - reference).abs().max() > 1e-3


@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
def test_scores_depend_on_positions_only_through_i_minus_j(site):
    """Shift invariance: the same sequence placed later gives the same output."""
    encoding, rule = make(site, BUCKETED)
    q, k, v = (t.detach() for t in qkv(12, 12))
    outputs = []
    for start in (0, 23):
        pos = torch.arange(start, start + 12)
        call = AttentionCall(pos, pos, site is Site.DECODER, None, encoding.context(pos, pos))
        outputs.append(rule(q, k, v, None, call))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)


def test_keys_beyond_the_clipping_distance_share_one_position():
    """With identical keys, only the position terms tell keys apart: every key at ``i - j >= k``
    gets one weight, every key at ``i - j <= -k`` another, keys in between distinct ones."""
    encoding, rule = make(Site.ENCODER, CLIPPED)
    pos = torch.arange(13)
    call = AttentionCall(pos, pos, False, None, encoding.context(pos, pos))
    q = torch.randn(1, HEADS, 13, DIM, dtype=torch.float64)
    k = torch.randn(1, HEADS, 1, DIM, dtype=torch.float64).expand(1, HEADS, 13, DIM)
    weights = rule.weights(q, k, None, call)[0, 0, 6]  # query 6: i - j from 6 down to -6
    far_behind, far_ahead = weights[: 6 - 3 + 1], weights[6 + 3 :]  # i - j >= 3, i - j <= -3
    torch.testing.assert_close(far_behind, far_behind[:1].expand(4))
    torch.testing.assert_close(far_ahead, far_ahead[:1].expand(4))
    assert len({round(w, 12) for w in weights[4:9].tolist()}) == 5


@SETTINGS
def test_cached_decoding_in_chunks_equals_teacher_forcing_in_float64(settings):
    """The generic suite runs the config's default (no buckets); the bucket option too."""
    model = tiny_model("deberta", **settings).double().eval()
    src, tgt = torch.randint(3, 40, (2, 9)), torch.randint(3, 40, (2, 14))
    src[1, 6:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache, steps, start = DecoderCache(), [], 0
        for size in (1, 4, 2, 7):
            steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
            start += size
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)


def test_one_table_per_stack_and_position_projections_per_layer():
    model = tiny_model("deberta", layers=3)
    x = torch.randn(2, 5, 32)
    for stack in (model.encoder, model.decoder):
        encoding = stack.encoding
        assert encoding.embed(x, torch.arange(5)) is x
        assert dict(encoding.named_parameters()).keys() == {"table"}
        assert encoding.table.shape == (2 * 512, 32)
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert len({id(rule) for rule in rules}) == 3
        assert not torch.equal(rules[0].pos_key_proj.weight, rules[1].pos_key_proj.weight)
        assert all(rule.pos_key_proj.bias is None for rule in rules)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    buckets = tiny_model("deberta", position_buckets=256).encoder.encoding
    assert buckets.table.shape == (2 * 256, 32)
