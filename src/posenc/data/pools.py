"""Training batches of a prepared corpus, made pool by pool so that memory does not grow with it.

Marian's maxi-batches and OpenNMT-py's batching pools do the same."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posenc.data.batching import cut_points, length_order, oversized, per_rank, warn_oversized
from posenc.data.corpus import DataError
from posenc.data.store import TokenStore

#: pairs sorted and batched together when ``trainer.batch_pool`` is null
DEFAULT_POOL = 1_000_000


class PooledBatcher:
    """Token-bucketed training batches of a prepared corpus, made one pool at a time.

    The store's rows, in the order preparation shuffled them, are cut into consecutive pools of
    ``pool`` rows. Each pool's rows within the length limits are batched as
    :class:`~posenc.data.batching.TokenBatcher` batches a whole corpus: sorted by (source
    length, target length) with ties broken at random, cut greedily into batches of at most
    ``max_tokens`` padded tokens, the batch order shuffled. An epoch takes the pools in a random
    order and hands out all of a pool's batches before the next pool's. A corpus of at most
    ``pool`` rows is one pool, and its batches equal ``TokenBatcher``'s on the rows within the
    limits, bit for bit.

    Randomness: with one pool everything comes from ``default_rng([seed, epoch])`` as in
    ``TokenBatcher``; with several, the pool order from that generator and pool ``p``'s ties
    and batch order from ``default_rng([seed, epoch, p])``. So ``batches(epoch)`` is the same
    every time, and training resumes mid-epoch by recomputing it and skipping what was done.

    Memory: the cut points of every pool (two int64 per batch) and one pool's arrays at a time;
    lengths are read from the offsets files, not through the memory map. Under torchrun, rank
    ``rank`` of ``world_size`` gets batches ``rank::world_size`` of the epoch's sequence, cut to
    a multiple of ``world_size``.

    Indices in the batches are store rows.
    """

    def __init__(
        self,
        store: TokenStore,
        max_tokens: int,
        max_positions: int | None = None,
        max_source_tokens: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        pool: int | None = None,
    ) -> None:
        pool = int(pool or DEFAULT_POOL)
        if max_tokens < 1 or seed < 0 or pool < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"PooledBatcher needs max_tokens >= 1, seed >= 0, pool >= 1 and 0 <= rank < "
                f"world_size; got max_tokens={max_tokens}, seed={seed}, pool={pool}, "
                f"rank={rank}, world_size={world_size}"
            )
        self.store, self.max_tokens, self.seed = store, int(max_tokens), int(seed)
        self.limits = (max_positions, max_source_tokens)
        self.rank, self.world_size = int(rank), int(world_size)
        self.bounds = [(a, min(a + pool, len(store))) for a in range(0, len(store), pool)]
        self._cuts: list[tuple[np.ndarray, np.ndarray]] = []
        self.pairs = over = 0
        for start, stop in self.bounds:
            _, src, tgt = store.within(*self.limits, start, stop)
            self._cuts.append(cut_points(src, tgt, length_order(src, tgt), self.max_tokens))
            self.pairs += len(src)
            over += oversized(src, tgt, self.max_tokens)
        if not self.pairs:
            raise DataError(
                "no training pairs within the length limits; raise trainer.max_positions or "
                "trainer.max_source_tokens"
            )
        warn_oversized(over, self.max_tokens)
        self._per_rank = per_rank(int(self.batch_counts().sum()), self.world_size)

    @property
    def dropped(self) -> int:
        """Pairs of the store left out by the length limits."""
        return len(self.store) - self.pairs

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._per_rank

    def batches(self, epoch: int) -> PooledEpoch:
        """This rank's batches of epoch ``epoch`` (each a list of store rows), in training
        order."""
        return PooledEpoch(self, int(epoch))

    def pool_batches(self, epoch: int, pool: int) -> list[np.ndarray]:
        """Pool ``pool``'s batches in epoch ``epoch``, in its shuffled order (store rows)."""
        start, stop = self.bounds[pool]
        rows, src, tgt = self.store.within(*self.limits, start, stop)
        rng = self._generator(epoch, pool)
        order = rows[length_order(src, tgt, rng.random(len(rows)))]
        starts, ends = self._cuts[pool]
        return [order[starts[k] : ends[k]] for k in rng.permutation(len(starts))]

    def pool_order(self, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` takes the pools."""
        if len(self.bounds) == 1:
            return np.zeros(1, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.bounds))

    def batch_counts(self) -> np.ndarray:
        """Batches of each pool (every epoch: the cuts depend only on the sorted lengths)."""
        return np.array([len(starts) for starts, _ in self._cuts], dtype=np.int64)

    def _generator(self, epoch: int, pool: int) -> np.random.Generator:
        key = [self.seed, epoch] if len(self.bounds) == 1 else [self.seed, epoch, pool]
        return np.random.default_rng(key)


class PooledEpoch(Sequence[list[int]]):
    """One rank's batches of one epoch of a :class:`PooledBatcher`, each made when asked for
    (the pool it belongs to is sorted then, and kept until a batch of another pool is asked
    for). Slices are lists of batches; it equals a list of the same index lists."""

    def __init__(self, batcher: PooledBatcher, epoch: int) -> None:
        self._batcher, self._epoch = batcher, epoch
        self._pools = batcher.pool_order(epoch)
        self._ends = np.cumsum(batcher.batch_counts()[self._pools])
        self._cached: tuple[int, list[np.ndarray]] | None = None

    def __len__(self) -> int:
        return len(self._batcher)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} of {len(self)}")
        k %= len(self)
        place = self._batcher.rank + k * self._batcher.world_size  # in the epoch's sequence
        slot = int(np.searchsorted(self._ends, place, side="right"))
        pool = int(self._pools[slot])
        if self._cached is None or self._cached[0] != pool:
            self._cached = (pool, self._batcher.pool_batches(self._epoch, pool))
        first = int(self._ends[slot - 1]) if slot else 0
        return self._cached[1][place - first].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  (mutable-sequence semantics: equal to lists)
