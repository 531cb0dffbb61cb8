"""Contextual Position Encoding, CoPE (Golovneva et al. 2024, "Contextual Position Encoding:
Learning to Count What's Important"; reference code facebookresearch/RAM ``projects/cope``).

A query decides which keys count as a step of position. For query ``i`` and key ``j <= i``
(decoder, causal, the paper's form)::

    g_it = sigmoid(q_i . k_t / sqrt(D))                      gates; masked keys give 0
    p_ij = min(sum_{t=j..i} g_it, npos - 1)                  fractional position of key j
    z_i[p] = q_i . e[p]                                      p = 0 .. npos-1, e learned
    z_i[p_ij] = (p_ij - floor p_ij) z_i[ceil p_ij] + (1 - p_ij + floor p_ij) z_i[floor p_ij]
    a_ij = softmax_j((q_i . k_j + z_i[p_ij]) / sqrt(D))

as in the reference: the gate logits are the attention logits divided by ``sqrt(D)``, the
position logits are added before that division, and the scalar ``q_i . e[p]`` is interpolated
(the paper's optimised form, equal to interpolating ``e`` because ``q . e`` is linear in ``e``).
It is computed as ``z_i[floor p] + frac(p) (z_i[floor p + 1] - z_i[floor p])``: one gather from
the table of ``q . e`` and one from the table of ``q . (e[p+1] - e[p])``. Each layer owns one
table ``e (npos, D)`` shared by its heads, initialised to zero as in the reference. Logits,
gates and positions are float32 whatever the autocast dtype (float64 in a float64 model). A
single additive ``0 / -inf`` mask on the content logits masks both the gates
(``sigmoid(-inf) = 0``) and the softmax.

Where it applies: encoder and decoder self-attention; cross-attention is plain softmax
(source and target positions do not lie on one axis).

Encoder (bidirectional) form, chosen here: positions are counted from the query outward in both
directions, ``p_ij = sum of the gates g_it for t between j and i inclusive``, and keys after the
query read a second table ``e_after (npos, D)``. For keys ``j <= i`` this is exactly the
decoder's formula; the second table keeps the direction known, which counting alone cannot (a
key one gate-step to the left and one to the right would otherwise look the same). The
reference applies its causal formula with a padding-only mask in the encoder, which counts from
each key to the end of the sequence, i.e. measures positions from the sequence end rather than
from the query. The encoder's counts come from one cumulative sum ``C`` over keys,
``p_ij = |C_ij - C_ii| + g_i,nearer end``; the subtraction costs about ``1e-7 * C`` of absolute
precision, harmless for an interpolated position.

Incremental decoding needs no extra state: the newest query recomputes its gates over the cached
keys; earlier rows never change because a query's gates depend only on its own row. The decoder
works on keys in reversed order internally, so the count from the query back to each key is an
exact plain cumulative sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
)


@dataclass
class CoPEContext:
    """Position-only tensors shared by every layer of a stack.

    Attributes:
        bias: decoder only: ``(Lq, Lk)`` float, ``-inf`` at future keys and 0 elsewhere, keys
            in reversed order (column ``r`` is key ``Lk - 1 - r``); None when every key is
            visible (a single newest query).
        before: encoder only: ``(Lq, Lk)`` bool, True where key ``j`` is at or before query
            ``i``.
        own: encoder only: ``(Lq, 1)`` long, the index of each query's own key.
        table_offset: encoder only: ``(Lq, Lk)`` long, 0 for keys at or before the query and
            ``npos`` for keys after it: the row offset into the stacked
            ``[e_before; e_after]`` table.
    """

    bias: Tensor | None = None
    before: Tensor | None = None
    own: Tensor | None = None
    table_offset: Tensor | None = None


class CoPERule(AttentionRule):
    """CoPE self-attention for one layer: explicit softmax over content + contextual-position
    logits.

    Args:
        head_dim: ``D``.
        npos: number of integer positions ``0 .. npos-1``; counts are clamped at ``npos - 1``.
        bidirectional: encoder form (two tables, counting outward from the query) if True,
            the paper's causal form otherwise.
    """

    def __init__(self, head_dim: int, npos: int, bidirectional: bool) -> None:
        super().__init__()
        self.npos = npos
        self.bidirectional = bidirectional
        sides = 2 if bidirectional else 1
        self.pos_emb = nn.Parameter(torch.zeros(sides * npos, head_dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.pos_emb)

    def _inner(self, x: Tensor, key_dim: int) -> Tensor:
        """``x`` with its key dimension in the rule's internal order (reversed in the
        decoder); the map is its own inverse."""
        return x if self.bidirectional else x.flip(key_dim)

    def _content(self, q: Tensor, k: Tensor, call: AttentionCall) -> Tensor:
        """Masked content logits ``(B, H, Lq, Lk)`` float32 from the scaled float32 query
        ``q / sqrt(D)``, keys in internal order."""
        content = q @ self._inner(k.to(q.dtype), -2).transpose(-1, -2)
        bias = call.context.bias
        if call.key_padding_mask is not None:
            padding = self._inner(call.key_padding_mask, -1)[:, None, None, :]
            pad_bias = torch.zeros(padding.shape, device=q.device).masked_fill(padding, -math.inf)
            bias = pad_bias if bias is None else bias + pad_bias
        return content if bias is None else content + bias

    def _positions(self, gates: Tensor, call: AttentionCall) -> Tensor:
        """Clamped positions ``(B, H, Lq, Lk)`` from masked gates (internal key order)."""
        if self.bidirectional:
            ctx: CoPEContext = call.context
            own = ctx.own.expand(*gates.shape[:-1], 1)
            counts = gates.cumsum(-1)
            nearer_end = torch.where(ctx.before, gates, gates.gather(-1, own))
            positions = (counts - counts.gather(-1, own)).abs() + nearer_end
        else:
            positions = gates.cumsum(-1)
        return positions.clamp(max=self.npos - 1)

    def positions(self, q: Tensor, k: Tensor, call: AttentionCall) -> Tensor:
        """Clamped contextual positions ``p (B, H, Lq, Lk)``, float32, keys in natural order
        (0 at masked keys)."""
        with torch.autocast(q.device.type, enabled=False):
            q = q.to(compute_dtype(q)) / math.sqrt(q.shape[-1])
            positions = self._positions(torch.sigmoid(self._content(q, k, call)), call)
        return self._inner(positions, -1)

    def _attention(self, q: Tensor, k: Tensor, call: AttentionCall) -> Tensor:
        """Attention probabilities ``(B, H, Lq, Lk)`` float32, keys in internal order."""
        with torch.autocast(q.device.type, enabled=False):
            q = q.to(compute_dtype(q)) / math.sqrt(q.shape[-1])
            content = self._content(q, k, call)
            positions = self._positions(torch.sigmoid(content), call)
            index = positions.long()  # floor: positions are >= 0
            frac = positions.frac()
            table = self.pos_emb.to(q.dtype).view(-1, self.npos, q.shape[-1])  # (sides, npos, D)
            slope = torch.cat([table.diff(dim=1), torch.zeros_like(table[:, :1])], dim=1)
            if self.bidirectional:
                index = index + call.context.table_offset
            at_floor = (q @ table.flatten(0, 1).t()).gather(-1, index)  # q . e[floor p]
            rise = (q @ slope.flatten(0, 1).t()).gather(-1, index)  # q . (e[p+1] - e[p])
            return torch.softmax(torch.addcmul(content + at_floor, frac, rise), dim=-1)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return self._inner(self._attention(q, k, call), -1).to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        attn = self._attention(q, k, call)
        attn = F.dropout(attn, p=call.dropout_p, training=call.dropout_p > 0)
        return attn.to(v.dtype) @ self._inner(v, -2)


class CoPEEncoding(StackEncoding):
    """CoPE for one stack: a :class:`CoPERule` (own table) in every self-attention layer.

    Args:
        npos: integer positions per table (the paper's ``npos``); counts are clamped at
            ``npos - 1``.
    """

    applies_to = "encoder and decoder self-attention (per-layer tables shared by heads)"
    encoder_form = "count gates from the query outward; a second table for keys after the query"
    speed_target = 2.0

    def __init__(
        self, site: Site, d_model: int, n_heads: int, n_layers: int, npos: int = 64
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if npos < 2:
            raise ValueError(f"cope needs npos >= 2, got {npos}")
        self.npos = npos
        head_dim = d_model // n_heads
        self.rules = nn.ModuleList(
            CoPERule(head_dim, npos, bidirectional=not self.causal) for _ in range(n_layers)
        )

    def context(self, q_pos: Tensor, k_pos: Tensor) -> CoPEContext:
        if self.causal:
            future = k_pos.flip(0)[None, :] > q_pos[:, None]
            if not bool(future.any()):
                return CoPEContext()
            zeros = torch.zeros(future.shape, device=q_pos.device)
            return CoPEContext(bias=zeros.masked_fill(future, -math.inf))
        before = k_pos[None, :] <= q_pos[:, None]
        return CoPEContext(
            before=before,
            own=(q_pos - k_pos[0])[:, None],
            table_offset=(~before).long() * self.npos,
        )

    def self_rule(self, layer: int) -> AttentionRule:
        return self.rules[layer]
