"""PoPE — polar-coordinate positions (Gopalakrishnan et al. 2025, "Decoupling the 'What' and
'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534).

Each of the ``D`` dims ``c`` of a head becomes one complex number: its magnitude is
``softplus`` of the dim's value (the content, "what") and its phase comes from the position
alone ("where"): ``t theta_c`` for a query at position ``t`` and ``s theta_c + delta_{h,c}``
for a key at ``s``, with ``theta_c = base^(-c/D)`` for ``c = 0 .. D-1`` (``D`` frequencies, one
per dim, where RoPE has ``D/2``) and ``delta`` a learned phase bias per head and dim, clamped
to ``[-2 pi, 0]`` (one per stack, shared by its layers, as in x-transformers). The logit is
the real part of their product:

    score(t, s) = sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c - delta_{h,c}) / sqrt(D)

so it depends on the positions only through ``t - s`` and on the content only through the
non-negative magnitudes. In real arithmetic ``q`` and ``k`` become ``2D`` dims,
``[mu cos(phi), mu sin(phi)]``, whose dot product is that sum; the softmax keeps the head's own
``1/sqrt(D)`` (as x-transformers' ``polar_pos_emb``, whose scale is set before the doubling).
Values keep ``D`` dims.

Where it applies: encoder and decoder self-attention; cross-attention stays plain. Keys are
transformed once at their own position before they enter the decoder's cache, as RoPE's are.
Magnitudes and phases are computed in float32 for half-precision inputs. The phases of a
forward's new tokens are computed once in :meth:`PolarEncoding.context` and shared by every
layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionRule,
    Site,
    StackEncoding,
)

PHASE_BIAS_INITS = ("zero", "uniform")


def polar_frequencies(head_dim: int, base: float) -> Tensor:
    """PoPE's ``theta (D,)``: ``base^(-c/D)`` for every dim ``c`` of a head."""
    return base ** -(torch.arange(head_dim, dtype=torch.float32) / head_dim)


def to_polar(x: Tensor, phases: Tensor) -> Tensor:
    """``x (B, H, L, D)`` as ``[softplus(x) cos(phases), softplus(x) sin(phases)]``
    ``(B, H, L, 2D)`` for ``phases`` broadcastable to ``(B, H, L, D)``; computed in float32 for
    half-precision inputs and returned in ``x``'s dtype."""
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    magnitude = F.softplus(work)
    phases = phases.to(work.dtype)
    return torch.cat((magnitude * phases.cos(), magnitude * phases.sin()), dim=-1).to(x.dtype)


@dataclass
class PolarPhases:
    """The phases of one forward's new tokens: ``query (L, D)`` is ``t theta_c``; ``key
    (H, L, D)`` adds the clamped phase bias ``delta``."""

    query: Tensor
    key: Tensor


class PolarRule(AttentionRule):
    """Self-attention of one PoPE layer: new queries and keys turned into polar form with the
    stack's :class:`PolarPhases` before caching (``(B, H, L, 2D)``), then the base class's
    softmax attention at the head's ``1/sqrt(D)`` (values keep ``D`` dims)."""

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: PolarPhases | None = None
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` at ``positions (L,)`` -> their polar forms ``(B, H, L, 2D)``."""
        if context is None or context.query.shape[0] != positions.shape[0]:
            raise ValueError(
                "a PoPE rule needs the stack's phases built from the call's q_pos "
                f"({positions.shape[0]} positions)"
            )
        return to_polar(q, context.query), to_polar(k, context.key), None

    def score_scale(self, q: Tensor) -> float:
        """``1/sqrt(D)`` of the head, for polar ``q (..., 2D)``."""
        return 1.0 / math.sqrt(q.shape[-1] // 2)


class PolarEncoding(StackEncoding):
    """PoPE on encoder and decoder self-attention, with one ``(H, D)`` key phase bias per stack
    shared by its layers (as x-transformers' ``PolarEmbedding``).

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: the wavelength base of ``theta_c = base^(-c/D)`` (10000).
        phase_bias_init: ``zero`` (the paper's default) or ``uniform`` in ``[-2 pi, 0]``
            (x-transformers' ``bias_uniform_init``).
    """

    applies_to = "encoder and decoder self-attention (softplus magnitudes, phases from position)"
    encoder_form = "same as the decoder (the phase difference is relative in both directions)"
    speed_target = 1.30
    augment_modes = frozenset({"random", "scale"})
    option_forms = ({"phase_bias_init": "uniform"},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        phase_bias_init: str = "zero",
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if phase_bias_init not in PHASE_BIAS_INITS:
            raise ValueError(
                f"pope: phase_bias_init={phase_bias_init!r} is unknown; use one of "
                f"{PHASE_BIAS_INITS}"
            )
        if base <= 1.0:
            raise ValueError(f"pope: base={base} must be > 1 (wavelengths grow with the dim)")
        head_dim = d_model // n_heads
        self.phase_bias_init = phase_bias_init
        self.register_buffer("inv_freq", polar_frequencies(head_dim, base), persistent=False)
        self.phase_bias = nn.Parameter(torch.zeros(n_heads, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The phase bias: 0, or uniform in ``[-2 pi, 0]``."""
        if self.phase_bias_init == "uniform":
            nn.init.uniform_(self.phase_bias, -2 * math.pi, 0.0)
        else:
            nn.init.zeros_(self.phase_bias)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> PolarPhases:
        """The phases of the call's new tokens (keys share the queries' positions)."""
        dtype = torch.promote_types(self.inv_freq.dtype, torch.float32)
        angles = q_pos.to(dtype)[:, None] * self.inv_freq.to(dtype)
        delta = self.phase_bias.clamp(-2 * math.pi, 0.0)[:, None, :]
        return PolarPhases(angles, angles + delta)

    def self_rule(self, layer: int) -> AttentionRule:
        return PolarRule()
