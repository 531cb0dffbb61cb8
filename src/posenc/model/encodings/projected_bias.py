"""A relative bias projected from the query's content (``pe=projected_bias``).

x-transformers 2.26.4's ``use_rel_proj_pos_bias`` (``RelativeProjPositionalBias``; its author's
N-dimensional form in vit-pytorch): each layer keeps a bank of ``R`` learned distance curves
``B (R, distances)`` and a linear map from the query token's input to ``R`` weights per head,
and adds to the logits

    b[h, i, j] = sum_r w[h, r](x_i) * B[r, i - j],   |i - j| < max_dist (0 beyond).

* Decoder (causal, as x-transformers): the distances ``0 .. max_dist - 1``.
* Encoder: x-transformers' bias is causal only; posenc extends it as the same author's
  N-dimensional form does, with a bank over the signed distances ``-(max_dist - 1) ..
  max_dist - 1``.

Where it applies: encoder and decoder self-attention, one bank and map per layer; nothing in
cross-attention. ``x`` is the attention's input. Initialisation as the reference: the bank
``N(0, 0.02^2)``, the map ``nn.Linear``'s default.

Which bank column each query-key pair reads is worked out once per forward
(:meth:`ProjectedBiasEncoding.context`) for every layer. The weights ride with the query:
:meth:`ProjectedBiasRule.prepare` appends them to ``q`` as ``R`` extra channels per head and
``R`` zero channels to ``k``, so ``q . k`` is unchanged, the
cache keeps zeros, and the bias of the new queries of a cached call reads their own weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site, StackEncoding

#: the bank's initial deviation, as the reference's ``embed_small_init``
BANK_STD = 0.02


def bank_columns(
    q_pos: Tensor, k_pos: Tensor, max_dist: int, causal: bool
) -> tuple[Tensor, Tensor]:
    """The bank's column of each query-key pair ``(Lq, Lk)`` (the distance ``i - j``, shifted
    by ``max_dist - 1`` in the encoder's signed bank; clamped where out of range) and whether
    the pair has a bias at all (``|i - j| < max_dist``, and ``i >= j`` in the decoder)."""
    distance = q_pos[:, None] - k_pos[None, :]
    valid = distance.abs() < max_dist
    if causal:
        valid &= distance >= 0
    width = max_dist if causal else 2 * max_dist - 1
    columns = distance if causal else distance + max_dist - 1
    return columns.clamp(0, width - 1), valid


class ProjectedBiasRule(AttentionRule):
    """One layer's projected relative bias.

    Args:
        d_model, n_heads: the layer's width and heads.
        curves: ``R``, the distance curves of the bank.
        max_dist: distances from this on get no bias.
        causal: the decoder's bank (distances ``0 .. max_dist - 1``) or the encoder's (signed).
    """

    def __init__(self, d_model: int, n_heads: int, curves: int, max_dist: int, causal: bool):
        super().__init__()
        self.n_heads, self.curves, self.max_dist, self.causal = n_heads, curves, max_dist, causal
        self.to_weights = nn.Linear(d_model, n_heads * curves)
        self.bank = nn.Parameter(torch.empty(curves, max_dist if causal else 2 * max_dist - 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.to_weights.reset_parameters()
        nn.init.normal_(self.bank, std=BANK_STD)

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``q (B, H, L, D)`` with the weights ``w(x) (B, H, L, R)`` appended, ``k`` with ``R``
        zeros: ``(B, H, L, D + R)`` each."""
        b, length, _ = x.shape
        weights = self.to_weights(x).view(b, length, self.n_heads, self.curves).transpose(1, 2)
        zeros = k.new_zeros(*k.shape[:-1], self.curves)
        return torch.cat([q, weights.to(q.dtype)], -1), torch.cat([k, zeros], -1), None

    def score_scale(self, q: Tensor) -> float:
        """``1/sqrt(D)`` of the head dim before the weights were appended."""
        return (q.shape[-1] - self.curves) ** -0.5

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """``(B, H, Lq, Lk)``: each query's weights times the bank's curves at its distances
        (``call.context``: :func:`bank_columns` of the call, made once per forward)."""
        columns, valid = call.context
        curves = self.bank[:, columns]  # (R, Lq, Lk)
        bias = torch.einsum("bhir,rij->bhij", q[..., -self.curves :], curves.to(q.dtype))
        return bias.masked_fill(~valid, 0.0)


class ProjectedBiasEncoding(StackEncoding):
    """The projected relative bias in every self-attention layer (module docstring).

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        curves: ``R``, the bank's distance curves (the reference's ``num_distance_basis``: 16).
        max_dist: the reference's ``max_dist`` (512).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = "a bank over signed distances (the author's N-D form); decoder: causal"
    speed_target = 1.5
    augment_modes = frozenset({"random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        curves: int = 16,
        max_dist: int = 512,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if isinstance(curves, bool) or not isinstance(curves, int) or curves < 1:
            raise ValueError(f"projected_bias: curves={curves!r} must be a positive integer")
        if isinstance(max_dist, bool) or not isinstance(max_dist, int) or max_dist < 1:
            raise ValueError(f"projected_bias: max_dist={max_dist!r} must be a positive integer")
        self.curves, self.max_dist = curves, max_dist

    def context(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """:func:`bank_columns` of the call, shared by every layer's rule."""
        return bank_columns(q_pos, k_pos, self.max_dist, self.causal)

    def self_rule(self, layer: int) -> AttentionRule:
        return ProjectedBiasRule(
            self.d_model, self.n_heads, self.curves, self.max_dist, self.causal
        )
