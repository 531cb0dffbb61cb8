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
        # as given when already integer arrays (a prepared corpus's int32 lengths: no copy)
        self.src, self.tgt = _lengths(src_lengths), _lengths(tgt_lengths)
        self.max_tokens = int(max_tokens)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self._cuts = cut_points(
            self.src, self.tgt, length_order(self.src, self.tgt), self.max_tokens
        )
        warn_oversized(oversized(self.src, self.tgt, self.max_tokens), self.max_tokens)
        self._per_rank = per_rank(len(self._cuts[0]), self.world_size)

    def batches(self, epoch: int) -> EpochBatches:
        """This rank's batches of epoch ``epoch`` (each a list of example indices), in training
        order."""
        starts, ends = self._cuts
        if self.shuffle:
            rng = np.random.default_rng([self.seed, int(epoch)])
            order = length_order(self.src, self.tgt, rng.random(len(self.src)))
            batch_order = rng.permutation(len(starts))
        else:
            order = length_order(self.src, self.tgt)
            batch_order = np.arange(len(starts))
        chosen = batch_order[: self._per_rank * self.world_size][self.rank :: self.world_size]
        return EpochBatches(order, starts[chosen], ends[chosen])

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._per_rank


class EpochBatches(Sequence[list[int]]):
    """One epoch's batches as a sequence of index lists, made one at a time from the epoch's
    sorted ``order`` and each batch's ``[start, end)`` in it (no Python object per example:
    memory stays flat however large the corpus). Slices are batches too; it equals a list of
    the same index lists."""

    def __init__(self, order: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self._order, self._starts, self._ends = order, starts, ends

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return EpochBatches(self._order, self._starts[k], self._ends[k])
        return self._order[self._starts[k] : self._ends[k]].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  (mutable-sequence semantics: equal to lists)


def padded_lengths(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """What each example takes in a batch's padded length: its source + EOS or its target +
    BOS and EOS (:func:`collate`), whichever is longer."""
    return np.maximum(src + 1, tgt + 2)


def oversized(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> int:
    """How many examples alone exceed the budget (each gets a batch of its own)."""
    return int((padded_lengths(src, tgt) > max_tokens).sum())


def warn_oversized(count: int, max_tokens: int) -> None:
    """Say that ``count`` examples (if any) alone exceed ``max_tokens``."""
    if count:
        log.warning(
            "%d examples alone exceed max_tokens=%d; each gets a batch of its own",
            count,
            max_tokens,
        )


def per_rank(batches: int, world_size: int) -> int:
    """Batches per rank when ``world_size`` ranks share ``batches`` (the rest left out).

    Raises:
        DataError: too few batches for one each.
    """
    if batches < world_size:
        raise DataError(
            f"{batches} batches cannot be shared by {world_size} ranks; lower max_tokens or "
            "world_size"
        )
    return batches // world_size


def cut_points(
    src: np.ndarray, tgt: np.ndarray, order: np.ndarray, max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """``[start, end)`` slices of ``order`` (example indices sorted by length), one per batch
    (``starts``, ``ends``, int64): from each start, greedily the longest run whose padded size
    ``count * max(src + 1, tgt + 2)`` fits ``max_tokens`` (the first example always goes in,
    alone if it must).

    Computed over runs of equal padded length rather than examples: a run either joins the
    open batch whole, or fills it and then makes full batches of its own; so the work grows
    with the runs and batches, not the examples, and no per-example Python objects are made.
    """
    need = padded_lengths(src[order], tgt[order])
    if not len(need):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    run_starts = np.concatenate(([0], np.flatnonzero(need[1:] != need[:-1]) + 1))
    run_lengths = np.diff(np.append(run_starts, len(need)))
    ends: list[int] = []
    position = count = longest = 0  # the open batch is [position - count, position)
    for value, length in zip(need[run_starts].tolist(), run_lengths.tolist(), strict=True):
        if count:
            room = max_tokens // max(longest, value) - count
            if room >= length:  # the whole run joins the open batch
                count, longest, position = count + length, max(longest, value), position + length
                continue
            taken = max(room, 0)
            position, length = position + taken, length - taken
            ends.append(position)  # the open batch is full
        size = max(1, max_tokens // value)
        full = length // size
        ends.extend(range(position + size, position + full * size + 1, size))
        position += full * size
        count, longest = length - full * size, value
        position += count
    if count:
        ends.append(position)
    stops = np.array(ends, dtype=np.int64)
    return np.concatenate(([0], stops[:-1])).astype(np.int64), stops


def length_order(
    src: np.ndarray, tgt: np.ndarray, tiebreak: np.ndarray | None = None
) -> np.ndarray:
    """Example indices sorted by source length, then target length, then ``tiebreak`` (then
    index): ``np.lexsort((tiebreak, tgt, src))``, computed as stable sorts, the one by length
    pair a radix sort when the pair fits 16 bits (twice as fast on millions of examples)."""
    if not len(src):
        return np.zeros(0, dtype=np.int64)
    key = src.astype(np.int64) * (int(tgt.max()) + 1) + tgt
    key = key.astype(np.int16) if int(key.max()) < 2**15 else key
    if tiebreak is None:
        return np.argsort(key, kind="stable")
    first = np.argsort(tiebreak, kind="stable")
    return first[np.argsort(key[first], kind="stable")]


def _lengths(values: Sequence[int]) -> np.ndarray:
    """``values`` as an integer array, not copied when it is one already."""
    array = np.asarray(values)
    return array if np.issubdtype(array.dtype, np.integer) else array.astype(np.int64)


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
