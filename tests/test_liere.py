"""Specification of LieRE (``pe=liere``): q and k rotated by the exponential of a learned
skew-symmetric generator times the normalised position, as the paper's code computes it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.base import Site
from posenc.model.encodings.liere import LieREEncoding, LieRERule


def make(generator_dim=None, per_head=False, **settings) -> LieREEncoding:
    torch.manual_seed(0)
    return LieREEncoding(
        Site.DECODER, 16, 2, 1, generator_dim=generator_dim, per_head=per_head, **settings
    ).double()


def reference_rotated(encoding: LieREEncoding, x: torch.Tensor, positions) -> torch.Tensor:
    """Token by token, head by head, block by block: ``exp((t / max_len) S) x_t`` with ``S``
    built entry by entry from the parameters' strict upper triangle."""
    raw = encoding.shared.raw.detach()
    groups, blocks, b, _ = raw.shape
    out = torch.empty_like(x)
    for t, p in enumerate(positions.tolist()):
        for h in range(x.shape[1]):
            for n in range(blocks):
                s = torch.zeros(b, b, dtype=torch.float64)
                for i in range(b):
                    for j in range(i + 1, b):
                        s[i, j], s[j, i] = raw[h % groups, n, i, j], -raw[h % groups, n, i, j]
                rotation = torch.linalg.matrix_exp(p / encoding.max_len * s)
                block = slice(n * b, (n + 1) * b)
                out[:, h, t, block] = x[:, h, t, block] @ rotation.T
    return out


def rotated(encoding: LieREEncoding, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    q, _, _ = LieRERule(None, encoding.max_len).prepare(
        x, x, None, positions, encoding.context(positions, positions)
    )
    return q


@pytest.mark.parametrize(("generator_dim", "per_head"), [(None, False), (2, True), (4, False)])
def test_rotation_equals_the_matrix_exponential_of_the_generator_token_by_token(
    generator_dim, per_head
):
    encoding = make(generator_dim, per_head)
    x = torch.randn(2, 2, 9, 8, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 5, 17, 64, 255, 256, 700])
    torch.testing.assert_close(
        rotated(encoding, x, positions), reference_rotated(encoding, x, positions)
    )


def test_scores_depend_on_the_distance_only_and_norms_are_kept():
    encoding = make(max_len=32)
    q, k = (
        torch.randn(1, 2, 6, 8, dtype=torch.float64),
        torch.randn(1, 2, 6, 8, dtype=torch.float64),
    )
    positions = torch.arange(6)

    def scores(offset: int) -> torch.Tensor:
        return rotated(encoding, q, positions + offset) @ rotated(
            encoding, k, positions + offset
        ).transpose(-1, -2)

    torch.testing.assert_close(scores(0), scores(40))
    torch.testing.assert_close(rotated(encoding, q, positions).norm(dim=-1), q.norm(dim=-1))
    assert not torch.allclose(scores(0), q @ k.transpose(-1, -2))


def test_the_generator_starts_as_the_papers_code_and_is_one_set_unless_asked():
    model = tiny_model("liere", layers=3)
    stack = model.decoder.encoding
    assert stack.shared.raw.shape == (1, 1, 8, 8)  # one dense 8x8 generator: head dim 8
    assert stack.shared.raw.min() >= 0 and stack.shared.raw.max() < 2 * math.pi
    skew = stack.shared.skew()
    torch.testing.assert_close(skew, -skew.transpose(-1, -2))
    per_layer = tiny_model("liere", layers=3, per_layer=True, per_head=True)
    generators = [layer.self_attn.rule.generators for layer in per_layer.decoder.layers]
    assert len({id(g) for g in generators}) == 3 and generators[0].raw.shape == (4, 1, 8, 8)


@pytest.mark.parametrize("generator_dim", [3, 1])
def test_a_block_that_does_not_divide_the_head_is_refused_in_one_line(generator_dim):
    with pytest.raises(
        ValueError, match=f"generator_dim={generator_dim} must be at least 2 and divide"
    ):
        LieREEncoding(Site.ENCODER, 16, 2, 1, generator_dim=generator_dim)
