"""The projected relative bias (``pe=projected_bias``, x-transformers' ``use_rel_proj_pos_bias``):
``b[h, i, j] = sum_r w[h, r](x_i) * B[r, i - j]`` for ``|i - j| < max_dist``, 0 beyond, with
causal distances in the decoder and signed ones in the encoder (the author's N-dimensional
form, ``RelativeProjPositionalBias``). Checked against that sum written out entry by entry, and
against attention computed from it by hand."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import AttentionCall
from posenc.model.encodings.projected_bias import ProjectedBiasRule, bank_columns


def reference_bias(rule: ProjectedBiasRule, x, causal: bool) -> torch.Tensor:
    """The bias entry by entry: the weights of query i's input, the bank at i - j."""
    batch, length, _ = x.shape
    heads, curves, max_dist = rule.n_heads, rule.curves, rule.max_dist
    weights = rule.to_weights(x).view(batch, length, heads, curves)
    out = torch.zeros(batch, heads, length, length, dtype=x.dtype)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                for j in range(length):
                    d = i - j
                    if abs(d) >= max_dist or (causal and d < 0):
                        continue
                    column = d if causal else d + max_dist - 1
                    out[b, h, i, j] = sum(
                        weights[b, i, h, r] * rule.bank[r, column] for r in range(curves)
                    )
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_the_bias_is_the_projected_weights_times_the_bank_at_each_distance(causal):
    torch.manual_seed(0)
    rule = ProjectedBiasRule(d_model=8, n_heads=2, curves=3, max_dist=4, causal=causal).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    q, k, v = (torch.randn(2, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(6)
    columns = bank_columns(positions, positions, 4, causal)
    call = AttentionCall(q_pos=positions, k_pos=positions, causal=causal, context=columns)
    q2, k2, _ = rule.prepare(q, k, x, positions)
    with torch.no_grad():
        bias = rule.bias(q2, k2, None, call)
        expected = reference_bias(rule, x, causal)
        torch.testing.assert_close(bias, expected)
        assert bool((expected[..., 0, 5] == 0).all())  # |i - j| = 5 >= max_dist: no bias
        # attention from the bias by hand: q . k unchanged by the appended channels
        logits = q @ k.transpose(-1, -2) / math.sqrt(4) + expected
        if causal:
            logits = logits.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        torch.testing.assert_close(rule(q2, k2, v, None, call), torch.softmax(logits, -1) @ v)


def test_a_cached_call_reads_the_new_queries_own_weights():
    """The weights ride with q: the last query attending to cached keys gets the bias row the
    full call gives it."""
    torch.manual_seed(1)
    rule = ProjectedBiasRule(d_model=8, n_heads=2, curves=3, max_dist=8, causal=True).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q, k = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(2))
    positions = torch.arange(5)
    full_q, full_k, _ = rule.prepare(q, k, x, positions)
    last_q, last_k, _ = rule.prepare(q[:, :, 4:], k[:, :, 4:], x[:, 4:], positions[4:])
    keys = torch.cat([full_k[:, :, :4], last_k], dim=2)
    with torch.no_grad():
        full_call = AttentionCall(
            positions, positions, True, context=bank_columns(positions, positions, 8, True)
        )
        one_call = AttentionCall(
            positions[4:], positions, True, context=bank_columns(positions[4:], positions, 8, True)
        )
        full = rule.bias(full_q, full_k, None, full_call)
        one = rule.bias(last_q, keys, None, one_call)
    torch.testing.assert_close(one[:, :, 0], full[:, :, 4])
