"""Specifications of the data pipeline: corpora, cleaning, token-bucketed batches, padding."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA, clean_pairs, sentences, write_pair
from omegaconf import OmegaConf

from posenc.config import data as typed
from posenc.data.batching import TokenBatcher, collate
from posenc.data.corpus import Corpus, DataError, resolve_path
from posenc.data.splits import eval_splits, load_corpora, training_stream

ROOT = Path(__file__).resolve().parents[1]


def data_config(name: str, **overrides) -> dict:
    """The ``configs/data/NAME.yaml`` node as a plain dict (interpolations unresolved), with
    overrides."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "data" / f"{name}.yaml"))
    cfg.update(overrides)
    return cfg


def assert_one_line_error(excinfo: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)


# --- toy -------------------------------------------------------------------------------------


def test_toy_data_is_deterministic_and_the_target_depends_on_word_order():
    first, second = (
        load_corpora(typed.data_config(data_config("toy"))),
        load_corpora(typed.data_config(data_config("toy"))),
    )
    assert set(first) == {"train", "valid", "test"}
    assert [len(first[k]) for k in ("train", "valid", "test")] == [2000, 100, 100]
    for split in first:
        assert first[split].src == second[split].src
        assert first[split].tgt == second[split].tgt
    train = first["train"]
    vocab = set("abcdefghijklmnopqrstuvwx")
    for src, tgt in zip(train.src, train.tgt, strict=True):
        words = src.split()
        assert 3 <= len(words) <= 12 and set(words) <= vocab
        assert tgt.split() == words[::-1]
    # Same words, another order: another target.
    assert sum(s != t for s, t in zip(train.src, train.tgt, strict=True)) > 1900
    other = load_corpora(typed.data_config(data_config("toy", seed=99)))["train"]
    assert other.src != train.src


def test_toy_rotate_task_and_longer_extra_test_sets():
    cfg = data_config(
        "toy", task="rotate", shift=2, extra_tests={"long": {"min_len": 13, "max_len": 24}}
    )
    corpora = load_corpora(typed.data_config(cfg))
    for src, tgt in zip(corpora["train"].src, corpora["train"].tgt, strict=True):
        words = src.split()
        assert tgt.split() == words[2:] + words[:2]
    long = corpora["long"]
    assert len(long) == 100
    assert all(13 <= len(s.split()) <= 24 for s in long.src)
    held_out = set(corpora["valid"].src) | set(corpora["test"].src)
    assert not held_out & set(corpora["train"].src)


def test_toy_rejects_unknown_task():
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(data_config("toy", task="sort")))
    assert_one_line_error(excinfo, "sort", "reverse", "rotate")


# --- local files -----------------------------------------------------------------------------


def local_config(directory: Path, **overrides) -> dict:
    cfg = data_config(
        "local",
        dir=str(directory),
        train=["corpus/train", "corpus/news"],
        valid="dev",
        test="test",
        valid_size=None,
        holdout={},
    )
    cfg.update(overrides)
    return cfg


def test_local_loader_reads_aligned_files_and_drops_empty_lines(local_dir, caplog):
    with caplog.at_level(logging.INFO, logger="posenc.data.splits"):
        corpora = load_corpora(
            typed.data_config(local_config(local_dir, extra_tests={"news": "corpus/news"}))
        )
    assert {k: len(v) for k, v in corpora.items()} == {
        "train": 70,
        "valid": 29,
        "test": 19,
        "news": 10,
    }
    # Alignment survives shuffling and dropping: pair i of the files stays pair i.
    files = dict(
        zip(sentences(60, 1) + sentences(10, 3), sentences(60, 2) + sentences(10, 4), strict=True)
    )
    assert all(
        files[s] == t for s, t in zip(corpora["train"].src, corpora["train"].tgt, strict=True)
    )
    assert corpora["train"].src != list(files)  # shuffled
    assert corpora["test"].tgt == [t for i, t in enumerate(sentences(20, 8)) if i != 3]
    assert "split 'news' (corpus/news) is also training data: not held-out" in caplog.text
    assert "valid: dropped 1 pairs with an empty side" in caplog.text
    assert "test: dropped 1 pairs with an empty side" in caplog.text
    assert "dropped 0 empty, 0 length, 0 ratio, 0 duplicate; kept 70" in caplog.text


def test_local_subsets_are_seeded_samples(local_dir):
    corpora = load_corpora(typed.data_config(local_config(local_dir, train_size=25, valid_size=10)))
    again = load_corpora(typed.data_config(local_config(local_dir, train_size=25, valid_size=10)))
    other = load_corpora(
        typed.data_config(local_config(local_dir, train_size=25, valid_size=10, seed=7))
    )
    assert len(corpora["train"]) == 25 and len(corpora["valid"]) == 10
    assert corpora["train"].src == again["train"].src and corpora["valid"].src == again["valid"].src
    assert corpora["train"].src != other["train"].src
    full_valid = sentences(30, 5)
    positions = [full_valid.index(s) for s in corpora["valid"].src]
    assert positions == sorted(positions)  # file order kept


def test_local_loader_normalises_whitespace_and_ignores_a_byte_order_mark(tmp_path):
    (tmp_path / "x.fr").write_bytes("\ufeffUn\u00a0 deux\t\r\nTrois\n".encode())
    (tmp_path / "x.en").write_text("One two\nThree", encoding="utf-8")
    corpora = load_corpora(
        typed.data_config(local_config(tmp_path, train=["x"], valid="x", test="x", clean=None))
    )
    assert corpora["test"].src == ["Un deux", "Trois"]
    assert corpora["test"].tgt == ["One two", "Three"]


def test_missing_file_names_it_and_the_setting(local_dir):
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir, test="nowhere/newstest")))
    assert_one_line_error(
        excinfo, str(local_dir / "nowhere/newstest.fr"), "data.dir", "POSENC_DATA"
    )


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(tmp_path / "absent")))
    assert_one_line_error(excinfo, "absent", "POSENC_DATA")


def test_line_count_mismatch_names_both_files_and_counts(local_dir):
    (local_dir / "test.en").write_text("only\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir)))
    assert_one_line_error(
        excinfo, str(local_dir / "test.fr"), "20 lines", str(local_dir / "test.en"), "has 2"
    )


def test_invalid_utf8_names_file_and_line(local_dir):
    lines = "\n".join(sentences(20, 7)).encode().split(b"\n")
    lines[4] = b"caf\xe9 latin-1"
    (local_dir / "test.fr").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir)))
    assert_one_line_error(excinfo, str(local_dir / "test.fr"), "line 5", "UTF-8")


def test_empty_training_split_after_cleaning_names_split_and_filter(local_dir):
    clean = {"min_words": 6, "max_words": 80, "max_ratio": 3.0, "dedup": True}
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir, clean=clean)))
    assert_one_line_error(excinfo, "'train'", "'length'", "70 of 70", "data.clean")


def test_held_out_split_with_only_empty_lines_is_refused(local_dir):
    write_pair(local_dir, "blank", ["", " "], ["a", "b"])
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir, test="blank")))
    assert_one_line_error(excinfo, "'test'", "2 empty")


@pytest.mark.parametrize(
    ("overrides", "parts"),
    [
        ({"kind": "csv"}, ["'csv'", "toy", "local", "wmt14"]),
        ({"extra_tests": {"valid": "dev"}}, ["'valid'", "rename"]),
        ({"src_lang": None}, ["src_lang"]),
        ({"clean": {"max_word": 80}}, ["'max_word'", "min_words", "dedup"]),
    ],
)
def test_bad_settings_give_one_line_errors(local_dir, overrides, parts):
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir, **overrides)))
    assert_one_line_error(excinfo, *parts)


def test_holdout_sets_are_cut_out_of_training_and_none_of_their_sources_is_trained_on(
    local_dir, caplog
):
    # One source of the stem has a second translation: held out, both pairs leave training.
    src, tgt = sentences(60, 1), sentences(60, 2)
    write_pair(local_dir, "corpus/train", [*src, src[0]], [*tgt, "another translation"])
    holdout = {"inside": {"stem": "corpus/train", "size": 20}}
    with caplog.at_level(logging.INFO, logger="posenc.data.splits"):
        corpora = load_corpora(
            typed.data_config(local_config(local_dir, holdout=holdout, clean=None))
        )
    inside = corpora["inside"]
    assert len(inside) == 20 and len(set(inside.src)) == 20
    pairs = dict(zip(src, tgt, strict=True))
    assert all(pairs[s] == t for s, t in zip(inside.src, inside.tgt, strict=True))
    positions = [src.index(s) for s in inside.src]
    assert positions != sorted(positions)  # a random order: max_sentences keeps a random subset
    assert not set(inside.src) & set(corpora["train"].src)
    trained_on = 61 - 20 - (1 if src[0] in inside.src else 0) + 10
    assert len(corpora["train"]) == trained_on
    assert "inside: 20 pairs held out of corpus/train" in caplog.text
    again = load_corpora(typed.data_config(local_config(local_dir, holdout=holdout, clean=None)))
    other = load_corpora(
        typed.data_config(local_config(local_dir, holdout=holdout, clean=None, seed=7))
    )
    assert again["inside"].src == inside.src and other["inside"].src != inside.src


def test_no_training_pair_shares_a_source_or_a_target_with_a_held_out_pair(local_dir):
    """Tatoeba's way: each English sentence also comes with another French source ("Tu n'es
    pas gros" / "Vous n'êtes pas gros"). Held out, a pair takes every such twin out of training;
    a config made before ``holdout_drops`` existed drops twins of the source only, and leaks."""
    src, tgt = sentences(60, 1), sentences(60, 2)
    twins = [f"{s} aussi" for s in src]
    write_pair(local_dir, "corpus/train", src + twins, tgt + tgt)
    holdout = {"inside": {"stem": "corpus/train", "size": 20}}
    clean = local_config(local_dir, holdout=holdout, clean=None)
    corpora = load_corpora(typed.data_config(clean))
    assert clean["holdout_drops"] == ["source", "target"]
    assert not set(corpora["inside"].tgt) & set(corpora["train"].tgt)
    assert not set(corpora["inside"].src) & set(corpora["train"].src)
    leaky = dict(clean)
    del leaky["holdout_drops"]
    before = load_corpora(typed.data_config(leaky))
    assert before["inside"].tgt == corpora["inside"].tgt  # the same held-out pairs
    held_twice = {t for t in before["inside"].tgt if before["inside"].tgt.count(t) == 2}
    leaked = set(before["inside"].tgt) & set(before["train"].tgt)
    assert leaked and leaked == set(before["inside"].tgt) - held_twice  # the twin was trained on


def test_a_holdout_rule_naming_another_side_is_refused_in_one_line(local_dir):
    holdout = {"inside": {"stem": "corpus/train", "size": 5}}
    with pytest.raises(DataError) as excinfo:
        load_corpora(
            typed.data_config(local_config(local_dir, holdout=holdout, holdout_drops=["sources"]))
        )
    assert_one_line_error(excinfo, "data.holdout_drops=['sources']", "source", "target")


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the shared offline data")
def test_the_tatoeba_set_of_runs_made_before_the_rule_shares_504_of_1000_targets_with_training():
    """The measured leak of the study's in-domain Tatoeba set, and none under the rule."""
    leaky = data_config("local", dir=str(SHARED_DATA))
    del leaky["holdout_drops"]
    shared = []
    for cfg in (leaky, data_config("local", dir=str(SHARED_DATA))):
        trained = {t for _, t in training_stream(typed.data_config(cfg))}
        held_out = load_corpora(typed.data_config(cfg), with_train=False)["tatoeba"]
        shared.append(sum(t in trained for t in held_out.tgt))
    assert shared == [504, 0]


def test_eval_splits_all_means_every_test_split_but_not_valid(local_dir):
    holdout = {"inside": {"stem": "corpus/train", "size": 5}}
    corpora = load_corpora(
        typed.data_config(local_config(local_dir, holdout=holdout, extra_tests={"x": "dev"}))
    )
    assert eval_splits(["all"], corpora) == ["test", "x", "inside"]
    assert eval_splits(["valid", "all", "test"], corpora) == ["valid", "test", "x", "inside"]
    with pytest.raises(DataError) as excinfo:
        eval_splits(["tset"], corpora)
    assert_one_line_error(excinfo, "'tset'", "'test'", "all")


@pytest.mark.parametrize(
    ("holdout", "parts"),
    [
        ({"h": {"stem": "dev", "size": 5}}, ["data.holdout.h.stem", "'dev'", "extra_tests"]),
        ({"h": {"stem": "corpus/news", "size": 10}}, ["data.holdout.h.size", "[1, 10)", "10"]),
        ({"h": {"stem": "corpus/news"}}, ["data.holdout.h", "{stem: STEM, size: N}"]),
        ({"test": {"stem": "corpus/news", "size": 2}}, ["'test'", "rename"]),
        ({"all": {"stem": "corpus/news", "size": 2}}, ["'all'", "rename"]),
    ],
)
def test_bad_holdout_settings_give_one_line_errors(local_dir, holdout, parts):
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(local_config(local_dir, holdout=holdout)))
    assert_one_line_error(excinfo, *parts)


def test_direction_is_configurable(local_dir):
    forward = load_corpora(typed.data_config(local_config(local_dir)))
    backward = load_corpora(
        typed.data_config(local_config(local_dir, src_lang="en", tgt_lang="fr"))
    )
    assert backward["test"].src == forward["test"].tgt
    assert backward["test"].tgt == forward["test"].src


def test_relative_paths_resolve_against_the_launch_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_path("data/x") == tmp_path / "data" / "x"
    assert resolve_path("/abs/x") == Path("/abs/x")


@pytest.mark.slow
def test_real_local_corpus_loads(tmp_path):
    data_dir = SHARED_DATA
    if not data_dir.is_dir():
        pytest.skip(f"the shared offline data ({data_dir}) is absent")
    corpora = load_corpora(typed.data_config(data_config("local", dir=str(data_dir))))
    assert len(corpora["train"]) > 200_000
    assert len(corpora["valid"]) == 500 and len(corpora["test"]) == 3003
    assert len(corpora["tatoeba"]) == len(corpora["europarl"]) == 1000
    held_out = set(corpora["tatoeba"].src) | set(corpora["europarl"].src)
    assert not held_out & set(corpora["train"].src)


# --- WMT14 from the hub (never touches the network) ------------------------------------------


class FakeStream(list):
    """Stands in for a streaming ``datasets.IterableDataset``."""

    def shuffle(self, seed: int, buffer_size: int) -> FakeStream:
        return FakeStream(random.Random(seed).sample(self, len(self)))

    def take(self, n: int) -> FakeStream:
        return FakeStream(self[:n])


def test_wmt14_unreachable_hub_says_to_use_local_data(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'wmt14' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as excinfo:
        load_corpora(typed.data_config(data_config("wmt14")))
    assert_one_line_error(excinfo, "unreachable", "data=local", "POSENC_DATA")


def test_wmt14_other_errors_are_not_hidden(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def broken(*args, **kwargs):
        raise KeyError("translation")

    monkeypatch.setattr(datasets, "load_dataset", broken)
    with pytest.raises(KeyError):
        load_corpora(typed.data_config(data_config("wmt14")))


def test_wmt14_streams_a_cleaned_training_subset(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        n = {"train": 50, "validation": 8, "test": 6}[split]
        rows = [
            {"translation": {"fr": f"fr {split} {i}", "en": f"en {split} {i}"}} for i in range(n)
        ]
        if split != "train":
            rows.append({"translation": {"fr": "", "en": "empty source"}})
        return FakeStream(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    corpora = load_corpora(typed.data_config(data_config("wmt14", train_size=20, valid_size=5)))
    assert {k: len(v) for k, v in corpora.items()} == {"train": 20, "valid": 5, "test": 6}
    assert {c[2] for c in calls} == {"train", "validation", "test"}
    assert all(c[:2] == ("wmt14", "fr-en") and c[3] for c in calls)
    assert all(
        s.replace("fr", "en") == t
        for s, t in zip(corpora["test"].src, corpora["test"].tgt, strict=True)
    )
    calls.clear()  # evaluation: the same held-out splits, and the training stream is not opened
    held_out = load_corpora(
        typed.data_config(data_config("wmt14", train_size=20, valid_size=5)), with_train=False
    )
    assert sorted(held_out) == ["test", "valid"] and {c[2] for c in calls} == {"validation", "test"}
    assert held_out["valid"].src == corpora["valid"].src


def test_evaluation_gets_the_same_held_out_splits_without_the_training_split(local_dir):
    cfg = local_config(local_dir, holdout={"inside": {"stem": "corpus/train", "size": 5}})
    full, held_out = (
        load_corpora(typed.data_config(cfg)),
        load_corpora(typed.data_config(cfg), with_train=False),
    )
    assert sorted(held_out) == ["inside", "test", "valid"]
    assert all(held_out[name].src == full[name].src for name in held_out)


# --- cleaning --------------------------------------------------------------------------------


def test_clean_pairs_counts_each_filter():
    pairs = [
        ("un deux", "one two"),  # kept
        ("", "empty source"),  # empty
        ("un", ""),  # empty
        (" ".join(["mot"] * 9), " ".join(["word"] * 9)),  # length (> 8 words)
        ("un deux trois quatre", "one"),  # ratio 4 > 3
        ("un", "one two three"),  # ratio 3: kept
        ("un deux", "one two"),  # duplicate
        ("un deux", "one two!"),  # another target: kept
    ]
    corpus = Corpus("train", [p[0] for p in pairs], [p[1] for p in pairs])
    kept, stats = clean_pairs(corpus, min_words=1, max_words=8, max_ratio=3.0, dedup=True)
    assert stats == {"input": 8, "empty": 2, "length": 1, "ratio": 1, "duplicate": 1, "kept": 3}
    assert list(zip(kept.src, kept.tgt, strict=True)) == [pairs[0], pairs[5], pairs[7]]
    _, no_dedup = clean_pairs(corpus, min_words=1, max_words=8, max_ratio=3.0, dedup=False)
    assert no_dedup["duplicate"] == 0 and no_dedup["kept"] == 4
    _, short = clean_pairs(corpus, min_words=2, max_words=8, max_ratio=3.0, dedup=True)
    assert short["length"] == 3  # plus the two one-word sides


def test_clean_pairs_rejects_impossible_settings():
    with pytest.raises(DataError) as excinfo:
        clean_pairs(
            Corpus("train", ["a"], ["b"]), min_words=5, max_words=2, max_ratio=3.0, dedup=True
        )
    assert_one_line_error(excinfo, "min_words=5", "max_words=2")


# --- batching --------------------------------------------------------------------------------


def random_lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    src = [rng.randint(1, 40) for _ in range(n)]
    return src, [max(1, s + rng.randint(-5, 5)) for s in src]


def padded_cost(batch: list[int], src: list[int], tgt: list[int]) -> int:
    """Tokens of the padded tensors, counted the batcher's way (src + EOS, tgt + BOS + EOS)."""
    return len(batch) * max(max(src[i] + 1 for i in batch), max(tgt[i] + 2 for i in batch))


def test_batches_respect_the_budget_and_cover_every_example_once():
    src, tgt = random_lengths(1000, 0)
    batcher = TokenBatcher(src, tgt, max_tokens=300, seed=3)
    for epoch in range(3):
        batches = batcher.batches(epoch)
        assert len(batches) == len(batcher)
        assert sorted(i for b in batches for i in b) == list(range(1000))
        assert all(padded_cost(b, src, tgt) <= 300 for b in batches)
        # Bucketed: a batch holds similar source lengths.
        assert all(max(src[i] for i in b) - min(src[i] for i in b) <= 2 for b in batches)


def test_batches_are_deterministic_per_seed_and_epoch():
    src, tgt = random_lengths(500, 1)
    batcher = TokenBatcher(src, tgt, max_tokens=200, seed=5)
    assert batcher.batches(2) == batcher.batches(2)
    assert batcher.batches(2) == TokenBatcher(src, tgt, max_tokens=200, seed=5).batches(2)
    assert batcher.batches(2) != batcher.batches(3)
    assert batcher.batches(2) != TokenBatcher(src, tgt, max_tokens=200, seed=6).batches(2)
    # Equal lengths are shuffled within their bucket from epoch to epoch.
    same = TokenBatcher([4] * 100, [4] * 100, max_tokens=60, seed=0)
    assert same.batches(0) != same.batches(1)


def test_unshuffled_batches_follow_length_order():
    src, tgt = random_lengths(300, 2)
    batches = TokenBatcher(src, tgt, max_tokens=150, shuffle=False).batches(0)
    flat = [i for b in batches for i in b]
    assert flat == sorted(range(300), key=lambda i: (src[i], tgt[i], i))


def test_an_oversized_example_gets_its_own_batch(caplog):
    with caplog.at_level(logging.WARNING, logger="posenc.data.splits"):
        batcher = TokenBatcher([3, 3, 90, 3], [3, 3, 3, 3], max_tokens=20, shuffle=False)
    assert batcher.batches(0) == [[0, 1, 3], [2]]
    assert "1 examples alone exceed max_tokens=20" in caplog.text


def test_shards_are_disjoint_and_equal_in_size():
    src, tgt = random_lengths(700, 3)
    full = TokenBatcher(src, tgt, max_tokens=250, seed=1)
    shards = [
        TokenBatcher(src, tgt, max_tokens=250, seed=1, rank=r, world_size=3) for r in range(3)
    ]
    n = len(full) // 3
    for epoch in (0, 1):
        per_rank = [s.batches(epoch) for s in shards]
        assert [len(b) for b in per_rank] == [n, n, n] == [len(s) for s in shards]
        seen = [i for batches in per_rank for b in batches for i in b]
        assert len(seen) == len(set(seen))
        epoch_batches = full.batches(epoch)[: 3 * n]
        assert per_rank[1] == epoch_batches[1::3]


def test_batcher_rejects_bad_arguments():
    with pytest.raises(DataError) as excinfo:
        TokenBatcher([1, 2], [1], max_tokens=10)
    assert_one_line_error(excinfo, "2 source", "1 target")
    with pytest.raises(DataError) as excinfo:
        TokenBatcher([1, 2], [1, 2], max_tokens=10, rank=2, world_size=2)
    assert_one_line_error(excinfo, "rank=2", "world_size=2")
    with pytest.raises(DataError) as excinfo:
        TokenBatcher([1, 2], [1, 2], max_tokens=100, world_size=2)
    assert_one_line_error(excinfo, "1 batches", "2 ranks")


# --- padding ---------------------------------------------------------------------------------


def test_collate_adds_specials_and_pads():
    src, tgt_in, tgt_out = collate([[5, 6, 7], [8]], [[9], [10, 11]], pad_id=0, bos_id=1, eos_id=2)
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.long
    assert src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert tgt_in.tolist() == [[1, 9, 0], [1, 10, 11]]
    assert tgt_out.tolist() == [[9, 2, 0], [10, 11, 2]]
    src, tgt_in, tgt_out = collate([[4]], [[]], pad_id=0, bos_id=1, eos_id=2)
    assert (src.shape, tgt_in.tolist(), tgt_out.tolist()) == ((1, 2), [[1]], [[2]])


def greedy_cuts(need: list[int], max_tokens: int) -> list[tuple[int, int]]:
    """The batching rule written as the obvious loop: add examples while the padded size of the
    batch (its longest example times its size) fits; the first one always goes in."""
    cuts, start, longest = [], 0, 0
    for i, n in enumerate(need):
        grown = max(longest, n)
        if i > start and grown * (i - start + 1) > max_tokens:
            cuts.append((start, i))
            start, grown = i, n
        longest = grown
    return [*cuts, (start, len(need))]


@pytest.mark.parametrize("seed", range(20))
def test_batches_are_the_greedy_cuts_of_the_sorted_examples_without_per_example_objects(seed):
    rng = np.random.default_rng(seed)
    count, max_tokens = int(rng.integers(1, 400)), int(rng.integers(1, 300))
    src, tgt = rng.integers(0, 80, count), rng.integers(0, 80, count)
    batcher = TokenBatcher(src.astype(np.int32), tgt.astype(np.int32), max_tokens, shuffle=False)
    order = np.lexsort((tgt, src))
    need = np.maximum(src[order] + 1, tgt[order] + 2).tolist()
    expected = [order[a:b].tolist() for a, b in greedy_cuts(need, max_tokens)]
    batches = batcher.batches(0)
    assert batches == expected and list(batches) == expected
    assert batches[1:3] == expected[1:3] and batches[-1] == expected[-1]
    assert batcher.src.dtype == np.int32  # the prepared corpus's lengths are not copied
