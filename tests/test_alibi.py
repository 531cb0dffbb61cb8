"""Specification of ALiBi (``pe=alibi``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.alibi import ALiBiEncoding, alibi_slopes
from posenc.model.encodings.base import AttentionCall, Site, masked_softmax
from posenc.model.encodings.common import SPLIT_PENALTY


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


def _reference_bias(slopes, q_pos, k_pos, form: str) -> torch.Tensor:
    """The bias written out per entry: ``form`` is ``causal`` (the paper's decoder) or an
    encoder form."""
    m = slopes.tolist()
    n = len(m)
    out = torch.zeros(1, n, len(q_pos), len(k_pos))
    for h in range(n):
        for a, i in enumerate(q_pos.tolist()):
            for b, j in enumerate(k_pos.tolist()):
                if form == "causal":
                    value = -m[h] * (i - j) if j <= i else 0.0
                elif form == "symmetric":
                    value = -m[h] * abs(i - j)
                elif form == "asymmetric":
                    value = -m[h] * (i - j) if j <= i else -m[n - 1 - h] * (j - i)
                elif h % 2 == 0:  # split: even heads look back
                    value = -m[h] * (i - j) if j <= i else SPLIT_PENALTY
                else:  # split: odd heads look forward
                    value = -m[h] * (j - i) if j >= i else SPLIT_PENALTY
                out[0, h, a, b] = value
    return out


@pytest.mark.parametrize(
    ("site", "form", "q_pos", "k_pos"),
    [
        (Site.ENCODER, "symmetric", torch.arange(30), torch.arange(30)),
        (Site.ENCODER, "asymmetric", torch.arange(30), torch.arange(30)),
        (Site.ENCODER, "split", torch.arange(30), torch.arange(30)),
        (Site.DECODER, "causal", torch.arange(30), torch.arange(30)),
        (Site.DECODER, "causal", torch.tensor([29]), torch.arange(30)),  # one cached step
        (Site.DECODER, "causal", torch.tensor([26, 27, 28, 29]), torch.arange(30)),  # a chunk
    ],
)
def test_bias_equals_a_loop_reference_and_is_fixed(site, form, q_pos, k_pos):
    encoder_bias = "symmetric" if form == "causal" else form
    enc = ALiBiEncoding(site, d_model=16, n_heads=6, n_layers=2, encoder_bias=encoder_bias)
    bias = enc.context(q_pos, k_pos)
    expected = _reference_bias(alibi_slopes(6), q_pos, k_pos, form)
    torch.testing.assert_close(bias, expected)
    assert not bias.requires_grad and not list(enc.parameters())


@pytest.mark.parametrize("form", ["symmetric", "asymmetric", "split"])
def test_the_decoder_keeps_the_papers_causal_bias_whatever_the_encoder_form(form):
    positions = torch.arange(12)
    enc = ALiBiEncoding(Site.DECODER, d_model=16, n_heads=4, n_layers=1, encoder_bias=form)
    expected = _reference_bias(alibi_slopes(4), positions, positions, "causal")
    torch.testing.assert_close(enc.context(positions, positions), expected)


def test_asymmetric_heads_mirror_the_slope_sequence():
    """Head h's slope after the query is head H-1-h's before it: the steepest-left head is the
    gentlest-right one, and every head of an even count tells the two sides apart."""
    positions = torch.arange(3)
    enc = ALiBiEncoding(Site.ENCODER, d_model=16, n_heads=4, n_layers=1, encoder_bias="asymmetric")
    bias = enc.context(positions, positions)[0]
    left, right = -bias[:, 1, 0], -bias[:, 1, 2]  # distance 1 before / after the query
    torch.testing.assert_close(left, alibi_slopes(4))
    torch.testing.assert_close(right, alibi_slopes(4).flip(0))
    assert (left != right).all()


def test_a_split_head_ignores_the_side_it_does_not_look_at_exactly():
    """For a real query, keys on a split head's other side get exactly zero weight."""
    positions = torch.arange(10)
    enc = ALiBiEncoding(Site.ENCODER, d_model=16, n_heads=4, n_layers=1, encoder_bias="split")
    scores = 5 * torch.randn(1, 4, 10, 10)
    weights = torch.softmax(scores + enc.context(positions, positions), dim=-1)[0]
    after = positions[None, :] > positions[:, None]
    assert (weights[0::2][:, after] == 0).all() and (weights[1::2][:, after.T] == 0).all()
    assert (weights[0::2][:, ~after] > 0).all() and (weights[1::2][:, ~after.T] > 0).all()


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
    model = tiny_model("alibi", encoder_bias="symmetric").eval()
    src = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        memory, _ = model.encode(src)
        reversed_memory, _ = model.encode(src.flip(1))
    torch.testing.assert_close(reversed_memory, memory.flip(1), atol=1e-5, rtol=1e-4)


def test_an_unknown_encoder_form_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="encoder_bias='mirror' is unknown; use one of"):
        ALiBiEncoding(Site.ENCODER, d_model=16, n_heads=4, n_layers=1, encoder_bias="mirror")


@pytest.mark.parametrize(
    ("site", "form"),
    [
        (Site.DECODER, "symmetric"),
        *((Site.ENCODER, f) for f in ("symmetric", "asymmetric", "split")),
    ],
)
def test_alibi_on_some_heads_gives_the_first_the_slopes_of_their_count_and_the_rest_no_bias(
    site, form
):
    """x-transformers' ``alibi_num_heads``: the first N heads are an N-head ALiBi."""
    q_pos, k_pos = torch.arange(20), torch.arange(20)
    some = ALiBiEncoding(site, 16, n_heads=8, n_layers=1, encoder_bias=form, alibi_num_heads=3)
    alone = ALiBiEncoding(site, 16, n_heads=3, n_layers=1, encoder_bias=form)
    bias = some.context(q_pos, k_pos)
    torch.testing.assert_close(bias[:, :3], alone.context(q_pos, k_pos))
    unbiased = bias[:, 3:]
    if form == "split":  # the encoder's form still turns each head to its side
        blocked = unbiased == SPLIT_PENALTY
        ahead = torch.ones(20, 20, dtype=torch.bool).triu(1)  # keys after the query
        assert torch.all(unbiased[~blocked] == 0)
        assert torch.equal(blocked[0, 0], ahead.T) and torch.equal(blocked[0, 1], ahead)
    else:
        assert torch.all(unbiased == 0)


@pytest.mark.parametrize("count", [0, 9])
def test_alibi_on_more_heads_than_the_model_has_or_none_is_refused(count):
    with pytest.raises(
        ValueError, match=f"pe.alibi_num_heads={count} must be from 1 to the model's 8 heads"
    ):
        ALiBiEncoding(Site.DECODER, 16, n_heads=8, n_layers=1, alibi_num_heads=count)
