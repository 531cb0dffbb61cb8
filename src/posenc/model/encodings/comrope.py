"""ComRoPE, rotary position embedding by trainable commuting angle matrices (Yu et al., CVPR
2025), in one dimension.

Queries and keys are rotated block by block by the exponential of a trainable block-diagonal
skew-symmetric angle matrix times the token's position::

    q'_t = exp(t A) q_t,   k'_t = exp(t A) k_t,   A = diag(B_1, ..., B_m)

so ``q'_i . k'_j = q_i^T exp((j - i) A) k_j`` depends on the distance alone. With one axis the
commuting condition of the paper holds by itself (its appendix on language models), and its two
forms are:

* ``ap`` (ComRoPE-AP): ``B_j = P_j - P_j^T``, ``P_j`` a free ``b x b`` matrix;
* ``ld`` (ComRoPE-LD): ``B_j = theta_j (P_j - P_j^T)``, one more scalar per block.

Following the paper's code (Longin-Yu/ComRoPE, ``model.py``): each attention layer its own
matrices, each head its own ``P`` (``theta`` shared by the heads), ``P ~ N(0, init_std^2)``
with ``init_std`` 1.0 and ``theta ~ N(0, 1)``, ``block_dim`` ``b`` 8 (the paper's; the code's
default is 2). Positions are the token indices, unscaled, as the paper prescribes for language
(the code scales image coordinates into (0, 1); ``max_len`` does the same here, null: not).

Where it applies: encoder and decoder self-attention; cross-attention plain. The rotation is
bidirectional by construction, so the encoder uses it as it is. Incremental decoding: the new
tokens are rotated at their absolute positions before they are cached, as RoPE's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionRule, EncodingModule, Site, StackEncoding
from posenc.model.encodings.rotation import block_exponentials, rotate_blocks

#: the paper's two forms
VARIANTS = ("ap", "ld")


class AngleMatrices(EncodingModule):
    """One layer's angle matrices: ``P (H, n, b, b)`` and, for ``ld``, ``theta (n,)``; the
    generators ``B (H, n, b, b)`` and their exponentials at given positions."""

    def __init__(self, heads: int, blocks: int, block_dim: int, variant: str, init_std: float):
        super().__init__()
        self.init_std = init_std
        self.matrices = nn.Parameter(torch.empty(heads, blocks, block_dim, block_dim))
        self.multiplier = nn.Parameter(torch.empty(blocks)) if variant == "ld" else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``P ~ N(0, init_std^2)``, ``theta ~ N(0, 1)``: the paper's code's draws."""
        with torch.no_grad():
            self.matrices.normal_(0.0, self.init_std)
            if self.multiplier is not None:
                self.multiplier.normal_(0.0, 1.0)

    def generators(self) -> Tensor:
        """``B_j = P_j - P_j^T`` (times ``theta_j`` for ``ld``) ``(H, n, b, b)``."""
        skew = self.matrices - self.matrices.transpose(-1, -2)
        if self.multiplier is not None:
            skew = skew * self.multiplier[:, None, None]
        return skew


class ComRoPERule(AttentionRule):
    """Rotates the new tokens' q and k by its layer's ``exp(x A)`` before caching."""

    rotates_qk = True

    def __init__(self, angles: AngleMatrices, scale: float) -> None:
        super().__init__()
        self.angles, self.scale = angles, scale

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: None = None
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` rotated at ``positions (L,)`` (times the stack's scale)."""
        rotations = block_exponentials(self.angles.generators(), positions * self.scale)
        return rotate_blocks(q, rotations), rotate_blocks(k, rotations), None


class ComRoPEEncoding(StackEncoding):
    """ComRoPE on encoder and decoder self-attention, each layer its own angle matrices.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        variant: ``ap`` or ``ld`` (the module docstring).
        block_dim: dims per rotated block (must divide the head dim).
        init_std: the standard deviation of ``P``'s entries at initialisation.
        max_len: positions are divided by it (null: the token indices, the paper's choice for
            language).

    Raises:
        ValueError: an unknown variant, a block size that does not divide the head dim, a
            negative standard deviation or a length below 1.
    """

    applies_to = "encoder and decoder self-attention (q, k rotated); cross-attention plain"
    encoder_form = "same rotation as the decoder (exp(x A) is orthogonal: bidirectional)"
    speed_target = 1.30
    augment_modes = frozenset({"random", "scale"})
    option_forms = ({"variant": "ld", "block_dim": 2, "max_len": 64},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        variant: str = "ap",
        block_dim: int = 8,
        init_std: float = 1.0,
        max_len: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        head_dim = d_model // n_heads
        if variant not in VARIANTS:
            raise ValueError(f"comrope: variant={variant!r} is not one of {', '.join(VARIANTS)}")
        if block_dim < 2 or head_dim % block_dim:
            raise ValueError(
                f"comrope: block_dim={block_dim} must be at least 2 and divide the head dim "
                f"{head_dim}; set pe.block_dim to a divisor"
            )
        if init_std < 0:
            raise ValueError(f"comrope: init_std={init_std} must be >= 0")
        if max_len is not None and max_len < 1:
            raise ValueError(f"comrope: max_len={max_len} must be at least 1 or null")
        self.variant, self.init_std = variant, init_std
        self.shape = (n_heads, head_dim // block_dim, block_dim)
        self.scale = 1.0 if max_len is None else 1.0 / max_len

    def self_rule(self, layer: int) -> AttentionRule:
        angles = AngleMatrices(*self.shape, self.variant, self.init_std)
        return ComRoPERule(angles, self.scale)
