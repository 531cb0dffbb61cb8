"""TAPE, contextual position encoding (Zhu et al., ICML 2025), from the authors' code
(VITA-Group/TAPE, ``models/llama/adape.py``).

Every token carries a position state per head, ``E (B, H, L, D)``: ``D/2`` complex numbers
``z`` (the code's cos and sin tensors ``E_c, E_s``, whose two halves stay equal, so one number
per pair holds them), initialised as RoPE's ``e^(i m theta)``. In every self-attention layer:

1. pair ``i`` of q and of k of token ``m`` is multiplied by ``z_i(m)`` (the code's
   ``q E_c + rotate_half(q) E_s``): RoPE's rotation while ``|z| = 1``;
2. after attention, ``z <- z + s_h (A z)``, ``A (B, H, Lq, Lk)`` the layer's attention weights
   and ``s_h`` the row sums of an ``(H, H)`` matrix ``W_post`` that starts at zero (the code's
   ``einsum('bqnd,qe->bqnd')`` reads only its row sums; kept as a matrix so that Adam moves
   each ``s_h`` as it does there);
3. after the feed-forward, ``z <- z + W_down (SiLU(y W_x) * (W_up z))``, ``y (B, L, d)`` the
   feed-forward's output, mixing heads through ``P`` channels (``W_up`` starts at zero,
   ``W_x`` and ``W_down`` at N(0, 0.02), the code's initialiser).

A new model is therefore RoPE exactly (``rope_init``; without it ``W_post`` and ``W_up`` are
drawn from N(0, 0.02) too). The last layer's updates would feed nothing, so it has none (the
code builds them and they never receive a gradient); a one-layer stack is RoPE.

Every update is linear in ``z`` with real coefficients, the same for every pair, so
multiplying every state by one phase per pair changes no score: this equivariance makes the
code's random offset of the training positions an exact no-op, left out here.

Where it applies: encoder and decoder self-attention (the encoder's ``A`` attends both ways),
cross-attention plain; the decoder's states are updated by its self-attention and
feed-forward. The states run in float32 (float64 in a float64 model); ``A z`` rides through
SDPA as extra value channels in the values' dtype.

Incremental decoding: :meth:`TapeRule.prepare` returns the new tokens' states as the key
state, cached with k, which is what ``A z`` of later tokens reads; the stack's
:class:`PositionStates` carries the new tokens' states from layer to layer within a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from posenc.model.encodings.rotation import (
    paired_head_dim,
    rope_frequencies,
    rotate,
    rotation_table,
)


@dataclass
class PositionStates:
    """The new tokens' position states in one forward pass of a stack, real ``(B|1, H|1, L,
    D)`` with pair ``i`` as ``(Re z_i, Im z_i)`` at dims ``2i, 2i + 1``.

    ``states[(layer, 0)]`` enters ``layer``'s attention, ``states[(layer, 1)]`` leaves it
    (before the feed-forward's update); a layer whose attention is plain (``pe.off_layers``)
    sets neither and passes the last state on.
    """

    states: dict[tuple[int, int], Tensor] = field(default_factory=dict)

    def latest(self, layer: int, stage: int) -> Tensor:
        """The state at ``(layer, stage)`` or, when a plain layer set none, the last before."""
        return self.states[max(key for key in self.states if key <= (layer, stage))]


def as_complex(state: Tensor) -> Tensor:
    """``(..., D)`` real pairs -> ``(..., D/2)`` complex."""
    return torch.view_as_complex(state.unflatten(-1, (-1, 2)).contiguous())


class TapeRule(AttentionRule):
    """One layer's TAPE: q and k multiplied by the token's state, and the state's two updates.

    Args:
        layer: this layer's index in its stack (the key of its states).
        d_model: ``d``, the width of the feed-forward output the gate reads.
        n_heads: ``H``.
        channels: ``P``, the channels of the feed-forward update.
        updates: whether a later layer reads this layer's updated states (else plain RoPE's
            attention with the entering states, and no parameters).
        rope_init: ``W_post`` and ``W_up`` start at zero (else N(0, 0.02)).
    """

    rotates_qk = True

    def __init__(
        self,
        layer: int,
        d_model: int,
        n_heads: int,
        channels: int,
        updates: bool = True,
        rope_init: bool = True,
    ) -> None:
        super().__init__()
        self.layer, self.updates, self.rope_init = layer, updates, rope_init
        if updates:
            self.post = nn.Parameter(torch.empty(n_heads, n_heads))
            self.gate = nn.Parameter(torch.empty(channels, d_model))
            self.up = nn.Parameter(torch.empty(channels, n_heads))
            self.down = nn.Parameter(torch.empty(n_heads, channels))
            self.reset_parameters()

    def reset_parameters(self) -> None:
        for matrix in (self.post, self.up):
            if self.rope_init:
                nn.init.zeros_(matrix)
            else:
                nn.init.normal_(matrix, std=0.02)
        nn.init.normal_(self.gate, std=0.02)
        nn.init.normal_(self.down, std=0.02)

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: PositionStates = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``q, k (B, H, L, D)`` multiplied pairwise by the new tokens' states, and those states
        ``(B, H, L, D)`` (in the compute dtype) as the cached key state, which only a layer
        with updates reads (None for the others)."""
        state = context.latest(self.layer, 0).to(compute_dtype(q))
        table = as_complex(state)  # (B|1, H|1, L, D/2): rotate broadcasts it
        key_state = state.expand(q.shape) if self.updates else None
        return rotate(q, table), rotate(k, table), key_state

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """Attention output ``(B, H, Lq, D)``; records the queries' state after ``z + s A z``."""
        if not self.updates:
            return super().forward(q, k, v, None, call)
        width = v.shape[-1]
        both = super().forward(q, k, torch.cat((v, key_state.to(v.dtype)), dim=-1), None, call)
        states: PositionStates = call.context
        entering = states.latest(self.layer, 0)
        mixed = both[..., width:].to(entering.dtype)
        scale = self.post.to(entering.dtype).sum(-1)[None, :, None, None]
        states.states[(self.layer, 1)] = entering + scale * mixed
        return both[..., :width]

    def after_feedforward(self, y: Tensor, call: AttentionCall) -> None:
        """Record the state entering the next layer: ``z + W_down (SiLU(y W_x) * (W_up z))``."""
        if not self.updates:
            return
        states: PositionStates = call.context
        state = states.states[(self.layer, 1)]  # (B, H, L, D), set by this layer's forward
        dtype = state.dtype
        with torch.autocast(y.device.type, enabled=False):
            gate = F.silu(F.linear(y.to(dtype), self.gate.to(dtype)))  # (B, L, P)
            up = torch.einsum("bhld,ph->bpld", state, self.up.to(dtype))
            down = torch.einsum(
                "bpld,hp->bhld", up * gate.transpose(1, 2)[..., None], self.down.to(dtype)
            )
        states.states[(self.layer + 1, 0)] = state + down


class TapeEncoding(StackEncoding):
    """TAPE in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: RoPE's base, for the initial states.
        channels: ``P`` of the feed-forward update; None: ``d_model // 2`` (the code's 256 at
            width 512).
        rope_init: the updates start at zero, so that a new model is RoPE (the code's
            initialisation); False: drawn from N(0, 0.02).

    Raises:
        ValueError: an odd head dim, or fewer than one channel.
    """

    applies_to = "encoder and decoder self-attention (q, k times position states updated per layer)"
    encoder_form = "the same updates with attention in both directions"
    speed_target = 1.30
    option_forms = ({"rope_init": False},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        channels: int | None = None,
        rope_init: bool = True,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        head_dim = paired_head_dim("tape", d_model, n_heads)
        self.channels = d_model // 2 if channels is None else int(channels)
        if self.channels < 1:
            raise ValueError(f"pe.channels={channels}: TAPE needs at least one channel")
        self.rope_init = rope_init
        self.register_buffer("inv_freq", rope_frequencies(head_dim, base), persistent=False)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> PositionStates:
        """The new tokens' initial states, RoPE's ``e^(i q_pos theta)`` as ``(1, 1, Lq, D)``."""
        table = rotation_table(q_pos, self.inv_freq.to(q_pos.device))
        return PositionStates({(0, 0): torch.view_as_real(table).flatten(-2)[None, None]})

    def self_rule(self, layer: int) -> TapeRule:
        """Layer ``layer``'s rule, with updates when a later layer of TAPE reads them."""
        read_later = any(i not in self.off_layers for i in range(layer + 1, self.n_layers))
        return TapeRule(
            layer, self.d_model, self.n_heads, self.channels, read_later, self.rope_init
        )
