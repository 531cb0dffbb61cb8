"""RoPE++ (Liu et al. 2025, "Beyond Real: Imaginary Extension of Rotary Position Embeddings"):
the imaginary part of RoPE's complex score as a second group of attention heads.

RoPE's score is the real part of a complex product; with pair ``j`` of a head read as the
complex number ``q_j = q_2j + i q_2j+1`` and rotated by ``e^(i m theta_j)``::

    A_re(m, n) = Re sum_j q~_j conj(k~_n,j),    A_im(m, n) = Im sum_j q~_j conj(k~_n,j)

``A_im`` is the real score of the query turned by ``-i`` (a quarter turn back) in every pair:
``(a, b) -> (b, -a)``. Each projected head attends twice, as a real head and as an imaginary
head with the same key and value (the paper's code orders them real, imaginary per projected
head), both scaled by ``1/sqrt(D)``. The two variants of the paper:

* ``equal_heads`` (RoPE++_EH): ``H/2`` projected heads, so q, k, v and the key cache are half
  of RoPE's, and ``H`` attention heads feed the output projection as RoPE's do;
* ``equal_cache`` (RoPE++_EC): ``H`` projected heads (RoPE's q, k, v and cache) and ``2H``
  attention heads, the output projection twice as wide.

Where it applies: encoder and decoder self-attention; cross-attention plain with RoPE's heads,
as RoPE's default (the paper is decoder-only; the encoder attends both ways, where ``A_im``'s
``sin((m - n) theta)`` part tells a key before the query from one after it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.rotation import (
    RotaryRule,
    RotaryStack,
    RotaryTables,
    paired_head_dim,
    rope_frequencies,
    rotation_table,
)

VARIANTS = ("equal_heads", "equal_cache")


def imaginary_queries(q: Tensor) -> Tensor:
    """``q (B, h, L, D)`` turned by ``-i`` in every pair ``(2j, 2j+1)``: ``(a, b) -> (b, -a)``,
    so that the real score of the result is the imaginary score of ``q``."""
    return torch.stack((q[..., 1::2], -q[..., 0::2]), dim=-1).flatten(-2)


def both_heads(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q (B, h, Lq, D)``, ``k, v (B, h, Lk, D)`` as ``2h`` heads ordered real, imaginary per
    projected head: the queries and their :func:`imaginary_queries`, keys and values repeated."""
    queries = torch.stack((q, imaginary_queries(q)), dim=2).flatten(1, 2)
    return queries, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)


class ImaginaryRotaryRule(RotaryRule):
    """One layer's RoPE++: q and k rotated before caching (:class:`RotaryRule`), then each
    projected head attending as a real and an imaginary head.

    Args:
        variant: ``equal_heads`` or ``equal_cache`` (:data:`VARIANTS`).
    """

    def __init__(self, variant: str) -> None:
        super().__init__()
        self.variant = variant

    def head_counts(self, n_heads: int) -> tuple[int, int]:
        """``(H/2, H)`` for ``equal_heads``, ``(H, 2H)`` for ``equal_cache``."""
        if self.variant == "equal_heads":
            return n_heads // 2, n_heads
        return n_heads, 2 * n_heads

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """``(B, 2h, Lq, Lk)``: the real and imaginary heads' weights."""
        q, k, _ = both_heads(q, k, k)
        return super().weights(q, k, key_state, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """``(B, 2h, Lq, D)`` from ``h`` rotated heads of q, k, v."""
        return super().forward(*both_heads(q, k, v), key_state, call)


class ImaginaryRotaryEncoding(RotaryStack):
    """RoPE++ in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: RoPE's base.
        variant: ``equal_heads`` (RoPE++_EH) or ``equal_cache`` (RoPE++_EC).

    Raises:
        ValueError: an unknown variant, an odd head dim, or ``equal_heads`` with an odd number
            of heads (one line each).
    """

    applies_to = (
        "encoder and decoder self-attention (RoPE's real score and its imaginary part as "
        "heads of their own); cross-attention plain"
    )
    encoder_form = "the same two groups of heads, attending both ways"
    speed_target = 1.30
    option_forms = ({"variant": "equal_cache"},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        variant: str = "equal_heads",
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if variant not in VARIANTS:
            raise ValueError(f"rope_pp: variant={variant!r} is unknown; use one of {VARIANTS}")
        head_dim = paired_head_dim("rope_pp", d_model, n_heads)
        if variant == "equal_heads" and n_heads % 2:
            raise ValueError(
                f"rope_pp: equal_heads projects n_heads/2 heads, and n_heads={n_heads} is odd; "
                "use an even model.n_heads or variant=equal_cache"
            )
        self.variant = variant
        self.register_buffer("inv_freq", rope_frequencies(head_dim, base), persistent=False)

    def self_rule(self, layer: int) -> ImaginaryRotaryRule:
        return ImaginaryRotaryRule(self.variant)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> RotaryTables:
        """RoPE's table ``(Lq, D/2)`` for the call's new tokens (queries and keys alike)."""
        table = rotation_table(q_pos, self.inv_freq)
        return RotaryTables(table, table)
