"""Teacher-forced losses, shared by training, validation, evaluation and the benchmark: the
training loss of a batch, and the NLL of every sentence pair (validation averages it)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.data.batching import TokenBatcher, collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Seq2Seq


class SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy and summed NLL of ``logits (N, V)`` against ``gold
    (N,)``, rows where ``real (N,)`` is False left out; the gradient of the first only.

    Per row, with ``lse = logsumexp(logits)``: NLL ``= lse - logits[gold]`` and the smoothed loss
    ``= (1 - eps) NLL + eps (lse - mean(logits))`` (``F.cross_entropy(...,
    label_smoothing=eps)``'s definition). Its gradient ``softmax(logits) - ((1 - eps) onehot +
    eps / V)`` (zero on the rows left out) is written in one pass over the vocabulary, where
    autograd would chain the log-softmax's, the gather's and the mean's backward passes and keep
    the log-probabilities."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, gold: Tensor, real: Tensor, smoothing: float
    ) -> tuple[Tensor, Tensor]:
        lse = torch.logsumexp(logits, dim=-1)
        nll = lse - logits.gather(1, gold[:, None]).squeeze(1)
        loss = (1 - smoothing) * nll + smoothing * (lse - logits.mean(dim=-1)) if smoothing else nll
        ctx.save_for_backward(logits, lse, gold, real)
        ctx.smoothing = smoothing
        ctx.mark_non_differentiable(nll)
        return torch.where(real, loss, 0.0).sum(), torch.where(real, nll, 0.0).sum()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None, None]:
        logits, lse, gold, real = ctx.saved_tensors
        eps = ctx.smoothing
        grad = torch.exp(logits - lse[:, None])
        if eps:
            grad.sub_(eps / logits.shape[-1])
        grad.scatter_add_(1, gold[:, None], torch.full_like(lse[:, None], eps - 1))
        # a left-out row's gradient is zero whatever its logits: selected, not multiplied by 0
        # (a padding row whose logits are not finite would give NaN * 0 = NaN)
        return torch.where(real[:, None], grad.mul_(grad_loss), 0.0), None, None, None


def summed_losses(
    model: Seq2Seq, batch: tuple[torch.Tensor, ...], pad_id: int, smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and summed NLL of a batch ``(src (B, S), tgt_in (B, T),
    tgt_out (B, T))``, both from one pass over the logits (:class:`SmoothedCrossEntropy`;
    tested equal to ``F.cross_entropy``, values and gradients). Nothing is read back to the
    host, so ``torch.compile`` can take the model and the loss as one graph."""
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in).float()
    gold = tgt_out.reshape(-1)
    return SmoothedCrossEntropy.apply(
        logits.view(-1, logits.shape[-1]), gold.clamp(min=0), gold.ne(pad_id), smoothing
    )


@torch.no_grad()
def sentence_losses(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    targets: list[list[int]],
    batch_tokens: int,
    device: torch.device,
    amp: torch.dtype | None = None,
) -> tuple[list[float], list[int]]:
    """Summed teacher-forced NLL and target token count (EOS included) of every pair, in
    evaluation mode (the model's mode is restored); ``amp`` = autocast dtype or None."""
    was_training = model.training
    model.eval()
    batcher = TokenBatcher(
        [len(s) for s in sources], [len(t) for t in targets], batch_tokens, shuffle=False
    )
    nll = [0.0] * len(sources)
    count = [0] * len(sources)
    for indices in batcher.batches(0):
        src, tgt_in, tgt_out = (
            t.to(device)
            for t in collate(
                [sources[i] for i in indices],
                [targets[i] for i in indices],
                tokenizer.pad_id,
                tokenizer.bos_id,
                tokenizer.eos_id,
            )
        )
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            logits = model(src, tgt_in).float()
        token_nll = F.cross_entropy(
            logits.transpose(1, 2), tgt_out, ignore_index=tokenizer.pad_id, reduction="none"
        )
        rows_nll = token_nll.sum(1).tolist()
        rows_count = tgt_out.ne(tokenizer.pad_id).sum(1).tolist()
        for row, i in enumerate(indices):
            nll[i], count[i] = rows_nll[row], int(rows_count[row])
    model.train(was_training)
    return nll, count


def validation_loss(
    model: Seq2Seq,
    sources: list[list[int]],
    targets: list[list[int]],
    tokenizer: Tokenizer,
    max_tokens: int,
    device: torch.device,
    amp: torch.dtype | None,
) -> tuple[float, list[float], list[int]]:
    """Token-level mean NLL (no label smoothing) over the validation pairs, and each pair's
    summed NLL and target token count (:func:`sentence_losses`)."""
    nll, count = sentence_losses(model, tokenizer, sources, targets, max_tokens, device, amp)
    return sum(nll) / max(sum(count), 1), nll, count
