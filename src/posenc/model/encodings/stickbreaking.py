"""Stick-breaking attention, SBA (Tan et al. 2024, "Scaling Stick-Breaking Attention"; reference
code shawntan/stickbreaking-attention).

Softmax is replaced by a stick-breaking process that walks from the query back in time: each
earlier key ``j`` takes the fraction ``beta_ij`` of what is left of a unit stick::

    z_ij = q_i . k_j / sqrt(D),   beta_ij = sigmoid(z_ij)
    A_ij = beta_ij * prod_{j<t<i} (1 - beta_it)                       keys j < i only
    log A_ij = z_ij - sum_{j<=t<i} softplus(z_it)                      (computed this way)
    o_i = sum_{j<i} A_ij v_j + (1 - sum_{j<i} A_ij) v_i

Following the reference (``attend_current=False`` by default), the stick is broken over keys
strictly before the query; ``attend_current=True`` lets the query's own key break first. The
remainder of the stick goes to the query's own value, as in the repository's reference forward
(``o + rem * v``); the remainder is computed as ``prod_t (1 - beta_it) = exp(-sum softplus)``,
which equals ``1 - sum_j A_ij`` and is never negative in floating point. :meth:`weights`
returns ``A`` with the remainder added on the query's own key, so ``weights @ v`` is the output
and every row sums to 1. Logits, gates and weights are float32 whatever the autocast dtype
(float64 in a float64 model). No
other position information is used.

Where it applies: encoder and decoder self-attention; cross-attention is plain softmax.

Encoder (bidirectional) form, chosen here: one stick, broken from the query outward in order of
distance, alternating sides with the earlier key first at equal distance
(``i-1, i+1, i-2, i+2, ...``; the query's own key first with ``attend_current``). It keeps the
paper's recency bias and its single unit of mass, and the fixed tie order makes the two sides
unequal (with equal gates the left neighbour gets ``b``, the right one ``b(1-b)``), so direction
stays visible without adding parameters. Two half-mass sticks, one per side, would instead be
mirror-symmetric and leave the encoder unable to tell left from right.

Incremental decoding needs no extra state: the newest query breaks its stick over the cached keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
)

LOG_FLOOR = -50.0
"""Weights and remainders below ``exp(LOG_FLOOR)`` (about 2e-22 of the stick, far below float32
resolution) are set to exactly 0: on CPU, ``exp`` of very negative inputs and matmuls with
subnormal floats (which tiny weights times gradients produce) take 10-100x slower paths."""


@dataclass
class StickContext:
    """Position-only tensors shared by every layer of a stack.

    Attributes:
        bias: ``(Lq, Lk)`` float, 0 where key ``j`` takes part in query ``i``'s stick and
            ``-inf`` elsewhere. In the decoder the keys are in reversed order (column ``r`` is
            key ``Lk - 1 - r``), so the stick is broken left to right.
        own: ``(Lq,)`` long, the index of each query's own key (where the remainder goes).
        order: ``(Lq, Lk)`` long, for each query the keys in breaking order (encoder only).
        rank: ``(Lq, Lk)`` long, the inverse of ``order``: where key ``j`` comes in that order
            (encoder only).
    """

    bias: Tensor
    own: Tensor
    order: Tensor | None = None
    rank: Tensor | None = None

    @property
    def reversed(self) -> bool:
        """True when keys are processed in reversed order (the causal decoder)."""
        return self.order is None


class StickBreakingRule(AttentionRule):
    """Stick-breaking self-attention (no parameters); the stack's context says which keys break
    and in which order."""

    def _sticks(self, q: Tensor, k: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
        """Weights ``A (B, H, Lq, Lk)`` (keys in the context's order) and the remainder
        ``(B, H, Lq, 1)``, both float32."""
        ctx: StickContext = call.context
        with torch.autocast(q.device.type, enabled=False):
            q = q.to(compute_dtype(q)) / math.sqrt(q.shape[-1])
            k = k.to(q.dtype).flip(2) if ctx.reversed else k.to(q.dtype)
            bias = ctx.bias
            if call.key_padding_mask is not None:
                padding = call.key_padding_mask
                padding = padding.flip(-1) if ctx.reversed else padding
                bias = bias.masked_fill(padding[:, None, None, :], -math.inf)
            z = q @ k.transpose(-1, -2) + bias  # -inf off the stick
            spent = F.softplus(z)  # -log(1 - beta), 0 off the stick
            if ctx.reversed:
                used = spent.cumsum(-1)  # the stick runs from key i-1 back to key 0
            else:
                used = spent.gather(-1, ctx.order.expand_as(spent)).cumsum(-1)
                used = used.gather(-1, ctx.rank.expand_as(spent))
            log_attn = z - used
            attn = torch.where(log_attn > LOG_FLOOR, log_attn.clamp(min=LOG_FLOOR).exp(), 0.0)
            spent_all = spent.sum(-1, keepdim=True)
            remainder = torch.where(spent_all < -LOG_FLOOR, torch.exp(-spent_all), 0.0)
        return attn, remainder

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """Weights ``(B, H, Lq, Lk)``: ``A_ij`` plus the remainder at the query's own key."""
        attn, remainder = self._sticks(q, k, call)
        if call.context.reversed:
            attn = attn.flip(-1)
        own = F.one_hot(call.context.own, attn.shape[-1]).to(attn.dtype)
        return (attn + remainder * own).to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        attn, remainder = self._sticks(q, k, call)
        if call.dropout_p > 0:
            attn = F.dropout(attn, p=call.dropout_p)
            remainder = F.dropout(remainder, p=call.dropout_p)
        own_value = v[:, :, call.context.own]
        v = v.flip(2) if call.context.reversed else v
        return attn.to(v.dtype) @ v + remainder.to(v.dtype) * own_value


def _bias(allowed: Tensor) -> Tensor:
    """Additive float mask: 0 where ``allowed``, ``-inf`` elsewhere."""
    return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, -math.inf)


class StickBreakingEncoding(StackEncoding):
    """Stick-breaking attention for one stack.

    Args:
        attend_current: the query's own key also breaks the stick (first), as the reference's
            ``attend_current`` option; off by default as in the reference.
    """

    applies_to = "encoder and decoder self-attention (replaces softmax; no parameters)"
    encoder_form = "one stick broken outward by distance, earlier key first at ties"
    speed_target = 2.0

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        attend_current: bool = False,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.attend_current = attend_current

    def context(self, q_pos: Tensor, k_pos: Tensor) -> StickContext:
        own = q_pos - k_pos[0]  # keys are consecutive positions
        if self.causal:
            offset = k_pos.flip(0)[None, :] - q_pos[:, None]  # (Lq, Lk), reversed keys
            breakable = offset <= 0 if self.attend_current else offset < 0
            return StickContext(bias=_bias(breakable), own=own)
        offset = k_pos[None, :] - q_pos[:, None]  # (Lq, Lk), j - i
        breakable = (offset != 0) | self.attend_current
        # i-1, i+1, i-2, i+2, ...: left keys at odd steps, right keys at even steps
        step = torch.where(offset < 0, -2 * offset - 1, 2 * offset)
        order = step.argsort(dim=-1)
        return StickContext(bias=_bias(breakable), own=own, order=order, rank=order.argsort(dim=-1))

    def self_rule(self, layer: int) -> AttentionRule:
        return StickBreakingRule()
