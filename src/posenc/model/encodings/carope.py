"""CARoPE, context-aware rotary position embedding (Veisi et al. 2025), from the paper's formula
(no code was published with it).

RoPE's phase of pair ``i`` at position ``m`` is a sum of one fixed step per token,
``m theta_1^i``. CARoPE makes the step depend on each token and head::

    phi_i^h(m) = sum_{t <= m} f(x_t)_h^i,    f(x_t) = 1 / (softplus(x_t W) + 1)  in (0, 1)

and rotates pair ``i`` of q and k of token ``m`` by ``phi_i^h(m)`` as RoPE does, ``i = 0 ..
D/2 - 1`` (pair 0 turns by one radian a token, as RoPE's first pair). A score then depends on
the tokens between query and key, no longer on their distance alone.

Choices the paper leaves open, made here and stated in the guide:

* ``x_t`` is the layer's input (at the first layer, the token embedding the paper names) and
  each layer has its own ``W`` (``d x H``);
* "initialised with the standard RoPE formulation" is read as ``W = 0`` plus a per-head bias
  ``b`` with ``f = theta_1 = base^(-2/D)``, so that a new model is RoPE exactly
  (``rope_init``); without it ``W ~ N(0, 0.02)`` and no bias, the paper's bare formula.

Where it applies: encoder and decoder self-attention; cross-attention plain. The phases run in
token order in the encoder too (the sum over the tokens up to ``m``), which the bidirectional
attention then reads as RoPE's rotations. Everything after the gate runs in float32 (float64
in a float64 model).

Incremental decoding: :meth:`ContextRotaryRule.prepare` returns the new tokens' steps
``f (B, H, L)``, cached alongside k; each call rotates the cached keys and the new queries from
the cumulative sum of the cached steps, so cached decoding equals a full pass.
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
)
from posenc.model.encodings.rotation import paired_head_dim, rotate


def context_phases(steps: Tensor, pairs: int) -> Tensor:
    """``phi (B, H, L, pairs)``: the cumulative sums over tokens of ``steps (B, H, L)`` raised to
    the powers ``0 .. pairs - 1``."""
    powers = torch.arange(pairs, device=steps.device, dtype=steps.dtype)
    return (steps[..., None] ** powers).cumsum(-2)


class ContextRotaryRule(AttentionRule):
    """One layer's CARoPE: the per-head step projection and the rotation of q and k.

    Args:
        d_model: input width ``d`` of the projection ``W``.
        n_heads: ``H``, one step per head.
        base: RoPE's base, for the initial step ``theta_1`` under ``rope_init``.
        rope_init: start as RoPE (``W = 0``, a bias giving ``f = theta_1``); else
            ``W ~ N(0, 0.02)`` and no bias.
    """

    def __init__(self, d_model: int, n_heads: int, base: float, rope_init: bool) -> None:
        super().__init__()
        self.base, self.rope_init = base, rope_init
        self.step = nn.Linear(d_model, n_heads, bias=rope_init)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.step.bias is None:
            nn.init.normal_(self.step.weight, std=0.02)
            return
        head_dim = self.step.in_features // self.step.out_features
        theta_1 = self.base ** (-2.0 / head_dim)
        nn.init.zeros_(self.step.weight)
        # softplus(b) = 1 / theta_1 - 1, so f = 1 / (softplus(b) + 1) = theta_1
        nn.init.constant_(self.step.bias, math.log(math.expm1(1.0 / theta_1 - 1.0)))

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q, k unchanged and the steps ``f (B, H, L)`` (float32, or float64 for a float64
        model) as the cached key state."""
        with torch.autocast(x.device.type, enabled=False):
            dtype = compute_dtype(x)
            bias = None if self.step.bias is None else self.step.bias.to(dtype)
            logits = F.linear(x.to(dtype), self.step.weight.to(dtype), bias)
        return q, k, (1.0 / (F.softplus(logits) + 1.0)).transpose(1, 2)

    def rotated(
        self, q: Tensor, k: Tensor, key_state: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor]:
        """``q (B, H, Lq, D)`` and ``k (B, H, Lk, D)`` rotated by their phases (keys at
        ``0 .. Lk - 1``, queries at ``call.q_pos``)."""
        with torch.autocast(q.device.type, enabled=False):
            phases = context_phases(key_state.to(compute_dtype(q)), q.shape[-1] // 2)
            tables = torch.polar(torch.ones_like(phases), phases)
            return rotate(q, tables[:, :, call.q_pos]), rotate(k, tables)

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        q, k = self.rotated(q, k, key_state, call)
        return super().weights(q, k, None, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        q, k = self.rotated(q, k, key_state, call)
        return super().forward(q, k, v, None, call)


class ContextRotaryEncoding(StackEncoding):
    """CARoPE in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: RoPE's base (the initial step under ``rope_init``).
        rope_init: start as RoPE (the module docstring).

    Raises:
        ValueError: an odd head dim.
    """

    applies_to = "encoder and decoder self-attention (q, k rotated by token-dependent phases)"
    encoder_form = "the same phases, summed in token order; attention reads both directions"
    speed_target = 1.30
    option_forms = ({"rope_init": False},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        rope_init: bool = True,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        paired_head_dim("carope", d_model, n_heads)
        self.base, self.rope_init = base, rope_init

    def self_rule(self, layer: int) -> ContextRotaryRule:
        return ContextRotaryRule(self.d_model, self.n_heads, self.base, self.rope_init)
