"""TUPE, Transformer with untied positional encoding (Ke, He & Liu, ICLR 2021, "Rethinking
Positional Encoding in Language Pre-training"; official code guolinke/TUPE).

No positions are added to the input. Each self-attention logit is the sum of a content term and
a positional term, each with its own projections and both scaled by ``1/sqrt(2D)`` (``D`` the
head dim, as the official code's ``head_dim * 2``), so that the sum has the variance of one
plain logit::

    a_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2D) + (p_i U^Q)(p_j U^K)^T / sqrt(2D) [+ b_(j-i)]

* ``p``: a learned table of ``max_len`` absolute positions, passed through a LayerNorm before
  the projections (as the official code), one per stack; positions from ``max_len`` on reuse
  its last row (``clamp``);
* ``U^Q, U^K``: ``d -> d`` projections (with bias), split into the heads like ``W^Q, W^K``, so
  every head has its own positional correlation;
* ``b_(j-i)`` (``relative: true``, the paper's TUPE-R): T5's bucketed relative bias, one
  ``(num_buckets, H)`` table per stack (bidirectional buckets in the encoder, causal in the
  decoder, :func:`posenc.model.encodings.common.relative_position_bucket`). TUPE-R is the default:
  it is the paper's better variant, the one its pre-training command trains (``--rel-pos``) and
  the only checkpoint it releases; ``relative: false`` gives TUPE-A.

The table, LayerNorm, projections and relative table are shared by all layers of a stack, as in
the paper and its code (the positional term is computed once per forward and handed to every
layer). Everything starts ``N(0, 0.02)`` with zero biases (BERT's initialisation, which the
official model applies to all of its modules, the relative table included).

[CLS] untying: the paper's BERT also replaces the positional term of the ``[CLS]`` token (its row
and column) by two learned constants, so that ``[CLS]`` is not tied to position 0. Translation
has no ``[CLS]`` token: this form is ``[CLS]``-free, every position is an ordinary one.

Where it applies: encoder self-attention (the paper's bidirectional form) and decoder
self-attention (the same term under the causal mask; the decoder has its own table and
projections). Cross-attention is plain ``1/sqrt(D)`` attention: TUPE has no cross-attention, and
source and target positions do not lie on one axis.

Incremental decoding: the positional term of the new queries at ``call.q_pos`` against every
cached key at ``call.k_pos`` is rebuilt from the positions alone (``Lk`` table rows through the
LayerNorm and ``U^K``), so nothing extra is cached.

Cost: ``(Lq + Lk) d^2`` for the projections and ``H Lq Lk D`` for the ``(H, Lq, Lk)`` term, once
per forward and stack; the attention then runs SDPA with that bias (``scale = 1/sqrt(2D)``), as
T5's does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    additive_mask,
    masked_softmax,
    sdpa,
)
from posenc.model.encodings.common import relative_position_bucket


class UntiedRule(AttentionRule):
    """Softmax attention over ``q k^T / sqrt(2D) + call.context``, where the context is the
    stack's positional term ``(1, H, Lq, Lk)`` (already scaled)."""

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        return call.context

    @staticmethod
    def scale(q: Tensor) -> float:
        """``1/sqrt(2D)`` for heads of ``D = q.shape[-1]`` dims."""
        return 1.0 / math.sqrt(2 * q.shape[-1])

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        scores = q @ k.transpose(-1, -2) * self.scale(q) + call.context.to(q.dtype)
        return masked_softmax(scores, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        mask = additive_mask(call.context, call, q.dtype)
        return sdpa(q, k, v, mask, call.dropout_p, self.scale(q))


class TupeEncoding(StackEncoding):
    """Untied positional correlation (and, with ``relative``, T5's bias), one set per stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        max_len: rows of the position table (the paper: 512).
        clamp: positions from ``max_len`` on reuse the last row (the default, so that any
            length runs, as the extrapolation study needs); False raises a ValueError instead.
        relative: add T5's bucketed relative bias (TUPE-R, the default) or not (TUPE-A).
        num_buckets, max_distance: T5's buckets (the official code: 32 and 128).
        init_std: standard deviation of the table, projections and relative table (BERT: 0.02).
    """

    applies_to = (
        "encoder and decoder self-attention (untied positional term); plain cross-attention"
    )
    speed_target = 1.35
    augment_modes = frozenset({"shift", "random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_len: int = 512,
        clamp: bool = True,
        relative: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.max_len = max_len
        self.clamp = clamp
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.init_std = init_std
        self.table = nn.Parameter(torch.empty(max_len, d_model))
        self.norm = nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, d_model)  # U^Q, all heads
        self.key = nn.Linear(d_model, d_model)  # U^K, all heads
        self.relative_table = nn.Parameter(torch.empty(num_buckets, n_heads)) if relative else None
        self.rule = UntiedRule()
        variant = "+ T5 bidirectional buckets (TUPE-R)" if relative else "(TUPE-A)"
        self.encoder_form = f"the paper's, [CLS]-free: (p_i U^Q)(p_j U^K)^T/sqrt(2D) {variant}"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight in (self.table, self.query.weight, self.key.weight, self.relative_table):
            if weight is not None:
                nn.init.normal_(weight, std=self.init_std)
        nn.init.zeros_(self.query.bias)
        nn.init.zeros_(self.key.bias)
        self.norm.reset_parameters()

    def rows(self, positions: Tensor) -> Tensor:
        """Table rows of ``positions (L,)``: the positions, checked against ``max_len`` (or
        clamped to its last row)."""
        if positions.numel() and int(positions.max()) >= self.max_len:
            if not self.clamp:
                raise ValueError(
                    f"TUPE positions: the {self.site.value} input reaches position "
                    f"{int(positions.max())} but the table has pe.max_len={self.max_len}; "
                    "raise pe.max_len or set pe.clamp=true"
                )
            positions = positions.clamp(max=self.max_len - 1)
        return positions

    def projected(self, positions: Tensor, projection: nn.Linear) -> Tensor:
        """``(H, L, D)``: the normalised table rows of ``positions (L,)`` through ``projection``
        (``U^Q`` or ``U^K``), split into heads."""
        p = projection(self.norm(self.table[self.rows(positions)]))
        return p.view(len(positions), self.n_heads, -1).transpose(0, 1)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The positional term ``(1, H, Lq, Lk)`` of queries at ``q_pos (Lq,)`` and keys at
        ``k_pos (Lk,)``: ``(p_i U^Q)(p_j U^K)^T / sqrt(2D)`` per head, plus ``b_(j-i)``."""
        pos_q, pos_k = self.projected(q_pos, self.query), self.projected(k_pos, self.key)
        term = pos_q @ pos_k.transpose(-1, -2) * UntiedRule.scale(pos_q)
        if self.relative_table is not None:
            buckets = relative_position_bucket(
                k_pos[None, :] - q_pos[:, None],
                bidirectional=not self.causal,
                num_buckets=self.num_buckets,
                max_distance=self.max_distance,
            )
            term = term + self.relative_table.t()[:, buckets]
        return term[None]

    def self_rule(self, layer: int) -> AttentionRule:
        return self.rule
