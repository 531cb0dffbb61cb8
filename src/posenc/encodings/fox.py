"""Forgetting Transformer (FoX) forget gates, Lin et al. 2025 (``fox``).

Each self-attention layer has a per-head, data-dependent forget gate
``f_t = sigmoid(w_h . x_t + b_h)`` (an ``nn.Linear(d_model, H)`` on the layer's input). Query
``i`` scores key ``j <= i`` with the log of the product of the gates of the tokens after ``j``
up to ``i``:

    D_ij = sum_{l=j+1..i} log f_l = c_i - c_j,   c = cumsum(log f)

added to the logits; there is no other position information. ``log f`` comes from
``logsigmoid`` and everything after it (cumulative sums, bias, softmax) runs in float32, also
under bf16 autocast, as in the reference kernel (zhixuan-lin/forgetting-transformer). Gates
initialise as in that repo: weights ``N(0, 0.02)``, bias 0.

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

Speed: in the causal form the ``c_i`` term is constant along a softmax row and drops out, so
``softmax_j(q_i . k_j / sqrt(D) + c_i - c_j) = softmax_j(q'_i . k'_j)`` with
``q' = [q / sqrt(D), 1]`` and ``k' = [k, -c]``: the decoder runs SDPA's fused kernel with one
extra head dimension instead of a ``(B, H, L, L)`` bias that needs a gradient.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    additive_mask,
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
        """Return q, k unchanged and ``log f (B, H, L)`` in float32 as the cached key state."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float(), self.gate.bias.float())
        return q, k, F.logsigmoid(logits).transpose(1, 2)

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """Float32 ``(B, H, Lq, Lk)``: ``c_i - c_j`` (causal) or ``-|c_i - c_j|`` (encoder)."""
        cumulative = key_state.float().cumsum(-1)  # (B, H, Lk)
        diff = cumulative[..., call.q_pos, None] - cumulative[..., None, :]
        return -diff.abs() if self.bidirectional else diff

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return super().weights(q.float(), k.float(), key_state, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            q32, k32, v32 = q.float(), k.float(), v.float()
            if self.bidirectional:
                mask = additive_mask(self.bias(q32, k32, key_state, call), call, torch.float32)
                out = F.scaled_dot_product_attention(
                    q32, k32, v32, attn_mask=mask, dropout_p=call.dropout_p
                )
            else:
                out = _causal_decay_attention(q32, k32, v32, key_state.float().cumsum(-1), call)
        return out.to(q.dtype)


def _causal_decay_attention(
    q: Tensor, k: Tensor, v: Tensor, cumulative: Tensor, call: AttentionCall
) -> Tensor:
    """``softmax_j(q_i . k_j / sqrt(D) - c_j) v`` over allowed keys: the causal FoX output.

    ``q (B, H, Lq, D)``, ``k, v (B, H, Lk, D)``, ``cumulative`` = ``c (B, H, Lk)``. The per-key
    term rides in an extra head dimension; v is padded to match, as the fused kernel needs equal
    head dims. Returns ``(B, H, Lq, D)``.
    """
    dim = q.shape[-1]
    q_aug = torch.cat([q * (1.0 / math.sqrt(dim)), q.new_ones(*q.shape[:-1], 1)], dim=-1)
    k_aug = torch.cat([k, -cumulative[..., None]], dim=-1)
    from_start = call.key_padding_mask is None and q.shape[2] == k.shape[2]
    is_causal = call.needs_causal_mask and from_start
    out = F.scaled_dot_product_attention(
        q_aug,
        k_aug,
        F.pad(v, (0, 1)),
        attn_mask=None if is_causal else call.allowed(),
        dropout_p=call.dropout_p,
        is_causal=is_causal,
        scale=1.0,
    )
    return out[..., :dim]


class ForgettingEncoding(StackEncoding):
    """FoX forget gates in every self-attention layer of the stack.

    Args:
        init_std: gate weight initialisation std (the repo's ``initializer_range``, 0.02).
    """

    applies_to = "encoder and decoder self-attention (a forget gate per head and layer)"
    encoder_form = "-|c_i - c_j|: the same gates forget in both directions"

    def __init__(
        self, site: Site, d_model: int, n_heads: int, n_layers: int, init_std: float = 0.02
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.init_std = init_std

    def self_rule(self, layer: int) -> ForgetGateRule:
        return ForgetGateRule(self.d_model, self.n_heads, not self.causal, self.init_std)
