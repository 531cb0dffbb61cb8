"""Forgetting Transformer (FoX) forget gates, Lin et al. 2025 (``fox``).

Each self-attention layer has a per-head, data-dependent forget gate
``f_t = sigmoid(w_h . x_t + b_h)`` (an ``nn.Linear(d_model, H)`` on the layer's input). Query
``i`` scores key ``j <= i`` with the log of the product of the gates of the tokens after ``j``
up to ``i``:

    D_ij = sum_{l=j+1..i} log f_l = c_i - c_j,   c = cumsum(log f)

added to the logits; there is no other position information (the repo's "Pro" extras:
output gates, QK-norm, key/value shift, are not part of the encoding and are left out).
``log f`` comes from ``logsigmoid`` and everything after it (cumulative sums, bias, softmax)
runs in float32, also under bf16 autocast, as in the reference kernel
(zhixuan-lin/forgetting-transformer); the gate projection runs in float32 too (the repo runs it
in the autocast dtype; it is ``d x H``, so this costs nothing). Gates initialise as in that
repo: weights ``N(0, 0.02)`` (its ``initializer_range``), bias 0, i.e. ``f`` near 1/2.

Where it applies: decoder self-attention (the paper's causal form) and encoder self-attention
(the bidirectional form below); not cross-attention, whose source and target positions share
no axis.

Encoder form (the paper is causal-only): ``D_ij = -|c_i - c_j|``, i.e. the same gates forget
in both directions, ``D_ij = sum of log f_l over min(i, j) < l <= max(i, j)``. It is the causal
form applied to the pair in position order, so on ``j <= i`` it is exactly the paper's bias; it
adds no parameters; and with constant gates it is the symmetric ALiBi bias
``-m |i - j|`` (``m = -log f``), the usual bidirectional form of a causal decay.

Incremental decoding: :meth:`ForgetGateRule.prepare` returns the new tokens' ``log f``
``(B, H, L)``, which the attention caches alongside k; the bias is rebuilt from the cumulative
sum of the cached gates, with query rows at ``call.q_pos`` (keys are at ``arange(Lk)``).

Speed: ``c_i - c_j`` is a dot product, ``[1, c_i] . [-c_j, 1]``, so the bias rides in two extra
head dims of q and k and attention runs on SDPA's fused kernel instead of materialising a
``(B, H, L, L)`` bias that needs a gradient (which forces SDPA's slow math kernel). The encoder
form lists every key twice (``[k, -c_j, 1]`` for keys at or before the query,
``[k, c_j, -1]`` after it) under a bool mask: twice the keys, still faster than the bias.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
    sdpa,
)


class ForgetGateRule(AttentionRule):
    """One layer's self-attention with FoX forget gates.

    Args:
        d_model: input width ``d`` of the gate projection.
        n_heads: ``H``, one gate per head.
        bidirectional: the encoder form ``-|c_i - c_j|`` instead of the causal ``c_i - c_j``.
        init_std: standard deviation of the gate weights at initialisation.
    """

    def __init__(self, d_model: int, n_heads: int, bidirectional: bool, init_std: float) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, n_heads)
        self.bidirectional = bidirectional
        self.init_std = init_std
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.gate.weight, std=self.init_std)
        nn.init.zeros_(self.gate.bias)

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Return q, k unchanged and ``log f (B, H, L)`` (float32, or float64 for a float64
        model) as the cached key state."""
        with torch.autocast(x.device.type, enabled=False):
            dtype = compute_dtype(x)
            logits = F.linear(x.to(dtype), self.gate.weight.to(dtype), self.gate.bias.to(dtype))
        return q, k, F.logsigmoid(logits).transpose(1, 2)

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """Float32 ``(B, H, Lq, Lk)``: ``c_i - c_j`` (causal) or ``-|c_i - c_j|`` (encoder)."""
        cumulative = key_state.to(compute_dtype(key_state)).cumsum(-1)  # (B, H, Lk)
        diff = cumulative[..., call.q_pos, None] - cumulative[..., None, :]
        return -diff.abs() if self.bidirectional else diff

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            dtype = compute_dtype(q)
            return super().weights(q.to(dtype), k.to(dtype), key_state, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            dtype = compute_dtype(q)
            cumulative = key_state.to(dtype).cumsum(-1)
            out = _decay_attention(
                q.to(dtype), k.to(dtype), v.to(dtype), cumulative, call, self.bidirectional
            )
        return out.to(q.dtype)


def _decay_attention(
    q: Tensor, k: Tensor, v: Tensor, cumulative: Tensor, call: AttentionCall, bidirectional: bool
) -> Tensor:
    """``softmax_j(q_i . k_j / sqrt(D) + D_ij) v`` over the allowed keys, on SDPA's fused kernel.

    ``q (B, H, Lq, D)``, ``k, v (B, H, Lk, D)``, ``cumulative`` = ``c (B, H, Lk)``; returns
    ``(B, H, Lq, D)``. The bias rides in two extra head dims: ``[q / sqrt(D), 1, c_i]`` against
    ``[k, -c_j, 1]`` scores ``s_ij + c_i - c_j``, the bias for keys at or before the query. The
    encoder form also needs ``s_ij + c_j - c_i`` for keys after it, so each key appears twice,
    as ``[k, -c_j, 1]`` and ``[k, c_j, -1]``, and the mask lets each query see the copy that
    holds its bias. v is padded to ``D + 2`` (the fused kernel wants equal head dims).
    """
    dim = q.shape[-1]
    c_q, c_k = cumulative[..., call.q_pos, None], cumulative[..., None]
    q_aug = torch.cat([q * (1.0 / math.sqrt(dim)), torch.ones_like(c_q), c_q], dim=-1)
    k_before = torch.cat([k, -c_k, torch.ones_like(c_k)], dim=-1)
    if bidirectional:
        keys = torch.cat([k_before, torch.cat([k, c_k, -torch.ones_like(c_k)], dim=-1)], dim=2)
        values = torch.cat([v, v], dim=2)
        before = call.k_pos[None, :] <= call.q_pos[:, None]  # (Lq, Lk)
        mask = torch.cat([before, ~before], dim=-1)[None, None]
        if call.key_padding_mask is not None:
            keep = ~call.key_padding_mask[:, None, None, :]
            mask = mask & torch.cat([keep, keep], dim=-1)
        is_causal = False
    else:
        keys, values = k_before, v
        is_causal = call.sdpa_is_causal
        mask = None if is_causal else call.allowed()
    out = sdpa(q_aug, keys, F.pad(values, (0, 2)), mask, call.dropout_p, 1.0, is_causal)
    return out[..., :dim]


class ForgettingEncoding(StackEncoding):
    """FoX forget gates in every self-attention layer of the stack.

    Args:
        init_std: gate weight initialisation std (the repo's ``initializer_range``, 0.02).
    """

    applies_to = "encoder and decoder self-attention (a forget gate per head and layer)"
    encoder_form = "-|c_i - c_j|: the same gates forget in both directions"
    speed_target = 1.35

    def __init__(
        self, site: Site, d_model: int, n_heads: int, n_layers: int, init_std: float = 0.02
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.init_std = init_std

    def self_rule(self, layer: int) -> ForgetGateRule:
        return ForgetGateRule(self.d_model, self.n_heads, not self.causal, self.init_std)
