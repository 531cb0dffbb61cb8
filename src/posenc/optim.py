"""AdamW and learning-rate schedules (warmup then inverse square root, cosine, linear, constant)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

SCHEDULES = ("inverse_sqrt", "cosine", "linear", "constant")


def make_optimizer(model: nn.Module, lr: float, betas, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; no weight decay on biases, norms, embeddings and position tables (1-D or tables)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.dim() >= 2 and "embed" not in name and "encoding" not in name
        (decay if is_matrix else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))


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
