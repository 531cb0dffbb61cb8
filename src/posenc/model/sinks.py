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
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    additive_mask,
    compute_dtype,
    sdpa,
)
from posenc.model.encodings.wrapping import WrapperRule, overrides


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


class SinkRule(WrapperRule):
    """``inner``'s attention with a learned sink logit per head in its softmax.

    Attributes:
        logit: ``(H,)`` the sinks' logits.

    Raises:
        ValueError: ``inner`` computes attention its own way (one line naming the fix).
    """

    def __init__(self, inner: AttentionRule, n_heads: int, name: str = "?") -> None:
        if overrides(inner, "forward"):
            raise ValueError(
                f"pe={name}: pe.sinks=true joins the default softmax attention, and this "
                "encoding computes attention its own way; leave pe.sinks null for it"
            )
        super().__init__(inner)
        self.logit = nn.Parameter(torch.zeros(n_heads))

    def mask(
        self,
        q: Tensor,
        k: Tensor,
        key_state: Tensor | None,
        call: AttentionCall,
        dtype: torch.dtype,
    ) -> Tensor:
        """What is added to ``q k^T`` scaled, ``(B, H, Lq, Lk + 1)`` in ``dtype``: the inner
        rule's bias (or 0), -inf at the keys the call does not allow, and the sink's logit in
        the last column (where the scores are 0: its key is zeros)."""
        (batch, heads, length, _), keys = q.shape, k.shape[2]
        bias = self.bias(q, k, key_state, call)
        bias = q.new_zeros(1, 1, length, keys) if bias is None else bias
        mask = additive_mask(bias, call, dtype).expand(batch, heads, length, keys)
        sink = self.logit.to(dtype)[None, :, None, None].expand(batch, heads, length, 1)
        return torch.cat([mask, sink], dim=-1)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """``(B, H, Lq, Lk)``: the softmax with the sink, the sink's own weight left out."""
        dtype = compute_dtype(q)
        scale = self.score_scale(q)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        scores = F.pad((q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale, (0, 1))
        logits = scores + self.mask(q, k, key_state, call, dtype)
        return torch.softmax(logits, dim=-1)[..., :-1].to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        keys, values = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))  # the sink: zeros
        mask = self.mask(q, k, key_state, call, q.dtype)
        return sdpa(q, keys, values, mask, call.dropout_p, self.score_scale(q))

    attend_cached = AttentionRule.attend_cached  # attention with the sink, not inner's
