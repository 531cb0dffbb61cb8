"""Specification of ALiBi (``pe=alibi``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.encodings.alibi import ALiBiEncoding, alibi_slopes
from posenc.encodings.base import AttentionCall, Site, masked_softmax


def _paper_get_slopes(n: int) -> list[float]:
    """``get_slopes`` of ofirpress/attention_with_linear_biases, transcribed."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _paper_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n_heads", range(1, 65))
def test_slopes_equal_the_papers_get_slopes(n_heads):
    expected = torch.tensor(_paper_get_slopes(n_heads), dtype=torch.float32)
    torch.testing.assert_close(alibi_slopes(n_heads), expected, rtol=1e-6, atol=0)


def test_slopes_of_eight_heads_are_halvings():
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


def _reference_bias(slopes, q_pos, k_pos, causal: bool) -> torch.Tensor:
    out = torch.zeros(1, len(slopes), len(q_pos), len(k_pos))
    for h, m in enumerate(slopes.tolist()):
        for a, i in enumerate(q_pos.tolist()):
            for b, j in enumerate(k_pos.tolist()):
                if causal:
                    out[0, h, a, b] = -m * (i - j) if j <= i else 0.0
                else:
                    out[0, h, a, b] = -m * abs(i - j)
    return out


@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos"),
    [
        (Site.ENCODER, torch.arange(30), torch.arange(30)),
        (Site.DECODER, torch.arange(30), torch.arange(30)),
        (Site.DECODER, torch.tensor([29]), torch.arange(30)),  # one cached decoding step
    ],
)
def test_bias_equals_a_loop_reference_and_is_fixed(site, q_pos, k_pos):
    enc = ALiBiEncoding(site, d_model=16, n_heads=6, n_layers=2)
    bias = enc.context(q_pos, k_pos)
    expected = _reference_bias(alibi_slopes(6), q_pos, k_pos, causal=site is Site.DECODER)
    torch.testing.assert_close(bias, expected)
    assert not bias.requires_grad and not list(enc.parameters())


def test_causal_bias_is_relative_it_equals_the_papers_row_independent_bias_after_softmax():
    """Within the causal part each row is ``m * j`` plus a row constant ``-m * i``, so the softmax
    equals that of the repository's shortcut bias ``m * j`` (the same for every query)."""
    n_heads, length = 4, 12
    enc = ALiBiEncoding(Site.DECODER, d_model=16, n_heads=n_heads, n_layers=1)
    positions = torch.arange(length)
    bias = enc.context(positions, positions)
    shortcut = (alibi_slopes(n_heads)[:, None] * positions.float())[None, :, None, :]
    row_shift = (bias - shortcut)[0]
    causal = positions[None, :] <= positions[:, None]
    for h in range(n_heads):
        for i in range(length):
            shift = row_shift[h, i][causal[i]]
            torch.testing.assert_close(shift, shift[:1].expand_as(shift))
    call = AttentionCall(positions, positions, causal=True)
    scores = torch.randn(2, n_heads, length, length)
    torch.testing.assert_close(
        masked_softmax(scores + bias, call), masked_softmax(scores + shortcut, call)
    )


def test_symmetric_encoder_is_equivariant_to_reversing_its_input():
    """The documented cost of the symmetric encoder form: distance without direction."""
    model = tiny_model("alibi").eval()
    src = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        memory, _ = model.encode(src)
        reversed_memory, _ = model.encode(src.flip(1))
    torch.testing.assert_close(reversed_memory, memory.flip(1), atol=1e-5, rtol=1e-4)
