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
It is computed as ``z_i[floor p] + frac(p) (z_i[floor p + 1] - z_i[floor p])``, one gather from
the table and one from its slopes. Each layer owns one table ``e (npos, D)`` shared by its
heads, initialised to zero as in the reference. Logits and positions are float32 whatever the
autocast dtype.

Where it applies: encoder and decoder self-attention; cross-attention is plain softmax
(source and target positions do not lie on one axis).

Encoder (bidirectional) form, chosen here: positions are counted from the query outward in both
directions, ``p_ij = sum of the gates g_it for t between j and i inclusive``, and keys after the
query read a second table ``e_after (npos, D)``. For keys ``j <= i`` this is exactly the
decoder's formula; the second table keeps the direction known, which counting alone cannot (a
key one gate-step to the left and one to the right would otherwise look the same). The
reference applies its causal formula with a padding-only mask in the encoder, which counts from
each key to the end of the sequence and so measures positions from the sequence end rather than
from the query (and would let padding length matter if gates were not masked).

Incremental decoding needs no extra state: the newest query recomputes its gates over the cached
keys; earlier rows never change because a query's gates depend only on its own row. The decoder
works on keys in reversed order internally, so the count from the query back to each key is a
plain cumulative sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.encodings.base import AttentionCall, AttentionRule, Site, StackEncoding


@dataclass
class CoPEContext:
    """Position-only tensors shared by every layer of a stack.

    Decoder (keys in reversed order, column ``r`` is key ``Lk - 1 - r``):
        visible: ``(Lq, Lk)`` bool, True where the (reversed) key is not in the query's future;
            None when every key is visible (a single newest query).

    Encoder (keys in natural order):
        visible: None (padding comes from the call).
        before: ``(Lq, Lk)`` bool, True where key ``j`` is at or before query ``i``.
        own: ``(Lq, 1)`` long, the index of each query's own key.
        table_offset: ``(Lq, Lk)`` long, 0 for keys at or before the query and ``npos`` for keys
            after it: the row offset into the stacked ``[e_before; e_after]`` table.
    """

    visible: Tensor | None = None
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

    def _keys(self, k: Tensor) -> Tensor:
        """Keys (or values) ``(B, H, Lk, D)`` in the rule's internal order."""
        return k if self.bidirectional else k.flip(2)

    def _mask(self, call: AttentionCall) -> Tensor | None:
        """Bool ``(B|1, 1|H, Lq, Lk)`` of allowed keys in internal order, or None if all are."""
        if self.bidirectional:
            return call.allowed()
        mask = call.context.visible
        if call.key_padding_mask is not None:
            keep = ~call.key_padding_mask.flip(-1)[:, None, None, :]
            mask = keep if mask is None else mask & keep
        return mask

    def _positions(self, gates: Tensor, call: AttentionCall) -> Tensor:
        """Clamped positions from masked gates ``(B, H, Lq, Lk)`` (internal key order)."""
        if self.bidirectional:
            # |C_ij - C_ii| sums the gates strictly between the query and the key (one side
            # of the query or the other); the nearer end, g_ij or g_ii, is added back.
            ctx: CoPEContext = call.context
            own = ctx.own.expand(*gates.shape[:-1], 1)
            counts = gates.cumsum(-1)
            nearer_end = torch.where(ctx.before, gates, gates.gather(-1, own))
            positions = (counts - counts.gather(-1, own)).abs() + nearer_end
        else:
            positions = gates.cumsum(-1)
        return positions.clamp(max=self.npos - 1)

    def _gates_and_content(
        self, q: Tensor, k: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Scaled content logits and masked gates, both ``(B, H, Lq, Lk)`` float32."""
        content = q @ k.transpose(-1, -2)
        gates = torch.sigmoid(content)
        if mask is not None:
            gates = torch.where(mask, gates, 0.0)
        return content, gates

    def positions(self, q: Tensor, k: Tensor, call: AttentionCall) -> Tensor:
        """Clamped contextual positions ``p (B, H, Lq, Lk)``, float32, keys in natural order
        (0 at masked keys)."""
        with torch.autocast(q.device.type, enabled=False):
            q = q.float() / math.sqrt(q.shape[-1])
            _, gates = self._gates_and_content(q, self._keys(k.float()), self._mask(call))
            positions = self._positions(gates, call)
        return positions if self.bidirectional else positions.flip(-1)

    def _attention(self, q: Tensor, k: Tensor, call: AttentionCall) -> Tensor:
        """Attention probabilities ``(B, H, Lq, Lk)`` float32, keys in internal order."""
        with torch.autocast(q.device.type, enabled=False):
            q = q.float() / math.sqrt(q.shape[-1])
            mask = self._mask(call)
            content, gates = self._gates_and_content(q, self._keys(k.float()), mask)
            positions = self._positions(gates, call)
            index = positions.long()  # floor, positions are >= 0
            frac = positions.frac()
            table = self.pos_emb.float()
            if self.bidirectional:
                index = index + call.context.table_offset
                after = table.view(2, self.npos, -1)
                slope = torch.cat([after.diff(dim=1), after.new_zeros(2, 1, after.shape[-1])], 1)
                slope = slope.view_as(table)
            else:
                slope = torch.cat([table.diff(dim=0), table.new_zeros(1, table.shape[-1])])
            at_floor = (q @ table.t()).gather(-1, index)  # q_i . e[floor p_ij]
            rise = (q @ slope.t()).gather(-1, index)  # q_i . (e[floor p + 1] - e[floor p])
            logits = torch.addcmul(content + at_floor, frac, rise)
            if mask is not None:
                logits = torch.where(mask, logits, float("-inf"))
            return torch.softmax(logits, dim=-1)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        attn = self._attention(q, k, call)
        return (attn if self.bidirectional else attn.flip(-1)).to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        attn = self._attention(q, k, call)
        attn = F.dropout(attn, p=call.dropout_p, training=call.dropout_p > 0)
        return attn.to(v.dtype) @ self._keys(v)


class CoPEEncoding(StackEncoding):
    """CoPE for one stack: a :class:`CoPERule` (own table) in every self-attention layer.

    Args:
        npos: integer positions per table (the paper's ``npos``); counts are clamped at
            ``npos - 1``.
    """

    applies_to = "encoder and decoder self-attention (per-layer tables shared by heads)"
    encoder_form = "count gates from the query outward; a second table for keys after the query"

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
            visible = k_pos.flip(0)[None, :] <= q_pos[:, None]
            return CoPEContext(visible=None if bool(visible.all()) else visible)
        before = k_pos[None, :] <= q_pos[:, None]
        return CoPEContext(
            before=before,
            own=(q_pos - k_pos[0])[:, None],
            table_offset=(~before).long() * self.npos,
        )

    def self_rule(self, layer: int) -> AttentionRule:
        return self.rules[layer]
