"""Specification of ComRoPE (``pe=comrope``): q and k rotated block by block by the exponential of
a trainable block-diagonal skew-symmetric angle matrix times the position, in the paper's two
forms, as its code initialises them."""

from __future__ import annotations

import pytest
import torch

from posenc.model.encodings.base import Site
from posenc.model.encodings.comrope import ComRoPEEncoding, ComRoPERule


def rule_of(variant="ap", block_dim=4, max_len=None, init_std=1.0) -> ComRoPERule:
    torch.manual_seed(0)
    encoding = ComRoPEEncoding(
        Site.DECODER,
        16,
        2,
        1,
        variant=variant,
        block_dim=block_dim,
        init_std=init_std,
        max_len=max_len,
    )
    return encoding.self_rule(0).double()


def reference_rotated(rule: ComRoPERule, x: torch.Tensor, positions) -> torch.Tensor:
    """Token by token, head by head, block by block: ``exp(t B) x_t`` with ``B`` built entry by
    entry as ``P[i, j] - P[j, i]`` (times the block's ``theta`` for ``ld``)."""
    matrices = rule.angles.matrices.detach()
    multiplier = rule.angles.multiplier
    heads, blocks, b, _ = matrices.shape
    out = torch.empty_like(x)
    for t, position in enumerate(positions.tolist()):
        for h in range(heads):
            for n in range(blocks):
                generator = torch.zeros(b, b, dtype=torch.float64)
                for i in range(b):
                    for j in range(b):
                        generator[i, j] = matrices[h, n, i, j] - matrices[h, n, j, i]
                if multiplier is not None:
                    generator = generator * multiplier[n].item()
                rotation = torch.linalg.matrix_exp(position * rule.scale * generator)
                block = slice(n * b, (n + 1) * b)
                out[:, h, t, block] = x[:, h, t, block] @ rotation.T
    return out


def rotated(rule: ComRoPERule, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    q, _, _ = rule.prepare(x, x, None, positions)
    return q


@pytest.mark.parametrize(
    ("variant", "block_dim", "max_len"), [("ap", 4, None), ("ld", 2, None), ("ap", 8, 64)]
)
def test_rotation_equals_the_exponential_of_the_angle_matrix_token_by_token(
    variant, block_dim, max_len
):
    rule = rule_of(variant, block_dim, max_len)
    x = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 7, 64, 300])
    torch.testing.assert_close(rotated(rule, x, positions), reference_rotated(rule, x, positions))


@pytest.mark.parametrize("variant", ["ap", "ld"])
def test_scores_depend_on_the_distance_only_and_norms_are_kept(variant):
    rule = rule_of(variant, init_std=0.1)
    q, k = torch.randn(2, 1, 2, 6, 8, dtype=torch.float64)
    positions = torch.arange(6)

    def scores(offset: int) -> torch.Tensor:
        return rotated(rule, q, positions + offset) @ rotated(rule, k, positions + offset).mT

    torch.testing.assert_close(scores(0), scores(37))
    torch.testing.assert_close(rotated(rule, q, positions).norm(dim=-1), q.norm(dim=-1))
    assert not torch.allclose(scores(0), q @ k.mT)


def test_rotations_at_two_positions_compose_to_the_rotation_at_their_sum():
    rule = rule_of("ld", init_std=0.3)
    x = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    twice = rotated(rule, rotated(rule, x, torch.tensor([3])), torch.tensor([5]))
    torch.testing.assert_close(twice, rotated(rule, x, torch.tensor([8])))


def test_angle_matrices_start_as_the_papers_code_draws_them_each_layer_and_head_its_own():
    torch.manual_seed(0)
    encoding = ComRoPEEncoding(Site.DECODER, 256, 4, 2, variant="ld", block_dim=8, init_std=0.5)
    first, second = encoding.self_rule(0).angles, encoding.self_rule(1).angles
    assert first.matrices.shape == (4, 8, 8, 8)
    assert first.matrices.std().item() == pytest.approx(0.5, rel=0.1)
    assert first.multiplier.shape == (8,)
    assert not torch.equal(first.matrices, second.matrices)
    assert not torch.equal(first.matrices[0], first.matrices[1])
    assert rule_of("ap").angles.multiplier is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"variant": "xy"}, "variant='xy' is not one of ap, ld"),
        ({"block_dim": 3}, "block_dim=3 must be at least 2 and divide the head dim 8"),
        ({"init_std": -1.0}, "init_std=-1.0 must be >= 0"),
        ({"max_len": 0}, "max_len=0 must be at least 1 or null"),
    ],
)
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        ComRoPEEncoding(Site.DECODER, 16, 2, 1, **settings)
