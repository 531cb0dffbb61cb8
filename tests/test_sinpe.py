"""Sinusoidal positions (Vaswani et al. 2017) against the paper's formula, and the learned-scale
form against x-transformers' ``ScaledSinusoidalEmbedding``."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.model.encodings.absolute import SinusoidalEncoding
from posenc.model.encodings.base import Site
from posenc.training.optim import make_optimizer

D = 16


def paper(position: int, d: int, base: float = 10000.0) -> list[float]:
    """``PE(pos, 2i) = sin(pos / base^(2i/d))``, ``PE(pos, 2i+1) = cos(...)``, one dim at a time."""
    row = []
    for dim in range(d):
        angle = position / base ** (2 * (dim // 2) / d)
        row.append(math.sin(angle) if dim % 2 == 0 else math.cos(angle))
    return row


def test_the_table_is_the_papers_formula():
    encoding = SinusoidalEncoding(Site.ENCODER, D, 2, 1)
    x = torch.zeros(1, 9, D, dtype=torch.float64)
    added = encoding.embed(x, torch.arange(9))[0]
    expected = torch.tensor([paper(p, D) for p in range(9)], dtype=torch.float64)
    torch.testing.assert_close(added, expected, atol=1e-12, rtol=0)


def test_the_learned_scale_starts_at_one_over_root_d_and_multiplies_the_table():
    plain = SinusoidalEncoding(Site.ENCODER, D, 2, 1)
    scaled = SinusoidalEncoding(Site.ENCODER, D, 2, 1, learned_scale=True)
    x, positions = torch.randn(2, 7, D), torch.arange(7)
    assert scaled.scale.item() == pytest.approx(D**-0.5)
    torch.testing.assert_close(scaled.embed(x, positions) - x, (plain.embed(x, positions) - x) / 4)
    with torch.no_grad():
        scaled.scale.fill_(3.0)
    torch.testing.assert_close(scaled.embed(x, positions) - x, 3 * (plain.embed(x, positions) - x))
    assert plain.scale is None and not list(plain.parameters())


def test_the_scale_learns_and_is_not_weight_decayed():
    scaled = SinusoidalEncoding(Site.DECODER, D, 2, 1, learned_scale=True)
    optimizer = make_optimizer(scaled, lr=0.1, betas=(0.9, 0.98), weight_decay=0.5)
    decayed = [g for g in optimizer.param_groups if g["weight_decay"] > 0]
    assert all(scaled.scale is not p for g in decayed for p in g["params"])
    before = scaled.scale.item()
    scaled.embed(torch.zeros(1, 5, D), torch.arange(5)).sum().backward()
    optimizer.step()
    assert scaled.scale.item() != before


def test_it_equals_x_transformers_scaled_sinusoids_up_to_the_pair_layout():
    """x-transformers lays out ``[sin | cos]`` where the paper interleaves them; same angles."""
    x_transformers = pytest.importorskip("x_transformers.x_transformers")
    theirs = x_transformers.ScaledSinusoidalEmbedding(D)
    ours = SinusoidalEncoding(Site.ENCODER, D, 2, 1, learned_scale=True)
    x = torch.zeros(1, 11, D)
    their_table = theirs(x)  # (L, D), scale included
    our_table = ours.embed(x, torch.arange(11))[0]
    interleaved = torch.empty_like(our_table)
    interleaved[:, 0::2], interleaved[:, 1::2] = their_table[:, : D // 2], their_table[:, D // 2 :]
    torch.testing.assert_close(our_table, interleaved, atol=1e-6, rtol=1e-5)
