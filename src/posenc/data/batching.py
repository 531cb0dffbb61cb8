"""Token-bucketed batches of example indices and their padding into tensors.

:class:`TokenBatcher` groups example indices into batches under a token budget; :func:`collate`
pads one batch into tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from posenc.data.corpus import DataError

log = logging.getLogger("posenc.data")


class TokenBatcher:
    """Batches of example indices, bucketed by length under a token budget.

    Each epoch: sort the examples by (source length, target length), breaking ties at random;
    cut the sorted run into consecutive batches whose padded size
    ``count * max(max_src + 1, max_tgt + 2) <= max_tokens`` (``+1``: the EOS that
    :func:`collate` appends to the source; ``+2``: BOS and EOS of the target, a safe bound on
    ``tgt_in``/``tgt_out``); then shuffle the batch order. Lengths are token counts without
    special tokens. An example that alone exceeds the budget gets a batch of its own (with a
    warning at construction).

    Everything random comes from ``numpy.random.default_rng([seed, epoch])``, so
    ``batches(epoch)`` is the same list every time it is called with the same ``(seed, epoch)``:
    training resumes mid-epoch by recomputing it and skipping the batches already done. The
    cut points depend only on the sorted lengths, so every epoch has the same number of
    batches. With ``shuffle=False`` ties keep index order and batches stay sorted by length
    (for evaluation).

    For distributed training, rank ``rank`` of ``world_size`` gets batches
    ``rank::world_size`` of the epoch, after truncating the epoch to a multiple of
    ``world_size`` so every rank has the same number of batches.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise DataError(
                f"TokenBatcher got {len(src_lengths)} source and {len(tgt_lengths)} target "
                "lengths; pass one of each per example"
            )
        if not len(src_lengths):
            raise DataError("TokenBatcher got no examples; check that the split is not empty")
        if max_tokens < 1 or seed < 0 or not 0 <= rank < world_size:
            raise DataError(
                f"TokenBatcher needs max_tokens >= 1, seed >= 0 and 0 <= rank < world_size; got "
                f"max_tokens={max_tokens}, seed={seed}, rank={rank}, world_size={world_size}"
            )
        self.src = np.asarray(src_lengths, dtype=np.int64)
        self.tgt = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens = int(max_tokens)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self._cuts = self._cut_points(np.lexsort((self.tgt, self.src)))
        oversized = int((np.maximum(self.src + 1, self.tgt + 2) > self.max_tokens).sum())
        if oversized:
            log.warning(
                "%d examples alone exceed max_tokens=%d; each gets a batch of its own",
                oversized,
                self.max_tokens,
            )
        self._per_rank = len(self._cuts) // self.world_size
        if self._per_rank == 0:
            raise DataError(
                f"{len(self._cuts)} batches cannot be shared by {world_size} ranks; lower "
                "max_tokens or world_size"
            )

    def _cut_points(self, order: np.ndarray) -> list[tuple[int, int]]:
        """``[start, end)`` slices of the sorted order, one per batch."""
        src = (self.src[order] + 1).tolist()
        tgt = (self.tgt[order] + 2).tolist()
        cuts, start, longest = [], 0, 0
        for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
            grown = max(longest, s, t)
            if i > start and grown * (i - start + 1) > self.max_tokens:
                cuts.append((start, i))
                start, grown = i, max(s, t)
            longest = grown
        cuts.append((start, len(src)))
        return cuts

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of epoch ``epoch`` (lists of example indices), in training order."""
        if self.shuffle:
            rng = np.random.default_rng([self.seed, int(epoch)])
            order = np.lexsort((rng.random(len(self.src)), self.tgt, self.src))
        else:
            order = np.lexsort((self.tgt, self.src))
        batches = [order[a:b].tolist() for a, b in self._cuts]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        batches = batches[: self._per_rank * self.world_size]
        return batches[self.rank :: self.world_size]

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._per_rank


def collate(
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pad one batch of id lists into long tensors.

    Returns ``src`` ``(B, Ls)`` = ids + EOS, ``tgt_in`` ``(B, Lt)`` = BOS + ids and ``tgt_out``
    ``(B, Lt)`` = ids + EOS, each right-padded with ``pad_id``; ``Ls``/``Lt`` are the longest
    source/target length + 1.
    """
    if len(src_ids) != len(tgt_ids) or not len(src_ids):
        raise DataError(
            f"collate got {len(src_ids)} sources and {len(tgt_ids)} targets; pass the same "
            "non-zero number of each"
        )
    batch = len(src_ids)
    src = torch.full((batch, max(map(len, src_ids)) + 1), pad_id, dtype=torch.long)
    tgt_len = max(map(len, tgt_ids)) + 1
    tgt_in = torch.full((batch, tgt_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((batch, tgt_len), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        src[row, : len(s) + 1] = torch.tensor([*s, eos_id])
        tgt_in[row, : len(t) + 1] = torch.tensor([bos_id, *t])
        tgt_out[row, : len(t) + 1] = torch.tensor([*t, eos_id])
    return src, tgt_in, tgt_out
