"""LieRE, Lie rotational position encodings (Ostmeier et al., ICML 2025), in one dimension.

Queries and keys are rotated by the exponential of a learned skew-symmetric generator times the
token's position, block by block of each head's dims::

    q'_t = exp(x_t S) q_t,   k'_t = exp(x_t S) k_t,   S = U - U^T  (U strictly upper triangular)

so ``q'_i . k'_j = q_i^T exp((x_j - x_i) S) k_j`` depends on the distance alone (``exp(x S)`` is
orthogonal and commutes with itself), as RoPE's does; RoPE is the case of a block-diagonal
``S`` of fixed 2x2 rotations. Following the paper's code (StanfordMIMI/LieRE,
``LierePositionEncoder``):

* ``generator_dim`` ``b``: each head's dims form ``D / b`` blocks, each with its own ``b x b``
  generator (the code's default: ``b = 64``, one dense generator for its 64-dim heads; here
  ``b`` defaults to the head dim);
* ``U``'s entries start uniform in ``[0, 2 pi)`` (the code's ``torch.rand * 2 pi``, after
  RoPE-Mixed), the diagonal and lower triangle unused;
* one generator set for every layer and head by default (``per_layer``, ``per_head`` give each
  its own, the code's ``rotary_embedding_per_layer/per_head``);
* positions are normalised so the training length spans ``[0, 1]`` (the code scales image
  patch coordinates so the training grid does): ``x_t = t / max_len``;
* the exponential is taken in float32 (float64 in a float64 model), as the paper's.

Where it applies: encoder and decoder self-attention; cross-attention plain. The rotation is
bidirectional by construction, so the encoder uses it as it is.

Incremental decoding: the new tokens are rotated at their absolute positions before they are
cached, as RoPE's. Cost: one ``b x b`` matrix exponential per position, block and generator set
per forward (per layer with ``per_layer``), then a batched matrix product.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionRule,
    EncodingModule,
    Site,
    StackEncoding,
)
from posenc.model.encodings.rotation import block_exponentials, rotate_blocks


class LieGenerators(EncodingModule):
    """Skew-symmetric generators ``S (G, n, b, b)`` for ``G`` head groups (1 or ``H``) of ``n``
    blocks of ``b`` dims, and the rotations ``exp(x S)`` at positions ``x``."""

    def __init__(self, groups: int, blocks: int, block_dim: int) -> None:
        super().__init__()
        self.raw = nn.Parameter(torch.empty(groups, blocks, block_dim, block_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in ``[0, 2 pi)``, the paper's code's initialisation."""
        with torch.no_grad():
            self.raw.uniform_(0.0, 2 * math.pi)

    def skew(self) -> Tensor:
        """``S = U - U^T`` with ``U`` the strict upper triangle of the parameters."""
        upper = torch.triu(self.raw, diagonal=1)
        return upper - upper.transpose(-1, -2)

    def rotations(self, positions: Tensor) -> Tensor:
        """``exp(x_t S)`` ``(L, G, n, b, b)`` at normalised positions ``positions (L,)``."""
        return block_exponentials(self.skew(), positions)


class LieRERule(AttentionRule):
    """Rotates the new tokens' q and k by ``exp(x S)`` before caching: with its own generators
    (``per_layer``), or with the stack's rotations of the call (``call.context``)."""

    rotates_qk = True

    def __init__(self, generators: LieGenerators | None, max_len: int) -> None:
        super().__init__()
        self.generators, self.max_len = generators, max_len

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Tensor | None = None
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` rotated at ``positions (L,)``."""
        if self.generators is not None:
            context = self.generators.rotations(positions / self.max_len)
        if context is None or context.shape[0] != positions.shape[0]:
            raise ValueError("a LieRE rule without generators needs the stack's rotations")
        return rotate_blocks(q, context), rotate_blocks(k, context), None


class LieREEncoding(StackEncoding):
    """LieRE on encoder and decoder self-attention.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        generator_dim: dims per rotated block (must divide the head dim; None: the head dim,
            one dense generator).
        per_layer: each layer its own generators (default: one set for the stack).
        per_head: each head its own generators (default: one for every head).
        max_len: the length that normalised positions map to 1 (the training length).

    Raises:
        ValueError: a block size that does not divide the head dim, or a length below 1.
    """

    applies_to = "encoder and decoder self-attention (q, k rotated); cross-attention plain"
    encoder_form = "same rotation as the decoder (exp(x S) is orthogonal: bidirectional)"
    speed_target = 1.30
    augment_modes = frozenset({"random", "scale"})
    option_forms = ({"generator_dim": 2, "per_layer": True, "per_head": True},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        generator_dim: int | None = None,
        per_layer: bool = False,
        per_head: bool = False,
        max_len: int = 256,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        head_dim = d_model // n_heads
        block = head_dim if generator_dim is None else generator_dim
        if block < 2 or head_dim % block:
            raise ValueError(
                f"liere: generator_dim={generator_dim} must be at least 2 and divide the head "
                f"dim {head_dim}; set pe.generator_dim to a divisor (null: the head dim)"
            )
        if max_len < 1:
            raise ValueError(f"liere: max_len={max_len} must be at least 1 (the training length)")
        self.max_len = max_len
        self.shape = (n_heads if per_head else 1, head_dim // block, block)
        self.shared = None if per_layer else LieGenerators(*self.shape)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The rotations ``(Lq, G, n, b, b)`` of the call's new tokens from the stack's
        generators (None with ``per_layer``: each layer computes its own)."""
        if self.shared is None:
            return None
        return self.shared.rotations(q_pos / self.max_len)

    def self_rule(self, layer: int) -> AttentionRule:
        own = LieGenerators(*self.shape) if self.shared is None else None
        return LieRERule(own, self.max_len)
