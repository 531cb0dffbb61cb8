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

Nothing of shape ``(Lq, Lk, D)`` is built, and nothing is scattered: both relative terms are
products over the ``R`` distinct distances (``R = 2k + 1``, or ``k + 1`` causal) with the
one-hot distance table ``P (Lq, Lk, R)``, ``P[i, j, r] = 1`` where key ``j`` lies at row ``r``
from query ``i``. The key term is ``(q a^K^T) P^T`` per query (``q @ a^K^T`` gives the ``R``
distinct terms, the product spreads them over the keys), the value term ``(w P) a^V`` (the
product sums the attention weights ``w`` into their distance buckets). A gather and a
scatter_add over an index table compute the same, but their backward passes add many weights
into few buckets with atomics: on an H100 that scatter took 16.3 ms of rpe's 80 ms
``model=base`` step (METHODS.md, section 9). ``P`` depends only on positions, so the stack
builds it once per forward from ``q_pos``/``k_pos`` (which also serves cached decoding, where
the single query sits at the newest position); it holds ``Lq * Lk * R`` numbers (2.2 MB in
float32 at ``Lq = Lk = 128``, ``k = 16``).
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


def distance_table(q_pos: Tensor, k_pos: Tensor, max_distance: int, causal: bool) -> Tensor:
    """The one-hot distance table ``P (Lq, Lk, R)`` float32: ``P[i, j, r] = 1`` where
    :func:`relative_index` puts key ``j`` at row ``r`` from query ``i``, ``R = k + 1`` causal,
    ``2k + 1`` otherwise."""
    rows = max_distance + 1 if causal else 2 * max_distance + 1
    index = relative_index(q_pos, k_pos, max_distance, causal)
    return F.one_hot(index, rows).to(torch.float32)


class ShawRule(AttentionRule):
    """One layer's self-attention with key and value relative embeddings.

    Args:
        head_dim: ``D``, the width of each table row.
        n_distances: rows per table: ``2k + 1`` (bidirectional) or ``k + 1`` (causal).

    ``call.context`` must be the ``(Lq, Lk, R)`` one-hot table of :func:`distance_table`.
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

    def _scores(self, q: Tensor, k: Tensor, table: Tensor) -> Tensor:
        """Logits ``(B, H, Lq, Lk)``: ``(q k^T + (q a^K^T) P^T) / sqrt(D)``, ``table`` being
        ``P`` in ``q``'s dtype."""
        q = q * (1.0 / math.sqrt(q.shape[-1]))
        per_distance = q @ self.key_table.to(q.dtype).T  # (B, H, Lq, R)
        relative = torch.einsum("bhir,ijr->bhij", per_distance, table)
        return q @ k.transpose(-1, -2) + relative

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return masked_softmax(self._scores(q, k, call.context.to(q.dtype)), call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        table = call.context.to(q.dtype)  # once for both terms
        weights = masked_softmax(self._scores(q, k, table), call)
        if call.dropout_p > 0:
            weights = F.dropout(weights, p=call.dropout_p)
        # bucket masses (B, H, Lq, R): the weights summed per distance
        mass = torch.einsum("bhij,ijr->bhir", weights, table)
        return weights @ v + mass @ self.value_table.to(weights.dtype)


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
        """The ``(Lq, Lk, R)`` one-hot distance table shared by every layer."""
        return distance_table(q_pos, k_pos, self.max_relative_position, self.causal)

    def self_rule(self, layer: int) -> ShawRule:
        k = self.max_relative_position
        return ShawRule(self.d_model // self.n_heads, k + 1 if self.causal else 2 * k + 1)
