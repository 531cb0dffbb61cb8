"""AdamW with one weight-decay rule for every encoding, and learning-rate schedules. The
schedules: warmup then inverse square root, cosine, linear, constant.

The weight-decay rule: only the matrices that a module declares through ``decayed_parameters()``
are decayed. posenc's attention declares its q/k/v/output projections and its feed-forward
block its two matrices; nothing else declares any, so embeddings (and the tied output layer),
norms, biases and every parameter an encoding owns (position tables, gates, slopes, kernels)
are not decayed. The rule follows the code that owns a parameter, never its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

SCHEDULES = ("inverse_sqrt", "cosine", "linear", "constant")


def decayed_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters that the modules of ``model`` declare for weight decay (each once)."""
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        declare = getattr(module, "decayed_parameters", None)
        if callable(declare):
            for param in declare():
                found[id(param)] = param
    return list(found.values())


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: the declared matrices with ``weight_decay``, every other trainable
    parameter with 0."""
    decayed = {id(p) for p in decayed_parameters(model)}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in trainable if id(p) in decayed], "weight_decay": weight_decay},
        {"params": [p for p in trainable if id(p) not in decayed], "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, lr: float, betas, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups`, with torch's fused kernel when every parameter is on
    the CPU or CUDA (one pass over all parameters instead of several per tensor)."""
    fusable = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(
        parameter_groups(model, weight_decay), lr=lr, betas=tuple(betas), fused=fusable or None
    )


def lr_factor(
    schedule: str, warmup: int, total: int, min_ratio: float = 0.0
) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    * ``inverse_sqrt`` (fairseq): linear warmup to 1 over ``warmup`` steps, then
      ``sqrt(warmup/step)``;
    * ``cosine``: warmup, then cosine decay to ``min_ratio`` at ``total``;
    * ``linear``: warmup, then linear decay to ``min_ratio`` at ``total``;
    * ``constant``: warmup, then 1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"trainer.schedule={schedule!r} is unknown; use one of {list(SCHEDULES)}")
    warmup = max(warmup, 0)

    def factor(step: int) -> float:
        step += 1
        if step <= warmup:
            return step / warmup
        if schedule == "inverse_sqrt":
            return math.sqrt(max(warmup, 1) / step)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
        return min_ratio + (1 - min_ratio) * shape

    return factor
