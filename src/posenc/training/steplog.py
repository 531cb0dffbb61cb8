"""What a training run reports every ``trainer.log_every`` steps. It goes to ``train.log``
(through :mod:`logging`, so the console's progress bar stays intact) and to TensorBoard: the mean
label-smoothed loss and NLL per target token over the steps since the last report (fairseq's
convention), the perplexity exp(NLL), the gradient norm before clipping, the learning rate and
the training speed."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StepWindow:
    """Sums over the optimizer steps since the last report."""

    loss: float = 0.0  # summed label-smoothed loss of every target token
    nll: float = 0.0  # summed NLL of every target token
    tokens: int = 0
    seconds: float = 0.0

    def add(self, loss_sum: float, nll_sum: float, tokens: int, seconds: float) -> None:
        """Count one optimizer step (sums over its target tokens)."""
        self.loss += loss_sum
        self.nll += nll_sum
        self.tokens += tokens
        self.seconds += seconds

    def report(self, lr: float, grad_norm: float | None) -> dict[str, float]:
        """The TensorBoard scalars of the window (``train/...``)."""
        tokens = max(self.tokens, 1)
        nll = self.nll / tokens
        values = {
            "train/loss": self.loss / tokens,
            "train/nll": nll,
            "train/ppl": math.exp(min(nll, 100.0)),
            "train/lr": lr,
            "train/tokens_per_s": self.tokens / max(self.seconds, 1e-9),
        }
        if grad_norm is not None:
            values["train/grad_norm"] = grad_norm
        return values


def log_line(step: int, max_steps: int | None, values: dict[str, float]) -> str:
    """``step 120/2000 | loss 5.123 | nll 4.987 | ppl 146.5 | gnorm 0.81 | lr 3.00e-03 |
    5,123 tok/s`` from :meth:`StepWindow.report`'s values."""
    parts = [f"step {step}" + (f"/{max_steps}" if max_steps else "")]
    parts += [f"loss {values['train/loss']:.4f}", f"nll {values['train/nll']:.4f}"]
    parts.append(f"ppl {values['train/ppl']:.1f}")
    if "train/grad_norm" in values:
        parts.append(f"gnorm {values['train/grad_norm']:.3f}")
    parts += [f"lr {values['train/lr']:.2e}", f"{values['train/tokens_per_s']:,.0f} tok/s"]
    return " | ".join(parts)
