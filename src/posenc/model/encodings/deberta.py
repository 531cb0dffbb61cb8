"""DeBERTa's disentangled attention (He, Liu, Gao & Chen, arXiv 2020, ICLR 2021), ``pe=deberta``.

No position is added to the inputs. Each layer scores query ``i`` against key ``j`` with three
terms (the paper's eq. 4, ``D`` the head dim)::

    A_ij = ( q_i . k_j                     content-to-content   (c2c)
           + q_i . K^r_{delta(i, j)}       content-to-position  (c2p)
           + k_j . Q^r_{delta(j, i)} )     position-to-content  (p2c, see p2c_distance)
           / sqrt(3 D)

with ``K^r = P W_{k,r}`` and ``Q^r = P W_{q,r} + b_{q,r}``: ``P`` is a learned table of ``2k``
relative-position embeddings (width ``d``) shared by every layer of the stack, and the two
projections belong to each layer (the paper's form and DeBERTa's own default; DeBERTa-v2's
``share_att_key``, which reuses the layer's content projections for ``P``, is not offered: an
attention rule sees q and k, not the projections that made them). As in the authors' v1 code,
``W_{k,r}`` has no bias (a bias there adds ``q_i . b``, the same for every key, which the softmax
cancels) and ``W_{q,r}`` has one. The relative distance is the paper's

    delta(i, j) = clip(i - j, -k, k - 1) + k        (rows 0 .. 2k - 1 of P)

and, with ``position_buckets = S > 0`` (DeBERTa-v2), ``i - j`` is first mapped to its
logarithmic bucket (:func:`log_bucket_position`: exact up to ``|i - j| <= S/2``, then bins
widening logarithmically up to ``S - 1`` at ``|i - j| = max_relative_positions - 1``), and ``k``
is ``S``: ``P`` has ``2 S`` rows, as in transformers.

Which distance p2c reads (``p2c_distance``): the paper's eq. 4 and its Algorithm 1 take
``Q^r_{delta(j, i)}``, the position of the query seen from the key (``j-i``, the default). The
authors' code and transformers' DeBERTa and DeBERTa-v2 gather ``k Q^r^T`` with ``-(i - j)`` and
then transpose it, which reads ``Q^r_{delta(i, j)}``, the row c2p reads too (``i-j``; the tests
check both against a loop reference and the second against transformers). The two differ only
in which rows of ``P`` the p2c term sees; every pretrained DeBERTa checkpoint used ``i-j``.

Initialisation: ``P ~ N(0, 0.02^2)`` (DeBERTa's ``initializer_range``); the projections as
posenc initialises the content projections they parallel (Xavier-uniform weights, zero bias).

Where it applies:

* encoder self-attention: the paper's form (DeBERTa is a bidirectional encoder);
* decoder self-attention: the same three terms under the causal mask (only ``i - j >= 0`` is
  ever attended, so c2p reads rows ``k..2k-1`` and p2c rows ``0..k``, or ``k..2k-1`` with
  ``i-j``); a translation decoder is causal, DeBERTa itself never is;
* cross-attention: plain content attention (source and target positions share no axis).

Left out: the enhanced mask decoder, which adds absolute positions to the last layers' queries
to predict masked tokens. It is a pre-training head of the masked language model, not part of
the attention: posenc's decoder predicts the next target token from a causal prefix, where the
relative terms already place every token, and mixing an absolute encoding in would compare
DeBERTa-plus-absolute against the other encodings. Also left out: the dropout DeBERTa applies
to ``P`` (posenc applies none to any position table).

Fast path: the stack picks once per forward, in :meth:`DeBERTaEncoding.context`, the rows of
``P`` that the call's pairs use (at most ``Lq + Lk - 1`` of the ``2k``; transformers projects all
``2k``) and the row indices, shared by every layer. Each layer projects those rows (independent
of the batch), multiplies them with q (c2p) and with k (p2c): ``(B, H, L, n)`` scores, about
twice the multiply-adds of ``q k^T`` each at ``n = 2L - 1``, gathered into the
``(B, H, Lq, Lk)`` bias. SDPA adds it to ``q k^T`` with its ``scale = 1/sqrt(3D)``.

Incremental decoding: the cache holds plain keys and values; each decoder call gathers the rows
for its queries at ``call.q_pos`` and all cached keys (p2c multiplies every cached key with the
rows present, ``t + 1`` rows at step ``t``). transformers' DeBERTa-v2 builds p2c for
``Lq != Lk`` from key-to-key positions (with its bucket arguments swapped); posenc uses the
absolute positions of the call, which gives the same ``delta`` for any block of queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
from posenc.model.encodings.common import gather_rows, used_rows


def log_bucket_position(relative: Tensor, buckets: int, max_position: int) -> Tensor:
    """DeBERTa-v2's bucket (long, same shape) of each signed ``relative`` position.

    With ``m = buckets // 2``: ``|r| <= m`` keeps ``r``; beyond, ``sign(r) * (m + ceil((m - 1)
    log(|r| / m) / log((max_position - 1) / m)))``, so ``|r| = max_position - 1`` lands on
    ``2m - 1`` and larger distances keep growing slowly (the caller clips them).
    """
    mid = buckets // 2
    magnitude = relative.abs()
    # Same operation order and float32 constant as transformers, so bin edges round alike; the
    # clamp keeps the log of the exact (unused) entries finite.
    widest = torch.log(torch.tensor((max_position - 1) / mid, device=relative.device))
    log_position = torch.ceil(torch.log(magnitude.clamp(min=mid) / mid) / widest * (mid - 1)) + mid
    return torch.where(magnitude <= mid, relative, (log_position * relative.sign()).long())


@dataclass
class DisentangledPositions:
    """The rows of ``P`` one forward uses, shared by every layer of the stack.

    Attributes:
        key_rows: ``(n1, d)`` rows of ``P`` that c2p projects to ``K^r``.
        c2p_index: ``(Lq, Lk)`` long, the row of ``key_rows`` at ``delta(i, j)``.
        query_rows: ``(n2, d)`` rows of ``P`` that p2c projects to ``Q^r``.
        p2c_index: ``(Lk, Lq)`` long, the row of ``query_rows`` at ``delta(j, i)`` (or at
            ``delta(i, j)``, see ``p2c_distance``).
    """

    key_rows: Tensor
    c2p_index: Tensor
    query_rows: Tensor
    p2c_index: Tensor


class DisentangledRule(AttentionRule):
    """One layer's disentangled attention; its own ``W_{k,r}`` and ``W_{q,r}``.

    Args:
        d_model: width ``d`` of ``P`` and of both projections (``d -> d = H*D``).

    ``call.context`` must be the stack's :class:`DisentangledPositions`.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.pos_key_proj = nn.Linear(d_model, d_model, bias=False)  # W_{k,r}
        self.pos_query_proj = nn.Linear(d_model, d_model)  # W_{q,r}, b_{q,r}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.pos_key_proj.weight)
        nn.init.xavier_uniform_(self.pos_query_proj.weight)
        nn.init.zeros_(self.pos_query_proj.bias)

    @staticmethod
    def scale(q: Tensor) -> float:
        """``1 / sqrt(3 D)``: three terms of ``D`` products each."""
        return 1.0 / math.sqrt(3 * q.shape[-1])

    @staticmethod
    def _per_head(projected: Tensor, heads: int) -> Tensor:
        """``(n, H*D)`` projected rows as ``(H, D, n)``."""
        return projected.view(projected.shape[0], heads, -1).permute(1, 2, 0)

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """``(c2p + p2c) / sqrt(3D)``, ``(B, H, Lq, Lk)``."""
        context: DisentangledPositions = call.context
        heads = q.shape[1]
        key_r = self._per_head(self.pos_key_proj(context.key_rows), heads)
        query_r = self._per_head(self.pos_query_proj(context.query_rows), heads)
        c2p = gather_rows(q @ key_r, context.c2p_index)  # (B, H, Lq, Lk)
        p2c = gather_rows(k @ query_r, context.p2c_index).transpose(-1, -2)  # (B, H, Lq, Lk)
        return (c2p + p2c) * self.scale(q)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        scores = q @ k.transpose(-1, -2) * self.scale(q)
        return masked_softmax(scores + self.bias(q, k, key_state, call).to(scores.dtype), call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        mask = additive_mask(self.bias(q, k, key_state, call), call, q.dtype)
        return sdpa(q, k, v, mask, call.dropout_p, self.scale(q))


class DeBERTaEncoding(StackEncoding):
    """DeBERTa's disentangled attention in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        max_relative_positions: ``k``, the clipping distance (DeBERTa-base: 512); with buckets,
            the distance the logarithmic bins reach at their last bucket.
        position_buckets: ``0``: the paper's clipping; ``> 0`` (DeBERTa-v2: 256): log buckets,
            and ``P`` has ``2 * position_buckets`` rows.
        init_std: ``P`` starts ``N(0, init_std^2)`` (DeBERTa: 0.02).
        p2c_distance: ``j-i``: p2c reads ``Q^r_{delta(j, i)}`` (the paper's eq. 4); ``i-j``:
            ``Q^r_{delta(i, j)}`` (the authors' code and transformers).
    """

    applies_to = "encoder and decoder self-attention (c2c + c2p + p2c); plain cross-attention"
    speed_target = 1.35
    augment_modes = frozenset({"random"})
    P2C_DISTANCES = ("j-i", "i-j")
    option_forms = ({"position_buckets": 256}, {"p2c_distance": "i-j"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_relative_positions: int = 512,
        position_buckets: int = 0,
        init_std: float = 0.02,
        p2c_distance: str = "j-i",
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if max_relative_positions < 1:
            raise ValueError(f"deberta: max_relative_positions={max_relative_positions} < 1")
        if position_buckets > 0 and not 1 <= position_buckets // 2 < max_relative_positions - 1:
            raise ValueError(
                f"deberta: position_buckets={position_buckets} needs 1 <= position_buckets // 2 "
                f"< max_relative_positions - 1 = {max_relative_positions - 1}"
            )
        if p2c_distance not in self.P2C_DISTANCES:
            known = ", ".join(self.P2C_DISTANCES)
            raise ValueError(f"deberta: p2c_distance={p2c_distance!r} is unknown; use {known}")
        self.max_relative_positions = max_relative_positions
        self.position_buckets = max(position_buckets, 0)
        self.span = self.position_buckets or max_relative_positions
        self.init_std = init_std
        self.p2c_distance = p2c_distance
        self.table = nn.Parameter(torch.empty(2 * self.span, d_model))  # P
        distances = (
            f"clip(i-j, -k, k-1) + k, k={max_relative_positions}"
            if not self.position_buckets
            else f"DeBERTa-v2 log buckets of i-j ({self.position_buckets} up to "
            f"{max_relative_positions})"
        )
        self.encoder_form = f"the paper's, both directions: {distances}; p2c at {p2c_distance}"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table, std=self.init_std)

    def relative_index(self, relative: Tensor) -> Tensor:
        """``delta``: the row of ``P`` (long, same shape) of each signed ``relative`` position
        (``i - j`` for c2p; ``j - i`` or ``i - j`` for p2c)."""
        if self.position_buckets:
            relative = log_bucket_position(
                relative, self.position_buckets, self.max_relative_positions
            )
        return (relative + self.span).clamp(0, 2 * self.span - 1)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> DisentangledPositions:
        """The rows of ``P`` and their indices for queries at ``q_pos (Lq,)`` and keys at
        ``k_pos (Lk,)``; the decoder's future keys (masked later) take distance 0."""
        relative = q_pos[:, None] - k_pos[None, :]  # i - j
        if self.causal:
            relative = relative.clamp(min=0)
        key_rows, c2p_index = used_rows(self.relative_index(relative))
        p2c_relative = -relative.T if self.p2c_distance == "j-i" else relative.T  # (Lk, Lq)
        query_rows, p2c_index = used_rows(self.relative_index(p2c_relative))
        return DisentangledPositions(
            self.table[key_rows], c2p_index, self.table[query_rows], p2c_index
        )

    def self_rule(self, layer: int) -> DisentangledRule:
        return DisentangledRule(self.d_model)
