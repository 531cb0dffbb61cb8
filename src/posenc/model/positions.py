"""Position augmentation in training (``pe.augment``): the positions a stack's encoding reads
are changed at random during training only; evaluation and decoding read the true positions.

* ``shift`` — SHAPE (Kiyono et al. 2021): positions ``0 .. L-1`` shifted by an offset
  ``k ~ U{0, .., K}``, ``K = pe.augment_range``.
* ``random`` — randomized positions (Ruoss et al. 2023): an ordered random subset of ``L``
  distinct positions of ``0 .. R-1``, ``R = pe.augment_range`` (``L`` when a batch is longer).
* ``scale`` — CAPE's global scaling (Likhomanenko et al. 2021): positions ``0 .. L-1`` times
  ``s``, ``log s ~ U(-log lam, log lam)``, ``lam = pe.augment_range``; real-valued positions.

One draw per stack and batch (encoder and decoder draw independently): every encoding here
reads one position vector ``(L,)`` per call, shared by the batch's sentences, where the papers
draw per sentence. Each encoding declares the modes that change what it computes
(:attr:`~posenc.model.encodings.base.StackEncoding.augment_modes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

AUGMENT_MODES = ("shift", "random", "scale")
RANGE_MEANING = {
    "shift": "the largest shift K (SHAPE; an integer >= 1, e.g. 100)",
    "random": "the number of positions drawn from (an integer >= 2, e.g. 1024)",
    "scale": "the largest scale factor lam (a number > 1, e.g. 1.5)",
}


@dataclass(frozen=True)
class PositionAugmentation:
    """One ``pe.augment`` setting: ``mode`` (one of :data:`AUGMENT_MODES`) and its range."""

    mode: str
    range: float

    @classmethod
    def of(cls, mode: Any, range_: Any) -> PositionAugmentation | None:
        """The augmentation ``pe.augment=mode pe.augment_range=range_`` asks for (None for
        ``mode`` null).

        Raises:
            ValueError: an unknown mode, a missing or bad range, or a range without a mode
                (one line naming the setting and the fix).
        """
        if mode is None:
            if range_ is not None:
                raise ValueError(
                    f"pe.augment_range={range_} without pe.augment: set pe.augment to one of "
                    f"{', '.join(AUGMENT_MODES)}, or leave pe.augment_range null"
                )
            return None
        if mode not in AUGMENT_MODES:
            raise ValueError(
                f"pe.augment={mode!r} is unknown; use one of {', '.join(AUGMENT_MODES)} or null"
            )
        integral = mode != "scale"
        low = {"shift": 1, "random": 2}.get(mode, 1)
        bad = (
            isinstance(range_, bool)
            or not isinstance(range_, int | float)
            or (integral and not float(range_).is_integer())
            or (range_ < low if integral else range_ <= low)
        )
        if bad:
            raise ValueError(
                f"pe.augment={mode} needs pe.augment_range = {RANGE_MEANING[mode]}; got {range_!r}"
            )
        return cls(mode, float(range_))

    def __call__(self, length: int, device: torch.device | str = "cpu") -> Tensor:
        """Training positions ``(length,)``: long for ``shift`` and ``random``, float32 for
        ``scale``; drawn from torch's default generator."""
        if self.mode == "shift":
            offset = int(torch.randint(0, int(self.range) + 1, ()))
            return torch.arange(offset, offset + length, device=device)
        if self.mode == "random":
            drawn = torch.randperm(max(int(self.range), length))[:length]
            return drawn.sort().values.to(device)
        log_lam = math.log(self.range)
        scale = math.exp(float(torch.empty(()).uniform_(-log_lam, log_lam)))
        return torch.arange(length, device=device, dtype=torch.float32) * scale
