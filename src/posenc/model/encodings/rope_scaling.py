"""RoPE's context-extension scalings.

One entry each in :data:`SCALINGS`, keyed by ``pe.scaling`` (as transformers'
``ROPE_INIT_FUNCTIONS``): its frequencies function, the class of its own parameters (read from
the ``pe`` keys of that name, as transformers' init functions read ``rope_parameters``) and,
for the scalings whose frequencies follow the sequence length (dynamic NTK, LongRoPE), the
frequencies at given lengths. :func:`scaling_settings` reads and checks them;
:mod:`~posenc.model.encodings.rotary` applies them. Adding a scaling with parameters is its
function, its parameters' class and their keys in ``configs/pe/rope.yaml``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

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
    """What every scaling reads: ``dim`` rotated dims, RoPE's ``base``, the extension
    ``factor`` and the training length ``original_max_len``; ``own``: the scaling's own
    parameters (an instance of its entry's class in :data:`SCALINGS`, or None)."""

    dim: int
    base: float = 10000.0
    factor: float = 1.0
    original_max_len: int = 256
    own: Any = None


@dataclass(frozen=True)
class Llama3Bands:
    """Llama 3's band limits: wavelengths beyond ``original_max_len / low_freq_factor`` are
    interpolated, those below ``original_max_len / high_freq_factor`` kept (Llama 3.1's 1 and
    4)."""

    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def check(self, dim: int) -> None:
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "rope: scaling=llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )


@dataclass(frozen=True)
class YarnTemperature:
    """YaRN's temperature as DeepSeek-V2 sets it (:func:`yarn_attention_factor`; None: the
    paper's ``0.1 ln(factor) + 1``)."""

    mscale: float | None = None
    mscale_all_dim: float | None = None

    def check(self, dim: int) -> None:
        """Nothing to check: any pair of numbers is a temperature."""


@dataclass(frozen=True)
class LongRopeFactors:
    """LongRoPE's per-pair divisors of the frequencies up to (``short_factor``) and beyond
    (``long_factor``) ``original_max_len``: ``dim / 2`` positive numbers each, required."""

    short_factor: Any = None
    long_factor: Any = None

    def check(self, dim: int) -> None:
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if (
                not isinstance(value, list | tuple)
                or len(value) != dim // 2
                or any(
                    isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 for v in value
                )
            ):
                raise ValueError(
                    f"rope: scaling=longrope needs {name} as {dim // 2} positive numbers (one "
                    f"per rotated pair), got {value!r}"
                )


Frequencies = Callable[[ScalingSettings], tuple[Tensor, float]]
"""``settings -> (inverse frequencies (dim/2,), attention factor)``: one context-extension
scaling of RoPE."""
AtLengths = Callable[[Tensor, ScalingSettings, Tensor], Tensor]
"""``(inverse frequencies (r/2,) of the scaling, settings, lengths (S,)) -> inverse frequencies
(S, r/2)``: a scaling whose frequencies follow the sequence length."""


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
    return inv_freq, yarn_attention_factor(s.factor, s.own.mscale, s.own.mscale_all_dim)


def _llama3(s: ScalingSettings) -> tuple[Tensor, float]:
    """Llama 3.1's banded interpolation: a pair whose wavelength ``2 pi / theta`` is shorter than
    ``original_max_len / high_freq_factor`` keeps its frequency, one longer than
    ``original_max_len / low_freq_factor`` is divided by ``factor``, and between the two the
    frequency blends both, ``(1 - a) theta / factor + a theta`` with ``a = (original_max_len /
    wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``."""
    inv_freq = rope_frequencies(s.dim, s.base)
    wavelength = 2 * math.pi / inv_freq
    bands = s.own
    blend = (s.original_max_len / wavelength - bands.low_freq_factor) / (
        bands.high_freq_factor - bands.low_freq_factor
    )
    blended = (1 - blend) * inv_freq / s.factor + blend * inv_freq
    long_waves = wavelength > s.original_max_len / bands.low_freq_factor
    short_waves = wavelength < s.original_max_len / bands.high_freq_factor
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
    short = torch.tensor(s.own.short_factor, dtype=torch.float32)
    return rope_frequencies(s.dim, s.base) / short, _longrope_attention_factor(s)


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
        s.own.short_factor, dtype=torch.float32, device=inv_freq.device
    ) / torch.tensor(s.own.long_factor, dtype=torch.float32, device=inv_freq.device)
    beyond = (lengths > s.original_max_len)[:, None]
    return torch.where(beyond, inv_freq * ratio, inv_freq)


def _dynamic_ntk_at(inv_freq: Tensor, s: ScalingSettings, lengths: Tensor) -> Tensor:
    """:func:`dynamic_ntk_inverse_frequencies` with the settings' factor and training length."""
    return dynamic_ntk_inverse_frequencies(inv_freq, s.factor, s.original_max_len, lengths)


@dataclass(frozen=True)
class Scaling:
    """One context-extension scaling: its frequencies, the class of its own parameters (None:
    it has none), its frequencies at given lengths when they follow the sequence length, and
    what it needs: ``min_dim`` rotated dims, a training length ``original_max_len > 0``."""

    frequencies: Frequencies
    parameters: type | None = None
    at_lengths: AtLengths | None = None
    min_dim: int = 0
    uses_training_length: bool = False
    label: str = ""


#: every scaling by its ``pe.scaling`` name
SCALINGS: dict[str, Scaling] = {
    "none": Scaling(_unscaled),
    "linear": Scaling(_linear),
    "ntk": Scaling(_ntk, min_dim=4),
    "yarn": Scaling(_yarn, YarnTemperature, uses_training_length=True, label="YaRN"),
    "dynamic_ntk": Scaling(
        _unscaled, at_lengths=_dynamic_ntk_at, min_dim=4, uses_training_length=True
    ),
    "llama3": Scaling(_llama3, Llama3Bands, uses_training_length=True, label="Llama 3"),
    "longrope": Scaling(
        _longrope, LongRopeFactors, at_lengths=longrope_inverse_frequencies, label="LongRoPE"
    ),
}


def scaling_settings(
    scaling: str,
    dim: int,
    base: float,
    factor: float,
    original_max_len: int,
    parameters: Mapping[str, Any],
) -> ScalingSettings:
    """The settings of ``scaling`` for ``dim`` rotated dims: ``parameters`` are the ``pe`` keys
    of every scaling's own parameters (null: not given, the class's default).

    Raises:
        ValueError: an unknown scaling or key, a key of another scaling given, or settings the
            scaling cannot use (one line naming the key and the fix).
    """
    entry = SCALINGS.get(scaling)
    if entry is None:
        raise ValueError(f"rope: scaling={scaling!r} is unknown; use one of {', '.join(SCALINGS)}")
    owners = {
        f.name: (name, other)
        for name, other in SCALINGS.items()
        if other.parameters is not None
        for f in fields(other.parameters)
    }
    for key, value in parameters.items():
        if key not in owners:
            raise ValueError(f"rope: {key} is no setting of rope; see configs/pe/rope.yaml")
        owner, other = owners[key]
        if value is not None and owner != scaling:
            raise ValueError(
                f"rope: {key} is {other.label}'s; set scaling={owner} or leave it null"
            )
    if scaling != "none" and factor < 1.0:
        raise ValueError(f"rope: scaling={scaling} needs factor >= 1, got factor={factor}")
    if dim < entry.min_dim:
        raise ValueError(f"rope: scaling={scaling} needs more than 2 rotated dims per head")
    if entry.uses_training_length and original_max_len <= 0:
        raise ValueError(f"rope: scaling={scaling} needs original_max_len > 0 ({original_max_len})")
    own = None
    if entry.parameters is not None:
        names = {f.name for f in fields(entry.parameters)}
        own = entry.parameters(
            **{k: v for k, v in parameters.items() if k in names and v is not None}
        )
        own.check(dim)
    return ScalingSettings(dim, base, factor, original_max_len, own)
