"""xPos (Sun et al. 2022): RoPE with an exponential decay in the decoder.

"A Length-Extrapolatable Transformer": RoPE whose pair ``i`` is also scaled by
``zeta_i^(m/scale_base)`` on queries and ``zeta_i^(-n/scale_base)`` on keys, ``zeta_i = (i/(r/2)
+ gamma)/(1 + gamma)``, so it contributes ``zeta_i^((m-n)/scale_base)`` times RoPE's term; in
the decoder only (``docs/encodings/rope.md`` says why)."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.model.encodings.base import Site
from posenc.model.encodings.rotation import (
    RotaryStack,
    RotaryTables,
    rope_frequencies,
    rotation_table,
)


class XPosEncoding(RotaryStack):
    """xPos (Sun et al. 2022): RoPE with an exponential decay in the decoder.

    Decoder (the paper's causal form): pair ``i`` of the query at position ``m`` is scaled by
    ``zeta_i^(m/scale_base)`` and of the key at ``n`` by ``zeta_i^(-n/scale_base)``, so it adds
    ``zeta_i^((m-n)/scale_base)`` times its RoPE term to the score, with
    ``zeta_i = (i/(r/2) + gamma) / (1 + gamma)`` in ``[gamma/(1+gamma), 1)``.

    Encoder: plain RoPE (no decay). The factorised decay is a decay only for keys at or before
    the query; in bidirectional attention a key ``n - m`` positions *after* the query would be
    amplified by ``zeta^(-(n-m)/scale_base)``, growing with distance, the opposite of the
    paper's locality prior. A symmetric ``zeta^(|m-n|/scale_base)`` cannot be split into a
    query and a key factor (it would need explicit per-frequency scores and lose SDPA), and
    x-transformers refuses xPos in bidirectional attention for the same reason.

    Positions are taken from a fixed origin (0), not the sequence's centre as in torchscale
    (``docs/encodings/rope.md`` says why and how far that stays finite).

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: RoPE's wavelength base.
        gamma: the decay offset (0.4 in the paper).
        scale_base: the decay's length scale (512 in the paper).
    """

    applies_to = "encoder and decoder self-attention (q, k rotated and scaled); cross plain"
    former_paths = ("posenc.model.encodings.rotary.XPosEncoding",)  # runs before 2026-11-27
    encoder_form = "plain RoPE: the decay zeta^((m-n)/B) only decays for keys before the query"
    speed_target = 1.10
    augment_modes = frozenset({"random", "scale"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        gamma: float = 0.4,
        scale_base: float = 512.0,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if gamma <= 0 or scale_base <= 0:
            raise ValueError(f"xpos: gamma={gamma} and scale_base={scale_base} must be > 0")
        dim = d_model // n_heads
        if dim % 2:
            raise ValueError(f"xpos: the head dim d_model/n_heads = {dim} must be even (pairs)")
        self.scale_base = scale_base
        inv_freq = rope_frequencies(dim, base)
        zeta = (torch.arange(dim // 2, dtype=torch.float32) / (dim // 2) + gamma) / (1 + gamma)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("log_zeta", zeta.log(), persistent=False)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> RotaryTables:
        """Query and key tables ``(Lq, D/2)`` for the call's new tokens; the key table carries
        the inverse decay (decoder) or equals the query table (encoder)."""
        if not self.causal:
            table = rotation_table(q_pos, self.inv_freq)
            return RotaryTables(table, table)
        power = q_pos.to(torch.float32)[:, None] / self.scale_base * self.log_zeta[None, :]
        return RotaryTables(
            rotation_table(q_pos, self.inv_freq, power.exp()),
            rotation_table(q_pos, self.inv_freq, (-power).exp()),
        )
