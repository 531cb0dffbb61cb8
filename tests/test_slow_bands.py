"""RoPE's slow bands changed (``pe.slow_bands``): HoPE stops the bands whose wavelength exceeds
the training length, the clipped RoPE scales the lowest frequencies by a half cosine (soft) or
sets them to 0 (hard). Checked against the rules as their sources state them, written out pair
by pair: HoPE as Levy et al. (2026) state it (theta_j < 2 pi / L does not rotate; with base 1e4
and a head of 64, 11, 13 and 16 of the 32 bands rotate for L = 128, 256, 512), the clips as the
clipped RoPE's code (``modeling_cope.py``: ``0.5 * (1 + cos(linspace(0, pi, n)))`` on the last n
inverse frequencies, or 0)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.base import Site
from posenc.model.encodings.rotary import RotaryEncoding


def frequencies(head_dim: int, base: float = 10000.0) -> list[float]:
    """RoPE's theta_j = base^(-2j/D), j = 0 .. D/2 - 1, highest first."""
    return [base ** (-2 * j / head_dim) for j in range(head_dim // 2)]


def hope_reference(head_dim: int, length: int) -> list[float]:
    return [t if t >= 2 * math.pi / length else 0.0 for t in frequencies(head_dim)]


def clip_reference(head_dim: int, n: int, soft: bool) -> list[float]:
    out = frequencies(head_dim)
    first = len(out) - n
    for i in range(n):  # t from 0 at the fastest clipped pair to pi at the slowest
        t = math.pi * i / (n - 1) if n > 1 else 0.0
        out[first + i] *= 0.5 * (1 + math.cos(t)) if soft else 0.0
    return out


def encoding(head_dim: int, **settings) -> RotaryEncoding:
    return RotaryEncoding(Site.DECODER, 2 * head_dim, 2, 1, **settings)


@pytest.mark.parametrize(("length", "rotating"), [(128, 11), (256, 13), (512, 16)])
def test_hope_stops_the_bands_longer_than_the_training_length(length, rotating):
    found = encoding(64, slow_bands="hope", original_max_len=length).inv_freq
    torch.testing.assert_close(found, torch.tensor(hope_reference(64, length)))
    assert int((found > 0).sum()) == rotating


@pytest.mark.parametrize("soft", [True, False])
@pytest.mark.parametrize(("head_dim", "n"), [(32, 5), (64, 10), (128, 20)])
def test_the_clips_scale_or_zero_the_lowest_frequencies(head_dim, n, soft):
    kind = "soft_clip" if soft else "hard_clip"
    found = encoding(head_dim, slow_bands=kind).inv_freq  # n: the paper's 20 of 64, rounded
    torch.testing.assert_close(found, torch.tensor(clip_reference(head_dim, n, soft)))
    chosen = encoding(head_dim, slow_bands=kind, clipped_pairs=3).inv_freq
    torch.testing.assert_close(chosen, torch.tensor(clip_reference(head_dim, 3, soft)))


def test_a_stopped_band_carries_no_position():
    """What makes HoPE HoPE: through the encoding's own rotation, a band that does not rotate
    gives q . k the same value at every distance (content alone); the 11 rotating bands still
    see distance."""
    rope = encoding(64, slow_bands="hope", original_max_len=128)
    positions = torch.arange(40)
    table = rope.context(positions, positions).q  # (40, 32) complex, the encoding's own
    stopped = rope.inv_freq == 0
    assert int(stopped.sum()) == 21
    q, k = (torch.randn(32, dtype=torch.complex64) for _ in range(2))
    scores = ((q * table[:, None]) * (k * table[None, :]).conj()).real  # (40, 40, 32)
    constant = scores[0, 0].expand_as(scores)
    assert torch.allclose(scores[..., stopped], constant[..., stopped])
    assert not torch.allclose(scores[..., ~stopped], constant[..., ~stopped])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"slow_bands": "hopes"}, "slow_bands='hopes' is unknown"),
        (
            {"slow_bands": "soft_clip", "clipped_pairs": 16},
            "clipped_pairs=16 must clip from 1 to 15",
        ),
        ({"clipped_pairs": 3}, "clipped_pairs is the clipped RoPE's"),
        ({"slow_bands": "hope", "original_max_len": 0}, "needs original_max_len > 0"),
    ],
)
def test_settings_that_make_no_sense_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        encoding(32, **settings)


def test_a_test_time_scaling_changes_the_bands_training_stopped_and_no_others():
    """HoPE's stopped bands are read from RoPE's own frequencies: a linear scaling at test time
    (each frequency divided by its factor) does not stop more of them."""
    trained = encoding(64, slow_bands="hope", original_max_len=128).inv_freq
    scaled = encoding(64, slow_bands="hope", original_max_len=128, scaling="linear", factor=4.0)
    torch.testing.assert_close(scaled.inv_freq, trained / 4.0)
