"""GRAPE (Zhang et al., ICLR 2026) as a check of three encodings: positions act on queries and
keys as a one-parameter group ``G(n) = exp(n omega L)``; multiplicative with rank-2 skew
generators (RoPE: the canonical coordinate pairs, log-uniform frequencies), additive with a
rank-1 nilpotent generator on a homogeneous lift (ALiBi: a constant slope; FoX: the product of
one unipotent factor per token, its log forget gate as the step). Each test builds the group
element explicitly with matrix exponentials and finds posenc's own computation in it. The
generators and the lift are written here from the paper's description (rank-2 skew; rank-1
unipotent on a homogeneous lift), not transcribed from its code: its sign and scaling
conventions may differ, the relative law and the special cases do not."""

from __future__ import annotations

import math

import torch

from posenc.model.encodings.alibi import ALiBiEncoding
from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.fox import ForgetGateRule
from posenc.model.encodings.rotation import rope_frequencies, rotate, rotation_table


def rank2_generator(d: int, a: int, b: int) -> torch.Tensor:
    """``L = e_b e_a^T - e_a e_b^T``: the rank-2 skew generator of the plane ``(a, b)``."""
    generator = torch.zeros(d, d, dtype=torch.float64)
    generator[b, a], generator[a, b] = 1.0, -1.0
    return generator


def test_rope_is_multiplicative_grape_on_the_canonical_pairs_with_a_log_uniform_spectrum():
    """posenc's rotation at position n is exp(n sum_i omega_i L_i), L_i on dims (2i, 2i+1),
    omega_i = base^(-2i/d); and G(i)^T G(j) = G(j - i), the relative law."""
    d = 8
    omega = rope_frequencies(d).double()
    generator = sum(omega[i] * rank2_generator(d, 2 * i, 2 * i + 1) for i in range(d // 2))
    x = torch.randn(1, 1, 5, d, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 40, 300])
    ours = rotate(x, rotation_table(positions, omega).to(torch.complex128))
    for t, n in enumerate(positions.tolist()):
        group = torch.linalg.matrix_exp(n * generator)
        torch.testing.assert_close(ours[0, 0, t], group @ x[0, 0, t])
    g = [torch.linalg.matrix_exp(n * generator) for n in (3, 11)]
    torch.testing.assert_close(g[0].T @ g[1], torch.linalg.matrix_exp(8 * generator))


def lift(x: torch.Tensor, query: bool) -> torch.Tensor:
    """The homogeneous lift ``[x, 1, 0]`` of a query, ``[x, 0, 1]`` of a key, ``(..., d + 2)``."""
    ones, zeros = torch.ones_like(x[..., :1]), torch.zeros_like(x[..., :1])
    return torch.cat([x, ones, zeros] if query else [x, zeros, ones], dim=-1)


def unipotent(d: int, step: float) -> torch.Tensor:
    """``exp(step E)`` with ``E = e_(d) e_(d+1)^T`` (rank 1, nilpotent), ``(d + 2, d + 2)``."""
    generator = torch.zeros(d + 2, d + 2, dtype=torch.float64)
    generator[d, d + 1] = 1.0
    return torch.linalg.matrix_exp(step * generator)


def test_alibi_is_additive_grape_a_unipotent_action_with_its_slope_as_the_frequency():
    """q^_i^T exp((j - i) m_h E) k^_j = q.k/sqrt(D) - m_h (i - j): posenc's decoder logits,
    and the factorised form (G(i)^-T q^_i) . (G(j) k^_j) streams (each side at its own
    position)."""
    d, length, heads = 4, 6, 2
    alibi = ALiBiEncoding(Site.DECODER, d * heads, heads, 1).double()
    positions = torch.arange(length)
    bias = alibi.context(positions, positions)[0]
    q, k = (
        torch.randn(heads, length, d, dtype=torch.float64),
        torch.randn(heads, length, d, dtype=torch.float64),
    )
    for h in range(heads):
        m = alibi.slopes[h].item()
        for i in range(length):
            for j in range(i + 1):
                ours = q[h, i] @ k[h, j] / math.sqrt(d) + bias[h, i, j]
                q_hat, k_hat = lift(q[h, i] / math.sqrt(d), True), lift(k[h, j], False)
                grape = q_hat @ unipotent(d, (j - i) * m) @ k_hat
                streamed = (torch.linalg.inv(unipotent(d, i * m)).T @ q_hat) @ (
                    unipotent(d, j * m) @ k_hat
                )
                torch.testing.assert_close(ours, grape)
                torch.testing.assert_close(ours, streamed)


def test_fox_is_additive_grape_along_a_path_one_unipotent_factor_per_token():
    """The product of exp(log f_l E) over the tokens l after key j up to query i, between the
    lifted query and key, is posenc's FoX bias c_i - c_j = sum log f_l: ALiBi's constant step
    made the token's own log forget gate."""
    torch.manual_seed(0)
    d, length = 6, 7
    rule = ForgetGateRule(d, 2, bidirectional=False, init_std=0.5).double()
    x = torch.randn(1, length, d, dtype=torch.float64)
    q = torch.zeros(1, 2, length, 3, dtype=torch.float64)
    _, _, log_f = rule.prepare(q, q, x, torch.arange(length))
    positions = torch.arange(length)
    bias = rule.bias(q, q, log_f, AttentionCall(positions, positions, True))[0]
    zero = torch.zeros(3, dtype=torch.float64)
    for h in range(2):
        for i in range(length):
            for j in range(i + 1):
                path = torch.eye(5, dtype=torch.float64)
                for step in range(j + 1, i + 1):
                    path = path @ unipotent(3, log_f[0, h, step].item())
                grape = lift(zero, True) @ path @ lift(zero, False)
                torch.testing.assert_close(bias[h, i, j], grape)
