"""Learned attention sinks (``pe.sinks=true``, any encoding): one learned logit per head joins
every softmax of a layer's attention, as gpt-oss's sinks and x-transformers' ``head_learned_sink``
do. With scores ``s_j`` and the head's sink ``c``, the weights are ``exp(s_j) / (sum_k exp(s_k) +
exp(c))``: they may sum to less than one, so a head can attend to nothing. Not a position, but
the length and NoPE literature of 2025-26 measures sinks beside positions.

Attention stays SDPA's: the sink is a key of zeros with a value of zeros whose logit ``q . 0 +
bias`` is ``c`` through the additive mask. It joins the softmax of the default rule only: an
encoding whose attention is its own (Shaw's, CoPE's, stick-breaking's, PaTH's) is refused in
one line. Each wrapped attention has its own ``(H,)`` logits, initialised to 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    WrapperRule,
    compute_dtype,
    sdpa,
)


@dataclass(frozen=True)
class Sinks:
    """``pe.sinks``: learned sinks in every attention of an encoding named ``name``."""

    name: str = "?"

    @classmethod
    def of(cls, value: Any, name: str = "?") -> Sinks | None:
        """The sinks of ``pe.sinks`` (None for null or false).

        Raises:
            ValueError: a value that is not a boolean (one line).
        """
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"pe.sinks={value!r} must be true, false or null (off)")
        return cls(name) if value else None

    def wrap(self, rule: AttentionRule, n_heads: int) -> SinkRule:
        """``rule`` with a learned sink logit per head."""
        return SinkRule(rule, n_heads, self.name)


def owns_attention(rule: AttentionRule) -> bool:
    """Whether ``rule`` computes attention its own way rather than the default rule's softmax
    (a wrapper that forwards its attention asks its inner rule)."""
    forward = type(rule).forward
    if forward is WrapperRule.forward:
        return owns_attention(rule.inner)  # type: ignore[attr-defined]
    return forward is not AttentionRule.forward


class SinkRule(WrapperRule):
    """``inner``'s attention with a learned sink logit per head in its softmax.

    Attributes:
        logit: ``(H,)`` the sinks' logits.

    Raises:
        ValueError: ``inner`` computes attention its own way (one line naming the fix).
    """

    def __init__(self, inner: AttentionRule, n_heads: int, name: str = "?") -> None:
        if owns_attention(inner):
            raise ValueError(
                f"pe={name}: pe.sinks=true joins the default softmax attention, and this "
                "encoding computes attention its own way; leave pe.sinks null for it"
            )
        super().__init__(inner)
        self.logit = nn.Parameter(torch.zeros(n_heads))

    def scores(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """Logits ``(B, H, Lq, Lk + 1)`` in the compute dtype, the sink's last, disallowed keys
        at -inf."""
        dtype = compute_dtype(q)
        scale = self.score_scale(q)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        logits = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale
        bias = self.bias(q, k, key_state, call)
        if bias is not None:
            logits = logits + bias.to(dtype)
        allowed = call.allowed()
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        sink = self.logit.to(dtype)[None, :, None, None].expand(*logits.shape[:-1], 1)
        return torch.cat([logits, sink], dim=-1)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """``(B, H, Lq, Lk)``: the softmax with the sink, the sink's own weight left out."""
        scores = self.scores(q, k, key_state, call)
        return torch.softmax(scores, dim=-1)[..., :-1].to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        batch, heads, length = q.shape[0], q.shape[1], q.shape[2]
        zeros = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
        keys, values = torch.cat([k, zeros], dim=2), torch.cat([v, v.new_zeros(zeros.shape)], 2)
        mask = self.bias(q, k, key_state, call)
        if mask is None:
            mask = q.new_zeros(1, 1, length, k.shape[2])
        mask = mask.to(q.dtype)
        allowed = call.allowed()
        if allowed is not None:
            mask = mask.masked_fill(~allowed, float("-inf"))
        mask = mask.expand(batch, heads, length, k.shape[2])
        sink = self.logit.to(q.dtype)[None, :, None, None].expand(batch, heads, length, 1)
        mask = torch.cat([mask, sink], dim=-1)
        return sdpa(q, keys, values, mask, call.dropout_p, self.score_scale(q))

    def attend_cached(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> tuple[Tensor, Tensor]:
        return self(q, k, v, key_state, call), k
