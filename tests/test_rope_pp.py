"""Specification of RoPE++ (``pe=rope_pp``): each projected head attends twice, with the real
part of RoPE's complex score and with its imaginary part, the same keys and values, as Liu et
al. (2025) define them; equal_heads halves q, k, v and the cache, equal_cache doubles the heads
the output projection reads."""

from __future__ import annotations

import cmath
import math

import pytest
import torch

from posenc.model.attention import MultiHeadAttention
from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.rope_pp import ImaginaryRotaryEncoding, both_heads

D_MODEL, HEADS, HEAD_DIM = 16, 4, 4


def layer_of(variant: str) -> tuple[ImaginaryRotaryEncoding, MultiHeadAttention]:
    torch.manual_seed(0)
    encoding = ImaginaryRotaryEncoding(Site.DECODER, D_MODEL, HEADS, 1, variant=variant)
    encoding = encoding.double()
    return encoding, MultiHeadAttention(D_MODEL, HEADS, encoding.self_rule(0)).double()


def reference_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Projected head by head, query by query: ``z = sum_j q~_j conj(k~_j)`` with pair ``j`` as
    a complex number turned by ``e^(i pos theta_j)``, ``theta_j = 10^4^(-2j/D)``; head ``2g``
    the causal softmax of ``Re z / sqrt(D)``, head ``2g + 1`` of ``Im z / sqrt(D)``."""
    batch, heads, length, dim = q.shape
    out = torch.zeros(batch, 2 * heads, length, length, dtype=torch.float64)
    for b in range(batch):
        for g in range(heads):
            for m in range(length):
                scores: dict[str, list[float]] = {"re": [], "im": []}
                for n in range(m + 1):
                    z = 0j
                    for j in range(dim // 2):
                        theta = 10000.0 ** (-2 * j / dim)
                        qj = complex(q[b, g, m, 2 * j], q[b, g, m, 2 * j + 1])
                        kj = complex(k[b, g, n, 2 * j], k[b, g, n, 2 * j + 1])
                        qj *= cmath.exp(1j * m * theta)
                        kj *= cmath.exp(1j * n * theta)
                        z += qj * kj.conjugate()
                    scores["re"].append(z.real / math.sqrt(dim))
                    scores["im"].append(z.imag / math.sqrt(dim))
                for offset, part in ((0, "re"), (1, "im")):
                    row = torch.tensor(scores[part], dtype=torch.float64).softmax(-1)
                    out[b, 2 * g + offset, m, : m + 1] = row
    return out


@pytest.mark.parametrize("variant", ["equal_heads", "equal_cache"])
def test_the_weights_are_the_real_and_imaginary_parts_of_ropes_complex_score(variant):
    encoding, layer = layer_of(variant)
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    positions = torch.arange(6)
    call = AttentionCall(
        positions, positions, causal=True, context=encoding.context(positions, positions)
    )
    weights = layer.attention_weights(x, call)
    q = layer._split(layer.q_proj(x))
    k = layer._split(layer.kv_proj(x).chunk(2, dim=-1)[0])
    torch.testing.assert_close(weights, reference_weights(q, k))
    values = layer._split(layer.kv_proj(x).chunk(2, dim=-1)[1]).repeat_interleave(2, dim=1)
    expected = layer.out_proj((weights @ values).transpose(1, 2).flatten(2))
    torch.testing.assert_close(layer(x, call), expected)  # each head's value is its own head's


@pytest.mark.parametrize(
    ("variant", "projected", "attended"), [("equal_heads", 2, 4), ("equal_cache", 4, 8)]
)
def test_equal_heads_halves_q_k_v_and_the_cache_and_equal_cache_doubles_the_heads_read(
    variant, projected, attended
):
    encoding, layer = layer_of(variant)
    assert layer.q_proj.out_features == projected * HEAD_DIM
    assert layer.kv_proj.out_features == 2 * projected * HEAD_DIM
    assert layer.out_proj.in_features == attended * HEAD_DIM
    cache: dict = {}
    x = torch.randn(1, 3, D_MODEL, dtype=torch.float64)
    positions = torch.arange(3)
    call = AttentionCall(
        positions, positions, causal=True, context=encoding.context(positions, positions)
    )
    layer(x, call, cache=cache)
    assert cache["k"].shape == (1, projected, 3, HEAD_DIM)  # RoPE's is (1, 4, 3, 4)


def test_an_imaginary_head_tells_a_key_before_the_query_from_one_after_it():
    """With one vector at every position the real score is even in the distance (RoPE cannot
    tell left from right) and the imaginary score odd: 0 at distance 0, opposite at +-d."""
    encoding = ImaginaryRotaryEncoding(Site.ENCODER, D_MODEL, HEADS, 1).double()
    rule = encoding.self_rule(0)
    same = torch.randn(1, 1, 1, HEAD_DIM, dtype=torch.float64).expand(1, 2, 7, HEAD_DIM)
    positions = torch.arange(7)
    q, k, _ = rule.prepare(same, same, same, positions, encoding.context(positions, positions))
    queries, keys, _ = both_heads(q, k, k)
    scores = queries @ keys.mT  # (1, 4, 7, 7): heads real, imaginary, real, imaginary
    real, imaginary = scores[:, 0::2], scores[:, 1::2]
    torch.testing.assert_close(real, real.mT)
    torch.testing.assert_close(imaginary, -imaginary.mT)
    assert imaginary.diagonal(dim1=-2, dim2=-1).abs().max() < 1e-12
    assert imaginary.abs().max() > 0.1


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="variant='both' is unknown"):
        ImaginaryRotaryEncoding(Site.DECODER, D_MODEL, HEADS, 1, variant="both")
    with pytest.raises(ValueError, match="n_heads=3 is odd; use an even model.n_heads"):
        ImaginaryRotaryEncoding(Site.DECODER, 24, 3, 1)
    ImaginaryRotaryEncoding(Site.DECODER, 24, 3, 1, variant="equal_cache")  # no halving there
    with pytest.raises(ValueError, match="head dim 3 must be even"):
        ImaginaryRotaryEncoding(Site.DECODER, 12, 4, 1)
