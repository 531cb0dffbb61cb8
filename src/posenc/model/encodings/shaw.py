"""Relative position representations of Shaw et al. 2018 (``rpe``).

Each self-attention layer learns two tables of relative-distance embeddings, ``a^K`` and
``a^V`` (rows of head dim ``D``, shared by all heads), indexed by the clipped distance
``clip(j - i, -k, k)`` from query ``i`` to key ``j``. With ``a_ij = table[clip(j - i, -k, k) + k]``
(paper eqs. 3-4, ``D`` the head dim):

    e_ij = (q_i . k_j + q_i . a^K_ij) / sqrt(D)
    z_i  = sum_j softmax_j(e_ij) (v_j + a^V_ij)

Where it applies: encoder self-attention (distances ``-k..k``, the paper's form) and decoder
self-attention (causal: only ``j <= i`` is ever attended, so its tables hold the ``k + 1``
distances ``-k..0``); not cross-attention, whose source and target positions share no axis.

Nothing of shape ``(Lq, Lk, D)`` is built: ``q @ a^K^T`` gives the ``2k + 1`` distinct key
terms per query, which are gathered into the logits by the ``(Lq, Lk)`` index table; the
attention weights are summed into their distance buckets (scatter_add) and the
``(B, H, Lq, 2k + 1)`` bucket masses multiply ``a^V``. One-hot matmuls in place of the gather
and the scatter_add were at most ~20% faster for those two steps on CPU at L=128, but need an
``(Lq, Lk, 2k + 1)`` table. The index table depends only on positions, so the stack builds it
once per forward from ``q_pos``/``k_pos`` (which also serves cached decoding, where the single
query sits at the newest position).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
    masked_softmax,
)


def relative_index(q_pos: Tensor, k_pos: Tensor, max_distance: int, causal: bool) -> Tensor:
    """Table rows ``(Lq, Lk)`` long for queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``.

    Row ``clip(k_pos[j] - q_pos[i], -k, k) + k``: distance ``-k`` (or further left) is row 0,
    distance 0 is row ``k``, distance ``+k`` (or further right) is row ``2k``. With ``causal``
    the upper clip is 0, so a causal table needs only rows ``0..k`` (keys to the right of a
    query are masked, whatever row they get).
    """
    distance = k_pos[None, :] - q_pos[:, None]
    return distance.clamp(-max_distance, 0 if causal else max_distance) + max_distance


class ShawRule(AttentionRule):
    """One layer's self-attention with key and value relative embeddings.

    Args:
        head_dim: ``D``, the width of each table row.
        n_distances: rows per table: ``2k + 1`` (bidirectional) or ``k + 1`` (causal).

    ``call.context`` must be the ``(Lq, Lk)`` index table of :func:`relative_index`.
    """

    def __init__(self, head_dim: int, n_distances: int) -> None:
        super().__init__()
        self.key_table = nn.Parameter(torch.empty(n_distances, head_dim))
        self.value_table = nn.Parameter(torch.empty(n_distances, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # tensor2tensor's default "uniform_unit_scaling" initialiser (variance scaling, fan_avg,
        # uniform), which is Xavier-uniform on the (distances, D) variable.
        nn.init.xavier_uniform_(self.key_table)
        nn.init.xavier_uniform_(self.value_table)

    def _scores(self, q: Tensor, k: Tensor, index: Tensor) -> Tensor:
        """Logits ``(B, H, Lq, Lk)``: ``(q k^T + gather(q a^K^T)) / sqrt(D)``."""
        q = q * (1.0 / math.sqrt(q.shape[-1]))
        per_distance = q @ self.key_table.to(q.dtype).T  # (B, H, Lq, R)
        b, h, lq, _ = q.shape
        relative = per_distance.gather(-1, index.expand(b, h, lq, index.shape[-1]))
        return q @ k.transpose(-1, -2) + relative

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return masked_softmax(self._scores(q, k, call.context), call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        index = call.context
        weights = self.weights(q, k, key_state, call)
        if call.dropout_p > 0:
            weights = F.dropout(weights, p=call.dropout_p)
        # Bucket masses (B, H, Lq, R), summed in at least float32 (a far bucket collects up to
        # Lk weights).
        dtype = compute_dtype(weights)
        mass = weights.new_zeros(*weights.shape[:-1], self.value_table.shape[0], dtype=dtype)
        mass = mass.scatter_add(-1, index.expand_as(weights), weights.to(dtype))
        return weights @ v + (mass @ self.value_table.to(dtype)).to(weights.dtype)


class ShawEncoding(StackEncoding):
    """Shaw et al. 2018 relative key/value embeddings in every self-attention layer.

    Args:
        max_relative_position: the clipping distance ``k`` (paper: 16).
    """

    applies_to = "encoder and decoder self-attention (a^K, a^V per layer); not cross-attention"
    encoder_form = "the paper's: distances clip(j - i, -k, k), both directions"
    speed_target = 1.35
    augment_modes = frozenset({"random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_relative_position: int = 16,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if max_relative_position < 1:
            raise ValueError(f"rpe needs max_relative_position >= 1, got {max_relative_position}")
        self.max_relative_position = max_relative_position

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The ``(Lq, Lk)`` table-row index shared by every layer."""
        return relative_index(q_pos, k_pos, self.max_relative_position, self.causal)

    def self_rule(self, layer: int) -> ShawRule:
        k = self.max_relative_position
        return ShawRule(self.d_model // self.n_heads, k + 1 if self.causal else 2 * k + 1)
