"""Bad input to the data pipeline, and properties that hold for any text: control characters,
absurdly long lines and empty files are handled and counted or refused in one line; random text
goes through reading, cleaning, the tokenizer, batching and padding without breaking alignment."""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

import pytest
import torch
from conftest import clean_pairs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from posenc.config import data as typed
from posenc.data.batching import TokenBatcher, collate
from posenc.data.corpus import Corpus, DataError
from posenc.data.splits import load_corpora, read_lines
from posenc.data.streams import MAX_LINE_CHARS
from posenc.data.tokenizer import Tokenizer, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def local_config(directory: Path, clean: dict | None = None) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "data" / "local.yaml"))
    cfg.update(dir=str(directory), train=["x"], valid="x", test="x", valid_size=None, clean=clean)
    cfg["holdout"] = {}
    return cfg


def write(directory: Path, stem: str, src: list[str], tgt: list[str]) -> None:
    (directory / f"{stem}.fr").write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    (directory / f"{stem}.en").write_text("".join(f"{t}\n" for t in tgt), encoding="utf-8")


# --- bad files -------------------------------------------------------------------------------


def test_control_characters_are_removed_and_counted(tmp_path, caplog):
    src = ["Un\x00 deux\x1b[31m trois", "quatre\tcinq\rsix", "sept\x07", "huit"]
    write(tmp_path, "x", src, ["one", "two", "three", "four"])
    with caplog.at_level(logging.WARNING, logger="posenc.data.splits"):
        corpora = load_corpora(typed.data_config(local_config(tmp_path)))
    assert corpora["test"].src == ["Un deux[31m trois", "quatre cinq six", "sept", "huit"]
    assert f"{tmp_path / 'x.fr'}: removed control characters from 2 lines" in caplog.text


def test_absurdly_long_lines_are_dropped_from_held_out_splits_and_counted(tmp_path, caplog):
    long = "mot " * (MAX_LINE_CHARS // 4 + 1)
    write(tmp_path, "x", ["court", long, "aussi court"], ["short", "long", "also short"])
    with caplog.at_level(logging.INFO, logger="posenc.data.splits"):
        corpora = load_corpora(typed.data_config(local_config(tmp_path)))
    assert corpora["test"].src == ["court", "aussi court"]
    assert f"test: dropped 1 pairs with a side over {MAX_LINE_CHARS} characters" in caplog.text
    clean = {"min_words": 1, "max_words": 80, "max_ratio": 3.0, "dedup": True}
    with caplog.at_level(logging.INFO, logger="posenc.data.splits"):
        cleaned = load_corpora(typed.data_config(local_config(tmp_path, clean)))
    assert sorted(cleaned["train"].src) == ["aussi court", "court"]  # too many words
    assert "1 length" in caplog.text


def test_an_empty_file_is_refused_naming_it(tmp_path):
    write(tmp_path, "x", ["un"], ["one"])
    (tmp_path / "x.en").write_bytes(b"")
    with pytest.raises(DataError, match=f"data file {tmp_path / 'x.en'} is empty"):
        load_corpora(typed.data_config(local_config(tmp_path)))
    (tmp_path / "x.en").write_bytes(b"\xef\xbb\xbf")  # a byte-order mark only
    with pytest.raises(DataError, match="is empty"):
        read_lines(tmp_path / "x.en")


# --- any text --------------------------------------------------------------------------------

lines = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n\ufeff"), max_size=40
)


def normalised(line: str) -> str:
    """``line`` as the reader should return it: control characters other than whitespace
    removed, whitespace runs made one space, ends trimmed."""
    kept = "".join(c for c in line if c.isspace() or unicodedata.category(c) != "Cc")
    return " ".join(kept.split())


@PROPERTY
@given(st.lists(st.tuples(lines, lines), min_size=1, max_size=12))
def test_any_text_is_read_back_aligned_and_normalised(tmp_path, pairs):
    write(tmp_path, "x", [s for s, _ in pairs], [t for _, t in pairs])
    try:
        corpora = load_corpora(typed.data_config(local_config(tmp_path)))
    except DataError as err:  # every pair has an empty side: refused in one line
        assert "\n" not in str(err) and "'train'" in str(err)
        return
    expected = [(normalised(s), normalised(t)) for s, t in pairs]
    expected = [(s, t) for s, t in expected if s and t]  # pairs with an empty side are dropped
    for corpus in corpora.values():
        assert sorted(zip(corpus.src, corpus.tgt, strict=True)) == sorted(expected)


words = st.lists(st.sampled_from(["a", "bb", "ccc", "dd", "e"]), max_size=10).map(" ".join)


@given(
    st.lists(st.tuples(words, words), max_size=30),
    st.integers(0, 3),
    st.integers(3, 10),
    st.floats(1.0, 4.0),
    st.booleans(),
)
def test_clean_pairs_counts_every_pair_once_and_keeps_only_valid_ones(
    pairs, min_words, max_words, max_ratio, dedup
):
    corpus = Corpus("train", [s for s, _ in pairs], [t for _, t in pairs])
    kept, stats = clean_pairs(corpus, min_words, max_words, max_ratio, dedup)
    dropped = stats["empty"] + stats["length"] + stats["ratio"] + stats["duplicate"]
    assert stats["input"] == len(pairs) == dropped + stats["kept"]
    assert stats["kept"] == len(kept)
    kept_pairs = list(zip(kept.src, kept.tgt, strict=True))
    remaining = iter(pairs)
    assert all(pair in remaining for pair in kept_pairs)  # a subsequence: order kept
    for s, t in kept_pairs:
        ns, nt = len(s.split()), len(t.split())
        assert min(ns, nt) >= max(min_words, 1) and max(ns, nt) <= max_words
        assert max(ns, nt) <= max_ratio * min(ns, nt)
    if dedup:
        assert len(set(kept_pairs)) == len(kept_pairs)
    assert clean_pairs(kept, min_words, max_words, max_ratio, dedup)[1]["kept"] == len(kept)


ids = st.lists(st.integers(3, 50), max_size=12)


@given(st.lists(st.tuples(ids, ids), min_size=1, max_size=8))
def test_collate_pads_and_loses_nothing(pairs):
    src_ids, tgt_ids = [s for s, _ in pairs], [t for _, t in pairs]
    src, tgt_in, tgt_out = collate(src_ids, tgt_ids, pad_id=0, bos_id=1, eos_id=2)
    assert src.shape == (len(pairs), max(map(len, src_ids)) + 1)
    assert tgt_in.shape == tgt_out.shape == (len(pairs), max(map(len, tgt_ids)) + 1)
    for row, (s, t) in enumerate(pairs):
        assert src[row][src[row] != 0].tolist() == [*s, 2]
        assert tgt_in[row][tgt_in[row] != 0].tolist() == [1, *t]
        assert tgt_out[row][tgt_out[row] != 0].tolist() == [*t, 2]
    assert int(tgt_out.ne(0).sum()) == sum(len(t) + 1 for t in tgt_ids)  # the loss's tokens


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), min_size=1, max_size=200),
    st.integers(1, 400),
    st.integers(0, 5),
    st.integers(1, 4),
)
def test_batches_cover_each_example_once_within_the_budget_and_shard_evenly(
    lengths, max_tokens, seed, world_size
):
    src, tgt = [s for s, _ in lengths], [t for _, t in lengths]
    full = TokenBatcher(src, tgt, max_tokens, seed=seed)
    for epoch in (0, 1):
        batches = full.batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            cost = len(b) * max(max(src[i] + 1, tgt[i] + 2) for i in b)
            assert cost <= max_tokens or len(b) == 1
    if len(full) < world_size:
        with pytest.raises(DataError, match="cannot be shared"):
            TokenBatcher(src, tgt, max_tokens, seed=seed, rank=0, world_size=world_size)
        return
    shards = [
        TokenBatcher(src, tgt, max_tokens, seed=seed, rank=r, world_size=world_size).batches(3)
        for r in range(world_size)
    ]
    assert len({len(s) for s in shards}) == 1
    seen = [i for shard in shards for b in shard for i in b]
    assert len(seen) == len(set(seen))
    # One step of every rank together = consecutive batches of the single-process epoch.
    assert [b for step in zip(*shards, strict=True) for b in step] == full.batches(3)[
        : len(shards[0]) * world_size
    ]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Tokenizer:
    cfg = {"kind": "bpe", "vocab_size": 1100, "min_frequency": 1}
    train = Corpus("train", ["Le chat dort sur le tapis."] * 5, ["The cat sleeps on the mat."] * 5)
    return build_tokenizer(typed.tokenizer_config(cfg), train, tmp_path_factory.mktemp("bpe"))


@PROPERTY
@given(st.lists(st.tuples(lines, lines), min_size=1, max_size=10), st.integers(8, 200))
def test_any_text_becomes_valid_padded_batches(bpe, pairs, max_tokens):
    corpus = Corpus("train", [" ".join(s.split()) for s, _ in pairs], [t for _, t in pairs])
    src_ids, tgt_ids = bpe.encode_batch(corpus.src), bpe.encode_batch(corpus.tgt)
    assert src_ids == [bpe.encode(s) for s in corpus.src]
    assert [bpe.decode(i) for i in src_ids] == [unicodedata.normalize("NFC", s) for s in corpus.src]
    batcher = TokenBatcher(list(map(len, src_ids)), list(map(len, tgt_ids)), max_tokens)
    for batch in batcher.batches(0):
        tensors = collate(
            [src_ids[i] for i in batch], [tgt_ids[i] for i in batch], bpe.pad_id, 1, 2
        )
        for tensor in tensors:
            assert tensor.dtype == torch.long and len(tensor) == len(batch)
            assert int(tensor.min()) >= 0 and int(tensor.max()) < bpe.vocab_size


# --- the data config, typed by its kind ------------------------------------------------------


@pytest.mark.parametrize("name", ["local", "toy", "wmt14", "wmt14_files"])
def test_every_data_config_reads_as_its_kind(name):
    from conftest import compose

    from posenc.config.data import DATA_KINDS, data_config

    node = compose(f"data={name}").data
    assert type(data_config(node)) is DATA_KINDS[node.kind]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "parquet"}, "unknown data.kind 'parquet'; use one of local, wmt14, toy"),
        (
            {"holdout_drop": ["source"]},
            "data.holdout_drop is not among the data settings; did you mean data.holdout_drops?",
        ),
        ({"seed": "abc"}, "data.seed='abc' must be an integer"),
        ({"valid_size": 0}, "data.valid_size=0 must be an integer >= 1 or null"),
    ],
)
def test_a_data_setting_of_no_kind_or_the_wrong_type_is_refused_in_one_line(
    tmp_path, change, message
):
    cfg = local_config(tmp_path) | change
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        load_corpora(typed.data_config(cfg))


def test_one_stem_on_the_command_line_and_a_node_saved_before_holdout_drops_read_as_made(
    tmp_path,
):
    from posenc.config.data import data_config

    cfg = local_config(tmp_path) | {"train": "x"}
    del cfg["holdout_drops"]  # as runs saved it before training pairs sharing a target went too
    typed = data_config(cfg)
    assert typed.train == ["x"] and typed.holdout_drops == ("source",)


@pytest.mark.parametrize("name", ["bpe", "mbert"])
def test_every_tokenizer_config_reads_as_its_kind(name):
    from conftest import compose

    from posenc.config.data import TOKENIZER_KINDS, tokenizer_config

    node = compose(f"tokenizer={name}").tokenizer
    assert type(tokenizer_config(node)) is TOKENIZER_KINDS[node.kind]


@pytest.mark.parametrize(
    "node, message",
    [
        (
            {"kind": "sentencepiece"},
            "unknown tokenizer.kind 'sentencepiece'; use one of bpe, mbert",
        ),
        (
            {"kind": "bpe", "vocab_sise": 10},
            "tokenizer.vocab_sise is not among the tokenizer settings; "
            "did you mean tokenizer.vocab_size?",
        ),
        ({"kind": "bpe", "min_frequency": 0}, "tokenizer.min_frequency=0 must be an integer >= 1"),
        (
            {"kind": "bpe", "vocab_size": 4},
            "tokenizer.vocab_size=4 leaves no room beside the 4 special tokens; set it above 4",
        ),
        (
            {"kind": "mbert", "training_types_only": "yes"},
            "tokenizer.training_types_only='yes' must be true or false",
        ),
    ],
)
def test_a_tokenizer_setting_of_no_kind_or_the_wrong_type_is_refused_in_one_line(node, message):
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        build_tokenizer(typed.tokenizer_config(node), Corpus("train", ["a b"], ["c d"]), None)
