"""Specifications of ``tokenizer.training_types_only``: with ``tokenizer=mbert`` the
model gets only the special tokens and the WordPiece types that occur in the training split, as
compact ids; other types encode as ``[UNK]``; ``false`` keeps mBERT's own ids.

A tiny WordPiece vocabulary written by the tests stands in for mBERT's 119,547 types (its
special tokens deliberately not first, so their compact ids differ from their WordPiece ids);
one slow test measures the real vocabulary on the shared data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SHARED_DATA, compose
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import posenc.data.tokenizer as tokenizer_module
from posenc.config import data as typed
from posenc.data.corpus import Corpus, DataError
from posenc.data.splits import load_corpora
from posenc.data.tokenizer import (
    KEPT_FILE,
    MBERT_SPECIALS,
    WordPieceTokenizer,
    build_tokenizer,
    load_tokenizer,
)

ROOT = Path(__file__).resolve().parents[1]
MBERT_VOCAB = SHARED_DATA / "vocab" / "bert-base-multilingual-cased-vocab.txt"
LOCAL_MIX_TYPES = 26_327  # measured: specials + types of data=local's training split

VOCAB = [
    "[PAD]", "[unused1]", "the", "cat", "sat", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "dog",
    "ran", ".", "##s", "le", "chat", "chien", "'", "-", "l", "homme", "est", "il", "?", "a",
    "##t", "un", "3", "5", ",",
]  # fmt: skip
SOURCES = ["le chat est là .", "l'homme a un chat ?", "est-il 3.5 ?"]  # "là" has no spelling
TARGETS = ["the cat sat .", "the cats sat .", "a cat ran ."]
IN_TRAINING = ["the cat ran .", "l'homme est-il un chat ?", "the cats ran ? 3.5 ."]  # no new types
NOT_IN_TRAINING = ["dog", "chien", "##t"]  # in VOCAB, not in the training split


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def mbert_config(vocab_file: Path, **overrides) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "tokenizer" / "mbert.yaml"))
    cfg.update(vocab_file=str(vocab_file), **overrides)
    return cfg


def training_corpus() -> Corpus:
    return Corpus("train", list(SOURCES), list(TARGETS))


@pytest.fixture(scope="module")
def full(vocab_file) -> WordPieceTokenizer:
    """Today's tokenizer: every WordPiece id."""
    cfg = mbert_config(vocab_file, training_types_only=False)
    return build_tokenizer(typed.tokenizer_config(cfg), Corpus("train", [], []), Path("unused"))


@pytest.fixture(scope="module")
def compact(vocab_file, tmp_path_factory) -> WordPieceTokenizer:
    cache = tmp_path_factory.mktemp("cache")
    return build_tokenizer(
        typed.tokenizer_config(mbert_config(vocab_file)), training_corpus(), cache
    )


def training_types(full: WordPieceTokenizer) -> set[int]:
    """The WordPiece ids that occur in either side of the training split."""
    return {i for text in SOURCES + TARGETS for i in full.encode(text)}


def test_the_config_keeps_only_training_types_by_default():
    assert compose("tokenizer=mbert").tokenizer.training_types_only is True


def test_a_config_without_the_setting_keeps_the_full_vocabulary(vocab_file, full):
    # Runs from before the setting lack the key; they resume with ~tokenizer.training_types_only.
    cfg = mbert_config(vocab_file)
    del cfg["training_types_only"]
    old = build_tokenizer(typed.tokenizer_config(cfg), training_corpus(), Path("unused"))
    assert old.kept_ids is None and old.vocab_size == len(VOCAB)
    assert old.encode("the dog") == full.encode("the dog")


def test_off_gives_exactly_the_wordpiece_ids(full):
    assert full.kept_ids is None and full.vocab_size == len(VOCAB)
    roles = (full.pad_id, full.bos_id, full.eos_id, full.unk_id)
    assert roles == tuple(VOCAB.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]"))
    assert full.encode("the dog ran .") == [VOCAB.index(t) for t in ("the", "dog", "ran", ".")]
    assert full.encode("chats") == [VOCAB.index("chat"), VOCAB.index("##s")]


def test_compact_size_is_the_specials_plus_the_distinct_training_types(full, compact):
    specials = {full.pad_id, full.bos_id, full.eos_id, full.unk_id}
    kept = specials | training_types(full)
    assert full.unk_id in training_types(full)  # "là" has no WordPiece spelling
    assert compact.kept_ids == sorted(kept)  # deterministic: in WordPiece-id order
    assert compact.vocab_size == len(kept) < len(VOCAB)
    assert compact.full_vocab_size == len(VOCAB)
    assert VOCAB.index("[MASK]") not in compact.kept_ids  # posenc never uses it


def test_specials_keep_their_roles_in_the_compact_ids(full, compact):
    kept = compact.kept_ids
    for role in ("pad", "bos", "eos", "unk"):
        compact_id, wordpiece_id = getattr(compact, f"{role}_id"), getattr(full, f"{role}_id")
        assert kept[compact_id] == wordpiece_id
        assert VOCAB[wordpiece_id] == MBERT_SPECIALS[role]
    assert compact.pad_id == 0  # [PAD] is WordPiece id 0, the smallest kept id
    ids = compact.encode(IN_TRAINING[0])
    bracketed = [compact.bos_id, *ids, compact.eos_id, compact.pad_id, compact.pad_id]
    assert compact.decode(bracketed) == full.decode(full.encode(IN_TRAINING[0]))


@pytest.mark.parametrize("text", SOURCES + TARGETS + IN_TRAINING)
def test_training_types_round_trip_as_today(full, compact, text):
    ids = compact.encode(text)
    assert all(0 <= i < compact.vocab_size for i in ids)
    assert [compact.kept_ids[i] for i in ids] == full.encode(text)  # same WordPiece tokens
    assert compact.decode(ids) == full.decode(full.encode(text))


def test_batches_match_single_texts(full, compact):
    texts = SOURCES + TARGETS + IN_TRAINING + ["the dog sat ."]
    rows = compact.encode_batch(texts)
    assert rows == [compact.encode(t) for t in texts]
    assert compact.decode_batch(rows) == [compact.decode(row) for row in rows]  # evaluation
    assert compact.decode_batch(rows[:-1]) == full.decode_batch(full.encode_batch(texts[:-1]))


@pytest.mark.parametrize("token", NOT_IN_TRAINING)
def test_a_type_absent_from_training_encodes_as_unk(full, compact, token):
    wordpiece_id = VOCAB.index(token)
    assert wordpiece_id not in compact.kept_ids
    text = "chatt" if token == "##t" else f"the {token} sat"
    assert wordpiece_id in full.encode(text)
    expected = [
        compact.kept_ids.index(i) if i in compact.kept_ids else compact.unk_id
        for i in full.encode(text)
    ]
    assert compact.encode(text) == expected and compact.unk_id in expected


def test_unk_decodes_to_nothing_as_before(full, compact):
    # "dog" was a type of its own; compact, it is [UNK], which decoding skips like every special.
    assert full.decode(full.encode("the dog sat .")) == "the dog sat."
    assert compact.decode(compact.encode("the dog sat .")) == "the sat."


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=40))
def test_any_text_gets_ids_inside_the_compact_vocabulary(full, compact, text):
    ids = compact.encode(text)
    assert all(0 <= i < compact.vocab_size for i in ids)
    assert [compact.kept_ids[i] if i != compact.unk_id else full.unk_id for i in ids] == [
        i if i in compact.kept_ids else full.unk_id for i in full.encode(text)
    ]


def test_save_and_load_keep_the_mapping(full, compact, tmp_path):
    compact.save(tmp_path)
    meta = json.loads((tmp_path / tokenizer_module.META_FILE).read_text(encoding="utf-8"))
    assert meta["kept_ids_file"] == KEPT_FILE and meta["vocab_size"] == compact.vocab_size
    again = load_tokenizer(tmp_path)
    assert type(again) is WordPieceTokenizer
    assert again.kept_ids == compact.kept_ids and again.vocab_size == compact.vocab_size
    roles = ("pad_id", "bos_id", "eos_id", "unk_id")
    assert [getattr(again, r) for r in roles] == [getattr(compact, r) for r in roles]
    texts = IN_TRAINING + ["the dog sat ."]
    assert again.encode_batch(texts) == compact.encode_batch(texts)
    assert again.decode_batch(again.encode_batch(texts)) == compact.decode_batch(
        compact.encode_batch(texts)
    )
    # The full tokenizer saved over it leaves no stale mapping behind.
    full.save(tmp_path)
    assert not (tmp_path / KEPT_FILE).exists()
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.kept_ids is None and reloaded.vocab_size == len(VOCAB)
    assert reloaded.encode("the dog") == full.encode("the dog")


def test_load_without_the_mapping_file_is_refused(compact, tmp_path):
    compact.save(tmp_path)
    (tmp_path / KEPT_FILE).unlink()
    with pytest.raises(DataError) as excinfo:
        load_tokenizer(tmp_path)
    assert "\n" not in str(excinfo.value) and KEPT_FILE in str(excinfo.value)


def test_the_kept_types_are_cached_and_independent_of_pair_order(vocab_file, tmp_path, monkeypatch):
    cfg = mbert_config(vocab_file)
    first = build_tokenizer(typed.tokenizer_config(cfg), training_corpus(), tmp_path)
    assert first.path.parent == tmp_path and first.path.name.startswith("mbert-types-")
    stamp = first.path.stat().st_mtime_ns

    def no_counting(*args, **kwargs):
        raise AssertionError("the cached types should have been reused")

    monkeypatch.setattr(tokenizer_module, "_training_types", no_counting)
    shuffled = Corpus("train", SOURCES[::-1], TARGETS[::-1])
    second = build_tokenizer(typed.tokenizer_config(cfg), shuffled, tmp_path)
    assert second.path == first.path and second.path.stat().st_mtime_ns == stamp
    assert second.kept_ids == first.kept_ids
    with pytest.raises(AssertionError, match="reused"):  # other data: another cache entry
        build_tokenizer(
            typed.tokenizer_config(cfg), Corpus("train", SOURCES[:2], TARGETS[:2]), tmp_path
        )


@pytest.mark.parametrize(
    ("overrides", "train", "part"),
    [
        ({"training_types_only": "yes"}, training_corpus(), "'yes'"),
        ({}, Corpus("train", [], []), "training_types_only=false"),
    ],
)
def test_bad_settings_give_one_line_errors(vocab_file, tmp_path, overrides, train, part):
    with pytest.raises(DataError) as excinfo:
        build_tokenizer(
            typed.tokenizer_config(mbert_config(vocab_file, **overrides)), train, tmp_path
        )
    assert "\n" not in str(excinfo.value) and part in str(excinfo.value)


def test_a_corrupt_mapping_is_refused(full):
    backend = full.backend
    for kept in ([3, 2, 0, 5, 6, 7], [0, 5, 6], [0, 5, 6, 7, len(VOCAB)]):
        with pytest.raises(DataError, match="rebuild"):
            WordPieceTokenizer(backend, "mbert", "mbert", MBERT_SPECIALS, kept)


@pytest.mark.slow
@pytest.mark.skipif(
    not (MBERT_VOCAB.is_file() and (SHARED_DATA / "wmt14-fr-en").is_dir()),
    reason=f"the mBERT vocabulary or the local data under {SHARED_DATA} is absent",
)
def test_the_local_training_mix_keeps_a_fifth_of_mbert(tmp_path):
    cfg = compose(
        "tokenizer=mbert", f"data.dir={SHARED_DATA}", f"tokenizer.vocab_file={MBERT_VOCAB}"
    )
    train = load_corpora(typed.data_config(cfg.data))["train"]
    tok = build_tokenizer(typed.tokenizer_config(cfg.tokenizer), train, tmp_path)
    assert tok.full_vocab_size == 119_547
    assert tok.vocab_size == LOCAL_MIX_TYPES  # 22.0% of the 119,547
    assert tok.kept_ids[:4] == [0, 100, 101, 102]  # no [unused] type occurs: [PAD] [UNK] ...
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
