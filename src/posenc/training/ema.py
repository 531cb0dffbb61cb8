"""An exponential moving average (EMA) of the weights, kept beside the model in training.

As fairseq's ``--store-ema`` and Marian's ``--exponential-smoothing`` keep it: with
``trainer.ema_decay=d`` every optimizer step is followed by
``ema = d * ema + (1 - d) * weights`` over every floating-point parameter and buffer of the model
(one fused ``torch._foreach_lerp_``, ``ema + (1 - d) * (weights - ema)``, in the weights' own
float32, also under bf16 autocast). The EMA starts as a copy of the weights training starts
from; until step ``trainer.ema_start`` it copies them after every step, then it averages
(fairseq's ``--ema-start-update``). Rank 0 alone keeps it.

Every checkpoint holds it as ``ema``, a state dict of the run's model (it loads into a model
built from the run's config as it is), and a resume restores it, so a resumed run ends with the
EMA weights of a run that was never interrupted, bit for bit. Validation chooses ``best.pt`` on
the raw weights, as without an EMA (so ``best.pt`` holds the EMA of that step); the EMA's
validation loss is only logged beside it, as ``valid/loss_ema``. Evaluation scores the EMA with
``eval.weights=ema``.
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import Tensor, nn

from posenc.config import TrainerConfig
from posenc.training.start import Start, does_not_fit

log = logging.getLogger("posenc.training")


class WeightEMA:
    """The EMA of ``model``'s weights, as a model of its own (:attr:`module`, in eval mode).

    Args:
        model: the trained model; its parameters and buffers are read, never written.
        decay: ``d`` in ``ema = d * ema + (1 - d) * weights``, in (0, 1).
        start: the EMA copies the weights after each step up to this one, then averages.
    """

    def __init__(self, model: nn.Module, decay: float, start: int = 0) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"trainer.ema_decay={decay!r} must be a number in (0, 1)")
        self.decay, self.start = float(decay), start
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self._averaged: list[Tensor] = []
        self._tracked: list[Tensor] = []
        own = self.module.state_dict(keep_vars=True)
        seen: set[int] = set()
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.is_floating_point() and id(tensor) not in seen:  # a tied weight once
                seen.add(id(tensor))
                self._averaged.append(own[name].detach())
                self._tracked.append(tensor.detach())

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the weights after optimizer step ``step`` (1-based): a copy up to
        :attr:`start`, the decayed average after it."""
        if step <= self.start:
            torch._foreach_copy_(self._averaged, self._tracked)
        else:
            torch._foreach_lerp_(self._averaged, self._tracked, 1.0 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        """The EMA weights as a state dict of the model (what checkpoints hold as ``ema``)."""
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Go on from the EMA weights ``state`` (a checkpoint's ``ema``)."""
        self.module.load_state_dict(state)


def start_ema(trainer: TrainerConfig, model: nn.Module, start: Start) -> WeightEMA | None:
    """The run's EMA (None when ``trainer.ema_decay`` is null), built once ``model`` holds the
    weights training starts from: restored from the checkpoint a run resumes; from the weights
    themselves for a run from scratch, a fine-tune, or a checkpoint saved without an EMA."""
    if trainer.ema_decay is None:
        return None
    ema = WeightEMA(model, trainer.ema_decay, trainer.ema_start or 0)
    if start.payload is None or start.fine_tune:
        return ema
    saved = start.payload.get("ema")
    if saved is None:
        log.info("%s holds no EMA weights: the EMA starts from its weights", start.path)
        return ema
    try:
        ema.load_state_dict(saved)
    except (RuntimeError, TypeError, AttributeError) as err:
        raise does_not_fit(start.path, err) from err
    return ema
