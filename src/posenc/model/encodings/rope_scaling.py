"""RoPE's context-extension scalings.

One function each in :data:`SCALINGS`, keyed by ``pe.scaling`` (as transformers'
``ROPE_INIT_FUNCTIONS``), and, for the scalings whose frequencies follow the sequence length
(dynamic NTK, LongRoPE), the frequencies at given lengths in :data:`AT_LENGTHS`;
:mod:`~posenc.model.encodings.rotary` applies them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.model.encodings.rotation import rope_frequencies

YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


def yarn_attention_factor(
    factor: float, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """YaRN's temperature ``sqrt(1/t) = 0.1 ln(factor) + 1`` (1 for ``factor <= 1``); with
    ``mscale`` and ``mscale_all_dim`` (DeepSeek-V2's form, as transformers reads them) the ratio
    ``(0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1)``."""

    def temperature(weight: float) -> float:
        return 0.1 * weight * math.log(factor) + 1.0 if factor > 1.0 else 1.0

    if mscale and mscale_all_dim:
        return temperature(mscale) / temperature(mscale_all_dim)
    return temperature(1.0)


@dataclass(frozen=True)
class ScalingSettings:
    """What a context-extension scaling reads: ``dim`` rotated dims, RoPE's ``base``, the
    extension ``factor``, the training length ``original_max_len``, and Llama 3's band limits
    (wavelengths beyond ``original_max_len / low_freq_factor`` are interpolated, those below
    ``original_max_len / high_freq_factor`` kept; Llama 3.1's 1 and 4), YaRN's
    ``mscale``/``mscale_all_dim`` (:func:`yarn_attention_factor`), and LongRoPE's per-pair
    ``short_factor`` and ``long_factor`` (``dim / 2`` each)."""

    dim: int
    base: float = 10000.0
    factor: float = 1.0
    original_max_len: int = 256
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None


Scaling = Callable[[ScalingSettings], tuple[Tensor, float]]
"""``settings -> (inverse frequencies (dim/2,), attention factor)``: one context-extension
scaling of RoPE."""


def _unscaled(s: ScalingSettings) -> tuple[Tensor, float]:
    """RoPE's own frequencies (also dynamic NTK's up to ``original_max_len``:
    :func:`dynamic_ntk_inverse_frequencies` gives them at any length)."""
    return rope_frequencies(s.dim, s.base), 1.0


def _linear(s: ScalingSettings) -> tuple[Tensor, float]:
    """Position interpolation: every frequency divided by ``factor``."""
    return rope_frequencies(s.dim, s.base) / s.factor, 1.0


def _ntk(s: ScalingSettings) -> tuple[Tensor, float]:
    """NTK-aware: the base raised to ``base * factor^(dim/(dim-2))``."""
    return rope_frequencies(s.dim, s.base * s.factor ** (s.dim / (s.dim - 2))), 1.0


def _yarn(s: ScalingSettings) -> tuple[Tensor, float]:
    """YaRN: the fast pairs kept, the slow ones interpolated, a linear ramp between, and the
    attention temperature :func:`yarn_attention_factor`."""
    dim, base = s.dim, s.base
    inv_freq = rope_frequencies(dim, base)

    def pair_index(rotations: float) -> float:
        """The (fractional) pair index whose wavelength fits ``rotations`` times into the
        training length."""
        return dim * math.log(s.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index(YARN_BETA_FAST)), 0)
    high = min(math.ceil(pair_index(YARN_BETA_SLOW)), dim - 1)
    if low == high:
        high += 0.001
    # 0 below ``low`` (fast pairs: extrapolate), 1 above ``high`` (slow pairs: interpolate).
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0.0, 1.0)
    inv_freq = inv_freq * (1.0 - ramp) + inv_freq / s.factor * ramp
    return inv_freq, yarn_attention_factor(s.factor, s.mscale, s.mscale_all_dim)


def _llama3(s: ScalingSettings) -> tuple[Tensor, float]:
    """Llama 3.1's banded interpolation: a pair whose wavelength ``2 pi / theta`` is shorter than
    ``original_max_len / high_freq_factor`` keeps its frequency, one longer than
    ``original_max_len / low_freq_factor`` is divided by ``factor``, and between the two the
    frequency blends both, ``(1 - a) theta / factor + a theta`` with ``a = (original_max_len /
    wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``."""
    inv_freq = rope_frequencies(s.dim, s.base)
    wavelength = 2 * math.pi / inv_freq
    blend = (s.original_max_len / wavelength - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - blend) * inv_freq / s.factor + blend * inv_freq
    long_waves = wavelength > s.original_max_len / s.low_freq_factor
    short_waves = wavelength < s.original_max_len / s.high_freq_factor
    out = torch.where(long_waves, inv_freq / s.factor, blended)
    return torch.where(short_waves, inv_freq, out), 1.0


def _longrope_attention_factor(s: ScalingSettings) -> float:
    """LongRoPE's temperature ``sqrt(1 + ln(factor) / ln(original_max_len))`` (1 for
    ``factor <= 1``), as transformers computes it."""
    if s.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_len))


def _longrope(s: ScalingSettings) -> tuple[Tensor, float]:
    """LongRoPE (Ding et al. 2024, Phi-3's form in transformers): pair ``i``'s frequency
    divided by ``short_factor[i]`` up to ``original_max_len`` (these), by ``long_factor[i]``
    beyond (:func:`longrope_inverse_frequencies`), cos and sin times its temperature."""
    short = torch.tensor(s.short_factor, dtype=torch.float32)
    return rope_frequencies(s.dim, s.base) / short, _longrope_attention_factor(s)


#: every scaling by its ``pe.scaling`` name
SCALINGS: dict[str, Scaling] = {
    "none": _unscaled,
    "linear": _linear,
    "ntk": _ntk,
    "yarn": _yarn,
    "dynamic_ntk": _unscaled,
    "llama3": _llama3,
    "longrope": _longrope,
}


def dynamic_ntk_inverse_frequencies(
    inv_freq: Tensor, factor: float, original_max_len: int, lengths: Tensor
) -> Tensor:
    """Dynamic NTK's inverse frequencies ``(S, r/2)`` at the sequence lengths ``lengths (S,)``,
    from RoPE's ``inv_freq (r/2,)`` (``theta_i = base^(-2i/r)``).

    The base at length ``L`` is ``base * s^(r/(r-2))``, ``s = max(1, factor L / L_train -
    (factor - 1))``, so ``theta_i`` is multiplied by ``s^(-(2i/r) r/(r-2))``: exactly RoPE's at
    ``L <= L_train`` (``s = 1``).
    """
    dim = 2 * inv_freq.shape[-1]
    stretch = (factor * lengths.to(torch.float32) / original_max_len - (factor - 1)).clamp(min=1.0)
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=inv_freq.device) / (dim - 2)
    return inv_freq * stretch[:, None] ** -exponents


def longrope_inverse_frequencies(inv_freq: Tensor, s: ScalingSettings, lengths: Tensor) -> Tensor:
    """LongRoPE's inverse frequencies ``(S, r/2)`` at the sequence lengths ``lengths (S,)``
    from its short ones ``inv_freq (r/2,)`` (:data:`SCALINGS`' ``longrope``): pair ``i``
    divided by ``long_factor[i]`` instead of ``short_factor[i]`` for lengths over
    ``original_max_len``."""
    ratio = torch.tensor(
        s.short_factor, dtype=torch.float32, device=inv_freq.device
    ) / torch.tensor(s.long_factor, dtype=torch.float32, device=inv_freq.device)
    beyond = (lengths > s.original_max_len)[:, None]
    return torch.where(beyond, inv_freq * ratio, inv_freq)


def _dynamic_ntk_at(inv_freq: Tensor, s: ScalingSettings, lengths: Tensor) -> Tensor:
    """:func:`dynamic_ntk_inverse_frequencies` with the settings' factor and training length."""
    return dynamic_ntk_inverse_frequencies(inv_freq, s.factor, s.original_max_len, lengths)


def checked_longrope_factors(
    scaling: str, dim: int, short_factor: object, long_factor: object
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """``(short_factor, long_factor)`` as tuples: for ``longrope`` both lists of ``dim / 2``
    positive numbers, for any other scaling both None.

    Raises:
        ValueError: either is missing, of another length or not positive under ``longrope``,
            or given to another scaling (one line).
    """
    factors = {"short_factor": short_factor, "long_factor": long_factor}
    if scaling != "longrope":
        given = [name for name, value in factors.items() if value is not None]
        if given:
            raise ValueError(
                f"rope: {given[0]} is LongRoPE's; set scaling=longrope or leave it null"
            )
        return None, None
    for name, value in factors.items():
        if (
            not isinstance(value, list | tuple)
            or len(value) != dim // 2
            or any(isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 for v in value)
        ):
            raise ValueError(
                f"rope: scaling=longrope needs {name} as {dim // 2} positive numbers (one per "
                f"rotated pair), got {value!r}"
            )
    return tuple(map(float, short_factor)), tuple(map(float, long_factor))  # type: ignore[arg-type]


#: the scalings whose frequencies follow the sequence length, by name: ``(inverse frequencies
#: (r/2,) of :data:`SCALINGS`, settings, lengths (S,)) -> inverse frequencies (S, r/2)``
AT_LENGTHS: dict[str, Callable[[Tensor, ScalingSettings, Tensor], Tensor]] = {
    "dynamic_ntk": _dynamic_ntk_at,
    "longrope": longrope_inverse_frequencies,
}
