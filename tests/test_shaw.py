"""Shaw et al. 2018 relative position representations (``pe=rpe``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import pe_config, tiny_model

from posenc.model.encodings import encoding_factory
from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.shaw import ShawEncoding, ShawRule, distance_table, relative_index


def shaw_reference(q, k, v, key_table, value_table, clip, call):
    """Paper eqs. (3)-(4), one query and one key at a time.

    ``e_ij = (q_i . k_j + q_i . a^K_ij) / sqrt(D)``, ``z_i = sum_j a_ij (v_j + a^V_ij)`` with
    ``a_ij = table[clip(j - i, -k, k) + k]``; masked keys get ``e_ij = -inf``.
    """
    batch, heads, lq, dim = q.shape
    rows = []
    for b in range(batch):
        for h in range(heads):
            for i in range(lq):
                qi = int(call.q_pos[i])
                logits, values = [], []
                for j in range(k.shape[2]):
                    kj = int(call.k_pos[j])
                    row = max(-clip, min(clip, kj - qi)) + clip
                    masked = (call.causal and kj > qi) or (
                        call.key_padding_mask is not None and bool(call.key_padding_mask[b, j])
                    )
                    if masked:
                        logits.append(torch.tensor(float("-inf")))
                        values.append(torch.zeros(dim))
                    else:
                        logits.append(q[b, h, i] @ (k[b, h, j] + key_table[row]) / math.sqrt(dim))
                        values.append(v[b, h, j] + value_table[row])
                weights = torch.softmax(torch.stack(logits), dim=0)
                rows.append((weights[:, None] * torch.stack(values)).sum(0))
    return torch.stack(rows).view(batch, heads, lq, dim)


def make_rule(clip: int, causal: bool, dim: int = 4) -> ShawRule:
    torch.manual_seed(1)
    return ShawRule(dim, clip + 1 if causal else 2 * clip + 1)


def make_call(q_pos, k_pos, clip, causal, padding=None) -> AttentionCall:
    return AttentionCall(
        q_pos, k_pos, causal, padding, context=distance_table(q_pos, k_pos, clip, causal)
    )


def test_table_row_of_every_distance_is_clip_plus_k():
    """Distance 0 is row k; -k and anything further left is row 0; +k and beyond row 2k."""
    clip = 3
    q_pos = torch.tensor([clip + 5])
    k_pos = torch.arange(2 * clip + 11)  # distances -k-5 .. k+5
    rows = relative_index(q_pos, k_pos, clip, causal=False)[0].tolist()
    assert rows == [0] * 6 + [1, 2, 3, 4, 5] + [6] * 6
    causal_rows = relative_index(q_pos, k_pos, clip, causal=True)[0].tolist()
    assert causal_rows == [0] * 6 + [1, 2, 3] + [3] * 8


def test_the_distance_table_is_one_hot_at_the_clipped_row():
    q_pos, k_pos = torch.arange(3, 9), torch.arange(11)
    for causal in (False, True):
        table = distance_table(q_pos, k_pos, 2, causal)
        assert table.shape == (6, 11, 3 if causal else 5)
        assert torch.equal(table.sum(-1), torch.ones(6, 11))
        assert torch.equal(table.argmax(-1), relative_index(q_pos, k_pos, 2, causal))


def test_default_tables_have_the_papers_size():
    enc = ShawEncoding(Site.ENCODER, 64, 4, 2)
    dec = ShawEncoding(Site.DECODER, 64, 4, 2)
    assert enc.max_relative_position == 16
    assert enc.self_rule(0).key_table.shape == (33, 16)
    assert dec.self_rule(0).value_table.shape == (17, 16)
    table = enc.context(torch.arange(40), torch.arange(40))
    assert table.shape == (40, 40, 33)
    assert table[20].argmax(-1).tolist()[4:37] == list(range(33))


def test_each_layer_has_its_own_tables():
    model = tiny_model("rpe")
    for stack in (model.encoder, model.decoder):
        a, b = (layer.self_attn.rule for layer in stack.layers)
        assert a.key_table is not b.key_table and not torch.equal(a.key_table, b.key_table)
    assert type(model.decoder.layers[0].cross_attn.rule) is AttentionRule


@pytest.mark.parametrize(
    ("causal", "q_pos", "k_pos"),
    [
        (False, torch.arange(7), torch.arange(7)),
        (True, torch.arange(7), torch.arange(7)),
        (True, torch.tensor([6]), torch.arange(7)),  # cached decoding: newest token only
        (True, torch.arange(4, 7), torch.arange(7)),  # a block of new tokens after a cache
    ],
)
def test_forward_and_gradients_match_the_loop_reference(causal, q_pos, k_pos):
    clip = 2
    rule = make_rule(clip, causal)
    padding = None if causal else torch.tensor([[False] * 7, [False] * 5 + [True] * 2])
    call = make_call(q_pos, k_pos, clip, causal, padding)
    q = torch.randn(2, 3, len(q_pos), 4, requires_grad=True)
    k = torch.randn(2, 3, len(k_pos), 4, requires_grad=True)
    v = torch.randn(2, 3, len(k_pos), 4, requires_grad=True)
    fast = rule(q, k, v, None, call)
    slow = shaw_reference(q, k, v, rule.key_table, rule.value_table, clip, call)
    torch.testing.assert_close(fast, slow)
    probe = torch.randn_like(fast)
    inputs = (q, k, v, rule.key_table, rule.value_table)
    for g_fast, g_slow in zip(
        torch.autograd.grad((fast * probe).sum(), inputs),
        torch.autograd.grad((slow * probe).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g_fast, g_slow)


def test_keys_beyond_the_clipping_distance_share_one_embedding():
    """With identical keys and values, only a^K tells keys apart: all keys at distance >= k on
    one side get the same weight, keys inside the window get distinct ones."""
    clip = 2
    rule = make_rule(clip, causal=False)
    pos = torch.arange(9)
    call = make_call(pos, pos, clip, causal=False)
    q = torch.randn(1, 1, 9, 4)
    k = torch.randn(1, 1, 1, 4).expand(1, 1, 9, 4)
    weights = rule.weights(q, k, None, call)[0, 0, 4]  # query 4: distances -4..4
    far_left, far_right = weights[: 4 - clip + 1], weights[4 + clip :]
    torch.testing.assert_close(far_left, far_left[:1].expand(3))
    torch.testing.assert_close(far_right, far_right[:1].expand(3))
    assert len(set(weights[4 - clip + 1 : 4 + clip].tolist())) == 2 * clip - 1


def test_the_position_term_depends_only_on_j_minus_i():
    rule = make_rule(3, causal=False)
    pos = torch.arange(8)
    q = torch.randn(1, 2, 1, 4).expand(1, 2, 8, 4)
    zeros = torch.zeros(1, 2, 8, 4)
    relative = rule._scores(q, zeros, distance_table(pos, pos, 3, causal=False))
    for shift in range(1, 8):
        torch.testing.assert_close(
            relative[..., shift:, shift:], relative[..., : 8 - shift, : 8 - shift]
        )
    # The same sequence placed later gives the same output.
    q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
    base = rule(q, k, v, None, make_call(torch.arange(6), torch.arange(6), 3, False))
    moved = rule(q, k, v, None, make_call(torch.arange(6) + 11, torch.arange(6) + 11, 3, False))
    torch.testing.assert_close(base, moved)


def test_attention_dropout_drops_both_value_terms():
    rule = make_rule(2, causal=False)
    pos = torch.arange(5)
    call = make_call(pos, pos, 2, causal=False)
    call.dropout_p = 1.0
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    assert torch.count_nonzero(rule(q, k, v, None, call)) == 0


def test_cached_single_query_equals_the_last_row_of_the_full_pass():
    encoding = encoding_factory(pe_config("rpe", max_relative_position=2))(Site.DECODER, 8, 2, 1)
    rule = encoding.self_rule(0)
    q, k, v = torch.randn(3, 2, 2, 6, 4).unbind(0)
    pos = torch.arange(6)
    full = rule(q, k, v, None, AttentionCall(pos, pos, True, context=encoding.context(pos, pos)))
    last = pos[-1:]
    step_call = AttentionCall(last, pos, True, context=encoding.context(last, pos))
    torch.testing.assert_close(rule(q[:, :, -1:], k, v, None, step_call), full[:, :, -1:])
