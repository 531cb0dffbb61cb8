"""Data-aware slow bands (DaRoPE, Levy et al. 2026, "RoPE is dead, long live RoPE"), from its
equations 4-6 as quoted. The paper's own text was not at hand, and no code was published.

RoPE's fast bands stay RoPE's: pair ``j`` of token ``m`` turns by ``m theta_j``. A slow band,
one whose wavelength exceeds the training length ``L`` (``theta_j < 2 pi / L``, HoPE's rule),
turns by ``c_h(x_m) theta_j`` with a learned, token-dependent coordinate per head::

    c_h(x_m) = L sigmoid(w_h . x_m + alpha_h logit(p_m / L)),   p_m = clip(m + 0.5, 0.5, L - 0.5)

With ``w_h = 0`` and ``alpha_h = 1`` (the initial values here) ``c_h = m + 0.5`` up to ``L``,
RoPE up to a constant offset that cancels in every score; beyond ``L`` the slow bands stop at
``L - 0.5`` (the clip), so a long input never shows them an angle unseen in training. A score's
slow part depends on ``c_h(x_m) - c_h(x_n)``: a distance the model learns per head and token.

Choices the quotation leaves open, made here and stated in the guide:

* ``x_m`` is the layer's input (at the first layer, the token embedding), and
  each layer has its own ``w`` (``d x H``) and ``alpha`` (``H``);
* the clip keeps ``p_m`` inside ``(0, L)``, ``[0.5, L - 0.5]``, so the logit is finite and a
  new model is RoPE on every position below ``L``.

Where it applies: encoder and decoder self-attention, each on its own side's positions and
inputs; cross-attention plain, as RoPE's default (a target query and a source key have no
shared axis, and a key's coordinate would need the source layer's input, which cross-attention
does not see). The coordinates and the rotation run in float32 (float64 in a float64 model).

Incremental decoding: a token's rotation depends on its own input and position only, so q and k
are rotated before the key cache (:meth:`DataAwareRotaryRule.prepare`), as RoPE's are.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionRule, Site, StackEncoding, compute_dtype
from posenc.model.encodings.rotation import (
    paired_head_dim,
    rope_frequencies,
    rotate,
    slow_bands,
)


def slow_coordinates(
    logits: Tensor, alpha: Tensor, positions: Tensor, training_length: int
) -> Tensor:
    """``c (B, H, L)``: ``L sigmoid(logits + alpha logit(p / L))`` for ``logits (B, L, H)``
    (``w_h . x_m``), ``alpha (H,)`` and ``positions (L,)``, ``p`` the positions plus one half,
    clipped to ``[0.5, L - 0.5]``."""
    half = 0.5
    p = (positions.to(logits.dtype) + half).clamp(half, training_length - half) / training_length
    prior = torch.log(p) - torch.log1p(-p)  # logit(p), (L,)
    return (training_length * torch.sigmoid(logits + alpha * prior[:, None])).transpose(1, 2)


class DataAwareRotaryRule(AttentionRule):
    """One layer's DaRoPE: the coordinate projection ``w`` (``d -> H``, no bias), the per-head
    ``alpha`` and the rotation of the new tokens' q and k before caching.

    Args:
        d_model: input width ``d``.
        n_heads: ``H``, one coordinate per head and token.
        inv_freq: RoPE's frequencies ``(D/2,)``, highest first (float64, cast to the
            compute dtype at use).
        training_length: ``L``.
    """

    rotates_qk = True

    def __init__(self, d_model: int, n_heads: int, inv_freq: Tensor, training_length: int) -> None:
        super().__init__()
        self.training_length = training_length
        self.coordinate = nn.Linear(d_model, n_heads, bias=False)
        self.alpha = nn.Parameter(torch.ones(n_heads))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("slow", slow_bands(inv_freq, training_length), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``w = 0``, ``alpha = 1``: RoPE up to a constant offset below ``L``."""
        nn.init.zeros_(self.coordinate.weight)
        nn.init.ones_(self.alpha)

    def tables(self, x: Tensor, positions: Tensor) -> Tensor:
        """The complex rotations ``(B, H, L, D/2)`` of tokens ``x (B, L, d)`` at ``positions
        (L,)``: ``m theta_j`` on the fast bands, ``c_h(x_m) theta_j`` on the slow ones."""
        with torch.autocast(x.device.type, enabled=False):
            dtype = compute_dtype(x)
            logits = F.linear(x.to(dtype), self.coordinate.weight.to(dtype))
            c = slow_coordinates(logits, self.alpha.to(dtype), positions, self.training_length)
            m = positions.to(dtype)[None, None, :, None]
            coordinate = torch.where(self.slow, c[..., None], m)  # (B, H, L, D/2)
            angles = coordinate * self.inv_freq.to(dtype)
            return torch.polar(torch.ones_like(angles), angles)

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: object = None
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` rotated by :meth:`tables`; nothing else is cached."""
        table = self.tables(x, positions)
        return rotate(q, table), rotate(k, table), None


class DataAwareRotaryEncoding(StackEncoding):
    """DaRoPE in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: RoPE's base.
        training_length: ``L``, the longest side trained on (``trainer.max_positions``): which
            bands are slow, and the scale of their coordinates.

    Raises:
        ValueError: an odd head dim, or a training length below 1 (one line each).
    """

    applies_to = (
        "encoder and decoder self-attention (fast bands RoPE's, slow bands at learned "
        "token coordinates); cross-attention plain"
    )
    encoder_form = "the same rotation on source positions and inputs (bidirectional)"
    speed_target = 1.30

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        training_length: int = 128,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        head_dim = paired_head_dim("darope", d_model, n_heads)
        if (
            isinstance(training_length, bool)
            or not isinstance(training_length, int)
            or (training_length < 1)
        ):
            raise ValueError(
                f"darope: training_length={training_length!r} must be a whole number of "
                "positions >= 1 (the longest side trained on, trainer.max_positions)"
            )
        self.training_length = training_length
        self.inv_freq = rope_frequencies(head_dim, base, torch.float64)  # cast at use
        if not slow_bands(self.inv_freq, training_length).any():
            slowest_wavelength = 2 * math.pi / float(self.inv_freq[-1])
            raise ValueError(
                f"darope: no band is slow at training_length={training_length} (the slowest "
                f"wavelength is {slowest_wavelength:.0f} positions); raise training_length or base"
            )

    def self_rule(self, layer: int) -> DataAwareRotaryRule:
        return DataAwareRotaryRule(
            self.d_model, self.n_heads, self.inv_freq.clone(), self.training_length
        )
