"""FoPE, Fourier position embedding (Hua et al., ICML 2025), as its authors' code computes it.

RoPE's rotation of pair ``p`` at position ``t`` is ``cos(w_p t) + i sin(w_p t)``. FoPE keeps only
the frequencies whose period fits the training length ``L`` (``w_k >= 2 pi / L``; the lower ones
are "poorly trained" and zeroed), and makes each of the first ``P = min(K, D/4)`` pairs a Fourier
series over the ``K`` kept frequencies, with separate coefficients for the two parts::

    C[h, t, p] = sum_k cos(w_k t) c[h, k, p],    S[h, t, p] = sum_k sin(w_k t) s[h, k, p]

    x'_t = x_t * (C + i S)   (pair (2p, 2p+1) as one complex number, per head)

The remaining ``D/2 - P`` pairs take ``C = S = 1``: a fixed, position-independent map (the
clipped low frequencies). Following the paper's code (TsinghuaC3I/Fourier-Position-Embedding,
``FourierEmbedding``):

* ``c`` and ``s`` are ``(H, K, P)`` per layer, drawn ``xavier_normal_(gain)`` (gain 0.3, its
  smallest model's) plus the identity (when ``K > P``, ones at ``(i * ceil(K/P), i)``), so at
  ``gain = 0`` FoPE is RoPE on the kept frequencies;
* they are fixed, as in every released configuration (``fourier_learnable`` false); ``learnable``
  trains them;
* the kept frequencies are RoPE's ``base^(-2k/D)`` (``base`` 10000).

Where it applies: encoder and decoder self-attention; cross-attention plain. The map is the same
in both directions, so the encoder uses it as it is. Unlike RoPE's, ``q'_i . k'_j`` is not a
function of ``i - j`` alone once the coefficients leave the identity.

Incremental decoding: the new tokens are mapped at their absolute positions before they are
cached, as RoPE's.
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
    compute_dtype,
)
from posenc.model.encodings.rotation import rope_frequencies, rotate


def kept_frequencies(head_dim: int, max_len: int, base: float = 10000.0) -> Tensor:
    """RoPE's frequencies ``(K,)`` of a ``head_dim`` head whose period ``2 pi / w`` is at most
    ``max_len`` (FoPE's clipping of the low frequencies)."""
    frequencies = rope_frequencies(head_dim, base)
    return frequencies[frequencies >= 2 * math.pi / max_len]


class FourierCoefficients(EncodingModule):
    """One layer's Fourier coefficients ``cos_coef, sin_coef (H, K, P)`` over the kept
    frequencies ``(K,)``, and the complex maps ``C + i S`` they give."""

    def __init__(
        self, heads: int, frequencies: Tensor, pairs: int, gain: float, learnable: bool
    ) -> None:
        super().__init__()
        kept = frequencies.numel()
        self.pairs, self.gain = pairs, gain
        self.outputs = min(kept, (2 * pairs) // 4)
        self.register_buffer("frequencies", frequencies.clone(), persistent=False)
        shape = (heads, kept, self.outputs)
        if learnable:
            self.cos_coef = nn.Parameter(torch.empty(shape))
            self.sin_coef = nn.Parameter(torch.empty(shape))
        else:
            self.register_buffer("cos_coef", torch.empty(shape))
            self.register_buffer("sin_coef", torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-normal noise of gain :attr:`gain` plus the (stepped) identity, the paper's
        code's ``eye_xavier_norm``."""
        kept, outputs = self.cos_coef.shape[1:]
        step = math.ceil(kept / outputs)
        eye = torch.zeros(kept, outputs)
        for i in range(outputs):
            if i * step < kept:
                eye[i * step, i] = 1.0
        with torch.no_grad():
            for coef in (self.cos_coef, self.sin_coef):
                nn.init.xavier_normal_(coef, gain=self.gain)
                coef += eye

    def maps(self, positions: Tensor) -> Tensor:
        """``C + i S`` ``(H, L, D/2)`` (complex) at ``positions (L,)``: the Fourier series on the
        first ``P`` pairs, ``1 + i`` on the rest."""
        dtype = compute_dtype(self.cos_coef)
        with torch.autocast(positions.device.type, enabled=False):
            angles = positions.to(dtype)[:, None] * self.frequencies.to(dtype)  # (L, K)
            real = torch.einsum("lk,hkp->hlp", angles.cos(), self.cos_coef.to(dtype))
            imag = torch.einsum("lk,hkp->hlp", angles.sin(), self.sin_coef.to(dtype))
            rest = self.pairs - self.outputs
            real = nn.functional.pad(real, (0, rest), value=1.0)
            imag = nn.functional.pad(imag, (0, rest), value=1.0)
            return torch.complex(real, imag)


class FoPERule(AttentionRule):
    """Maps the new tokens' q and k by its layer's :class:`FourierCoefficients` before
    caching."""

    rotates_qk = True

    def __init__(self, coefficients: FourierCoefficients) -> None:
        super().__init__()
        self.coefficients = coefficients

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: None = None
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` mapped at ``positions (L,)``."""
        maps = self.coefficients.maps(positions)
        return rotate(q, maps), rotate(k, maps), None


class FoPEEncoding(StackEncoding):
    """FoPE on encoder and decoder self-attention, each layer its own coefficients.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        max_len: the training length ``L``; frequencies with a longer period are clipped.
        base: RoPE's base.
        gain: the coefficients' Xavier-normal gain (0: RoPE on the kept frequencies).
        learnable: train the coefficients (the paper's released configurations fix them).

    Raises:
        ValueError: an odd head dim or one below 4, a length below 2 or no frequency left
            after clipping.
    """

    applies_to = "encoder and decoder self-attention (q, k mapped by Fourier series); cross plain"
    encoder_form = "same map as the decoder (a function of each token's own position)"
    speed_target = 1.30
    augment_modes = frozenset({"random", "scale", "shift"})
    option_forms = ({"learnable": True, "gain": 0.0},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_len: int = 256,
        base: float = 10000.0,
        gain: float = 0.3,
        learnable: bool = False,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        head_dim = d_model // n_heads
        if head_dim % 2 or head_dim < 4:
            raise ValueError(
                f"fope: the head dim {head_dim} must be even and at least 4; change d_model or "
                "n_heads"
            )
        if max_len < 2:
            raise ValueError(f"fope: max_len={max_len} must be at least 2 (the training length)")
        self.frequencies = kept_frequencies(head_dim, max_len, base)
        if self.frequencies.numel() == 0:
            raise ValueError(f"fope: no frequency has a period within max_len={max_len}")
        self.pairs, self.gain, self.learnable = head_dim // 2, gain, learnable

    def self_rule(self, layer: int) -> AttentionRule:
        coefficients = FourierCoefficients(
            self.n_heads, self.frequencies, self.pairs, self.gain, self.learnable
        )
        return FoPERule(coefficients)
