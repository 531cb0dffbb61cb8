"""Training batches of a prepared corpus, pool by pool: a corpus that fits one pool is batched
exactly as the whole-corpus batcher batches it; a larger one is batched within consecutive pools
of its rows, every pair within the length limits once an epoch, under the token budget, the
same every time for a seed and an epoch, and shared by torchrun ranks without overlap."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posenc.data.batching import TokenBatcher
from posenc.data.corpus import DataError
from posenc.data.pools import PooledBatcher
from posenc.data.store import StoreWriter, flatten, open_store


class SavesNothing:
    """Stands in for the tokenizer a store keeps (these tests read ids only)."""

    def save(self, directory) -> None:
        directory.mkdir()
        (directory / "tokenizer.json").write_text(json.dumps({}))


def random_store(tmp_path, rows: int, seed: int = 0):
    """A store of ``rows`` pairs of random lengths (1-40 source tokens, the target near it)."""
    rng = np.random.default_rng(seed)
    src_lengths = rng.integers(1, 41, rows)
    tgt_lengths = np.maximum(1, src_lengths + rng.integers(-5, 6, rows))
    src = [[5] * int(n) for n in src_lengths]
    tgt = [[6] * int(n) for n in tgt_lengths]
    with StoreWriter(tmp_path / "store", vocab_size=100) as writer:
        writer.append(flatten(src, writer.dtype), flatten(tgt, writer.dtype))
        writer.finish(SavesNothing())
    return open_store(tmp_path / "store")


def padded_cost(batch: list[int], store) -> int:
    """Tokens of the padded tensors, counted the batcher's way (src + EOS, tgt + BOS + EOS)."""
    return len(batch) * max(max(len(store.src[i]) + 1, len(store.tgt[i]) + 2) for i in batch)


@pytest.mark.parametrize("limits", [(None, None), (30, None), (None, 20), (25, 12)])
def test_a_corpus_in_one_pool_is_batched_as_the_whole_corpus_batcher_batches_it(tmp_path, limits):
    store = random_store(tmp_path, 700)
    rows, src, tgt = store.within(*limits)
    for world in (1, 2):
        for rank in range(world):
            whole = TokenBatcher(src, tgt, 150, seed=4, rank=rank, world_size=world)
            pooled = PooledBatcher(store, 150, *limits, seed=4, rank=rank, world_size=world)
            assert pooled.pairs == len(rows) and pooled.dropped == 700 - len(rows)
            assert len(pooled) == len(whole)
            for epoch in range(3):
                expected = [rows[batch].tolist() for batch in whole.batches(epoch)]
                assert pooled.batches(epoch) == expected


def test_the_length_limits_keep_the_rows_whose_sides_fit(tmp_path):
    store = random_store(tmp_path, 300)
    rows, src, tgt = store.within(25, 12, start=100, stop=250)
    expected = [
        i
        for i in range(100, 250)
        if max(len(store.src[i]), len(store.tgt[i])) + 1 <= 25 and len(store.src[i]) <= 12
    ]
    assert rows.tolist() == expected
    assert src.tolist() == [len(store.src[i]) for i in expected]
    assert tgt.tolist() == [len(store.tgt[i]) for i in expected]


def test_pools_give_every_pair_once_an_epoch_under_the_budget_one_pool_after_another(tmp_path):
    store = random_store(tmp_path, 1000)
    batcher = PooledBatcher(store, 200, max_positions=35, seed=1, pool=300)
    kept = store.within(35, None)[0].tolist()
    pool_of = {row: row // 300 for row in range(1000)}
    for epoch in range(3):
        batches = batcher.batches(epoch)
        assert len(batches) == len(batcher)
        assert sorted(i for b in batches for i in b) == kept
        assert all(padded_cost(b, store) <= 200 for b in batches)
        pools = [pool_of[b[0]] for b in batches]
        assert all(pool_of[i] == pool for b, pool in zip(batches, pools, strict=True) for i in b)
        runs = [pools[0]] + [p for p, q in zip(pools[1:], pools, strict=False) if p != q]
        assert sorted(runs) == [0, 1, 2, 3]  # each pool's batches come together, once
    assert batcher.batches(0) != batcher.batches(1)
    assert batcher.batches(1) == PooledBatcher(store, 200, 35, seed=1, pool=300).batches(1)
    assert batcher.batches(1) != PooledBatcher(store, 200, 35, seed=2, pool=300).batches(1)


def test_ranks_share_an_epochs_batches_without_overlap(tmp_path):
    store = random_store(tmp_path, 900)
    alone = PooledBatcher(store, 180, seed=3, pool=250).batches(2)
    ranks = [PooledBatcher(store, 180, seed=3, rank=r, world_size=3, pool=250) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    shared = [b for k in range(len(ranks[0])) for r in ranks for b in [r.batches(2)[k]]]
    assert shared == alone[: len(shared)] and len(alone) - len(shared) < 3


def test_a_resumed_epoch_continues_with_the_batches_it_had_not_reached(tmp_path):
    store = random_store(tmp_path, 800)
    batcher = PooledBatcher(store, 160, seed=0, pool=200)
    whole = list(batcher.batches(5))
    first_pool = batcher.batch_counts()[batcher.pool_order(5)[0]]
    assert len(whole) > 137 > first_pool  # a restart inside a later pool
    later = batcher.batches(5)  # a fresh epoch object, as after a restart
    assert later[137:] == whole[137:] and later[-1] == whole[-1]


def test_limits_that_keep_nothing_are_refused_in_one_line(tmp_path):
    store = random_store(tmp_path, 50)
    with pytest.raises(DataError, match="raise trainer.max_positions"):
        PooledBatcher(store, 100, max_positions=1)
