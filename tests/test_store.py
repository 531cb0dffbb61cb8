"""The prepared corpus: a training run reads its pairs' ids from flat memory-mapped arrays made
once per data and tokenizer settings; a second run (another seed or encoding) reads no text and
tokenises nothing, and trains exactly as the first."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SMOKE, compose

import posenc.data.prepare as prepare_module
from posenc.config import data as typed
from posenc.data.corpus import DataError
from posenc.data.store import StoreWriter, current_umask, flatten, open_store, prepared, store_key
from posenc.data.tokenizer import load_tokenizer
from posenc.job import run
from posenc.training.inputs import encode_pairs

OVERRIDES = (*SMOKE, "pe=nonepe", "trainer.max_steps=6", "trainer.valid_every=2")


def write_store(directory, src, tgt, tokenizer) -> None:
    """A store of these rows, written at once."""
    with StoreWriter(directory, tokenizer.vocab_size) as writer:
        writer.append(flatten(src, writer.dtype), flatten(tgt, writer.dtype))
        writer.finish(tokenizer)


def test_a_store_gives_back_every_pair_and_keeps_what_the_length_limits_keep(tmp_path):
    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "run")
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    src = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14]]
    tgt = [[5], [6, 7, 8, 9], [10], [11, 12]]
    write_store(tmp_path / "store", src, tgt, tokenizer)
    store = open_store(tmp_path / "store")
    assert [store.src[i] for i in range(len(store))] == src
    assert [store.tgt[i] for i in range(len(store))] == tgt
    assert store.src.lengths().tolist() == [3, 1, 5, 1]
    assert store.tgt.lengths(1, 3).tolist() == [4, 1]
    rows, src_lengths, tgt_lengths = store.within(max_positions=5, max_source_tokens=3)
    assert [store.src[i] for i in rows] == [[5, 6, 7], [8], [14]]
    assert (src_lengths.tolist(), tgt_lengths.tolist()) == ([3, 1, 1], [1, 4, 2])
    assert store.within(None, None)[0].tolist() == [0, 1, 2, 3]


def test_limits_select_the_rows_and_order_encode_pairs_keeps(tmp_path):
    cfg = compose(*SMOKE)
    from posenc.data.splits import load_corpora

    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "run")
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    train = load_corpora(typed.data_config(cfg.data))["train"]
    src, tgt, _ = encode_pairs(tokenizer, train)
    write_store(tmp_path / "store", src, tgt, tokenizer)
    store = open_store(tmp_path / "store")
    for limits in ((8, None), (None, 5), (12, 6)):
        expected_src, expected_tgt, _ = encode_pairs(tokenizer, train, *limits)
        rows = store.within(*limits)[0]
        assert [store.src[i] for i in rows] == expected_src
        assert [store.tgt[i] for i in rows] == expected_tgt


def test_a_second_run_reads_the_prepared_corpus_and_trains_identically(tmp_path, monkeypatch):
    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "a")
    built = []
    real = prepare_module.prepare_store
    monkeypatch.setattr(prepare_module, "prepare_store", lambda *a: built.append(a) or real(*a))
    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "b")
    assert built == []  # nothing loaded, cleaned or tokenised again
    summaries = [json.loads((tmp_path / d / "train_summary.json").read_text()) for d in "ab"]
    for key in ("best_valid_loss", "final_valid_loss", "train_tokens"):
        assert summaries[0][key] == summaries[1][key]
    assert summaries[0]["train_pairs"] == summaries[1]["train_pairs"] > 0


def test_the_store_is_named_by_what_it_depends_on(tmp_path):
    cfg = compose(*SMOKE)
    key = store_key(cfg.data, cfg.tokenizer)
    assert key == store_key(compose(*SMOKE, "trainer.max_positions=9").data, cfg.tokenizer)
    assert key != store_key(compose(*SMOKE, "data.seed=7").data, cfg.tokenizer)
    assert key != store_key(cfg.data, compose(*SMOKE, "tokenizer.vocab_size=512").tokenizer)
    assert prepared(tmp_path, key) == tmp_path / "stores" / key


def test_a_data_folder_spelled_relative_or_absolute_names_one_store(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    local = ("data=local", "data.train=[corpus]")
    relative = compose(*SMOKE, *local, "data.dir=data")
    absolute = compose(*SMOKE, *local, f"data.dir={tmp_path / 'data'}")
    other = compose(*SMOKE, *local, f"data.dir={tmp_path}")
    key = store_key(relative.data, relative.tokenizer)
    assert key == store_key(absolute.data, absolute.tokenizer)
    assert key != store_key(other.data, other.tokenizer)


def test_a_damaged_store_is_refused_in_one_line(tmp_path):
    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "run")
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    write_store(tmp_path / "store", [[5, 6]], [[7]], tokenizer)
    np.arange(3, dtype=np.int64).tofile(tmp_path / "store" / "src.off")
    with pytest.raises(DataError, match="is damaged .*src.off does not match.*delete it"):
        open_store(tmp_path / "store")


@pytest.fixture
def made(tmp_path):
    """A store as preparation leaves it, in a folder named by its key, and its tokenizer."""
    run(compose(*OVERRIDES, "eval.enabled=false"), tmp_path / "run")
    tokenizer = load_tokenizer(tmp_path / "run" / "tokenizer")
    directory = tmp_path / "stores" / "0123456789abcdef0123"
    write_store(directory, [[5, 6], [7], [8, 9, 10]], [[7], [5, 6], [9]], tokenizer)
    return directory, tokenizer


def test_a_store_made_for_other_settings_is_refused_in_one_line(made, tmp_path):
    directory, tokenizer = made
    other = tmp_path / "stores" / "ffffffffffffffffffff"
    directory.rename(other)
    with pytest.raises(DataError, match=f"{other} is damaged .*made for the settings .*delete it"):
        open_store(other)


def test_a_tokenizer_swapped_in_is_refused_before_a_run_trusts_it(made):
    directory, _ = made
    vocab = next((directory / "tokenizer").iterdir())
    vocab.write_bytes(vocab.read_bytes() + b" ")
    with pytest.raises(DataError, match="its tokenizer is not the one its ids were made with"):
        open_store(directory)


@pytest.mark.parametrize(
    ("offsets", "expected"),
    [
        ([0, 3, 1, 6], "src.off goes backwards at row 1"),  # a negative length
        ([0, 2, 14750, 6], "src.off goes backwards at row 2"),  # past the end: once hung training
    ],
)
def test_offsets_that_go_backwards_or_past_the_end_are_refused(made, offsets, expected):
    directory, _ = made
    np.asarray(offsets, dtype=np.int64).tofile(directory / "src.off")
    with pytest.raises(DataError, match=expected):
        open_store(directory)


def test_ids_beyond_the_vocabulary_are_refused_naming_the_store(made):
    directory, tokenizer = made
    ids = np.fromfile(directory / "tgt.bin", dtype=np.uint16)
    ids[1] = tokenizer.vocab_size
    ids.tofile(directory / "tgt.bin")
    with pytest.raises(DataError, match=f"{directory} is damaged .*tgt.bin holds id .*vocabulary"):
        open_store(directory)


def test_a_store_follows_the_umask_and_one_without_meta_is_set_aside_when_made_again(made):
    directory, tokenizer = made
    assert directory.stat().st_mode & 0o777 == 0o777 & ~current_umask()
    (directory / "meta.json").unlink()
    write_store(directory, [[5]], [[6]], tokenizer)  # preparing again, as a later run does
    assert len(open_store(directory)) == 1
    assert [
        p.name.startswith(f".{directory.name}.damaged-")
        for p in directory.parent.iterdir()
        if p != directory
    ] == [True]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_while_preparing_names_the_folder_and_what_to_do(tmp_path):
    with StoreWriter(tmp_path / "stores" / "key", 100) as writer, open("/dev/full", "wb") as full:
        writer._bins["src"].close()
        writer._bins["src"] = full  # every write fails: no space left
        with pytest.raises(DataError, match=f"into {tmp_path / 'stores'} failed .*disk full"):
            writer.append(flatten([[5] * 100_000], writer.dtype), flatten([[6]], writer.dtype))
