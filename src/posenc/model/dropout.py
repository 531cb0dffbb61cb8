"""Dropout with a cheaper random mask than ``torch.nn.Dropout``'s on a CPU.

On a CPU, ``nn.Dropout`` draws one Bernoulli sample per element from torch's sequential
Mersenne-Twister generator (``bernoulli_``), a sizeable share of a small model's training step.
Here one 64-bit draw (``random_`` over the full int64 range: every bit uniform) gives the keep
decision of four elements, each a 16-bit uniform integer compared with a
threshold, so ``p`` is applied as ``round(p * 65536) / 65536`` (0.1 becomes 0.100006) and the
kept elements are scaled by the inverse of the exact keep probability: the output's expectation
is the input, as with ``nn.Dropout``. The mask is kept as booleans for the backward pass. On
other devices (CUDA's fused Philox dropout is already fast) it is ``nn.functional.dropout``.
Seeded by torch's default generator like ``nn.Dropout``, so runs stay reproducible.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

LEVELS = 1 << 16


class _KeepAndScale(torch.autograd.Function):
    """``x`` where ``keep``, else 0, times ``scale``; the boolean ``keep`` is saved for the
    backward pass (``torch.where`` then an in-place scale: multiplying by a boolean tensor
    goes through a slow type promotion)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad, 0.0).mul_(ctx.scale), None, None


def keep_mask(shape: torch.Size, p: float) -> tuple[Tensor, float]:
    """A boolean keep mask of ``shape`` (each element kept with probability
    ``1 - round(p * 65536) / 65536``) and the scale ``1 / keep probability``."""
    dropped = round(p * LEVELS)
    numel = shape.numel()
    words = torch.empty((numel + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    uniform16 = words.view(torch.int16)[:numel].view(shape)
    return uniform16 >= dropped - LEVELS // 2, LEVELS / (LEVELS - dropped)


class Dropout(nn.Module):
    """``nn.Dropout`` with a cheaper mask on CPU tensors (see the module docstring)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability {p} must be in [0, 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """``x`` of any shape, elements zeroed with probability ``p`` in training."""
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return nn.functional.dropout(x, self.p, training=True)
        keep, scale = keep_mask(x.shape, self.p)
        return _KeepAndScale.apply(x, keep, scale)

    def extra_repr(self) -> str:
        return f"p={self.p}"
