"""Specifications of the tokenizers: joint BPE (round trip, cache, save/load) and mBERT ids."""

from __future__ import annotations

import threading
import unicodedata
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import posenc.data.bpe as bpe_module
import posenc.data.tokenizer as tokenizer_module
from posenc.config import data as typed
from posenc.data.corpus import Corpus, DataError
from posenc.data.splits import load_corpora
from posenc.data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer, one_line
from posenc.data.toy import toy_word

ROOT = Path(__file__).resolve().parents[1]
MBERT_VOCAB = SHARED_DATA / "vocab" / "bert-base-multilingual-cased-vocab.txt"

FRENCH = [
    "Le garçon a mangé une pomme à la cantine.",
    "Ça va très bien, merci ! Et vous ?",
    "Où est la bibliothèque ? Elle est fermée.",
    "J'ai reçu une lettre de ma sœur aînée.",
    "L'été dernier, nous sommes allés à Noël… non, à Pâques.",
    "« C'est génial », a-t-il dit.",
]
ENGLISH = [
    "The boy ate an apple at the canteen.",
    "I'm fine, thanks! And you?",
    "Where is the library? It's closed.",
    "I received a letter from my elder sister.",
    "Last summer we went to Christmas... no, to Easter.",
    '"It\'s great," he said.',
]


def tokenizer_config(name: str, **overrides) -> dict:
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "tokenizer" / f"{name}.yaml"))
    cfg.update(overrides)
    return cfg


def training_corpus(repeats: int = 20) -> Corpus:
    return Corpus("train", FRENCH * repeats, ENGLISH * repeats)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Tokenizer:
    """A BPE with the full byte alphabet (vocab_size >= 1024), trained on a small corpus."""
    cache = tmp_path_factory.mktemp("cache")
    return build_tokenizer(
        typed.tokenizer_config(tokenizer_config("bpe", vocab_size=1100)), training_corpus(), cache
    )


def test_bpe_special_tokens_and_vocabulary(bpe):
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id, bpe.unk_id) == (0, 1, 2, 3)
    assert 260 < bpe.vocab_size <= 1100
    assert bpe.kind == "bpe" and bpe.name == "bpe"


@pytest.mark.parametrize("text", [*FRENCH, *ENGLISH, "Çà et là, élève, garçon, où ?", "中文 😀 ß"])
def test_bpe_round_trips_text_with_accents_and_punctuation(bpe, text):
    ids = bpe.encode(text)
    assert ids and bpe.unk_id not in ids and min(ids) > 3
    assert bpe.decode(ids) == text
    assert bpe.decode([bpe.bos_id, *ids, bpe.eos_id, bpe.pad_id]) == text


def test_bpe_learns_joint_subwords_and_batches_match_single_encoding(bpe):
    # Frequent words of both languages are single tokens; words look alike at the start and inside.
    assert len(bpe.encode("bibliothèque")) == 1 and len(bpe.encode("library")) == 1
    assert bpe.encode("Le garçon")[1:] == bpe.encode("garçon")
    texts = FRENCH + ENGLISH
    assert bpe.encode_batch(texts) == [bpe.encode(t) for t in texts]
    assert bpe.decode_batch(bpe.encode_batch(texts)) == texts


def test_special_token_strings_in_text_stay_text(bpe):
    ids = bpe.encode("a <s> b </s>")
    assert not {bpe.bos_id, bpe.eos_id} & set(ids)
    assert bpe.decode(ids) == "a <s> b </s>"


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=60))
def test_bpe_round_trips_any_unicode_text_up_to_nfc_on_one_line(bpe, text):
    ids = bpe.encode(text)
    assert all(0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == one_line(unicodedata.normalize("NFC", text))
    assert len(bpe.decode(ids).splitlines()) <= 1


def test_small_bpe_keeps_each_toy_symbol_one_token(tmp_path):
    # The smoke preset's settings on the toy data: below 1024 tokens the vocabulary starts from
    # the characters seen in training, so 64 tokens suffice for the 24 symbols.
    data = OmegaConf.load(ROOT / "configs" / "data" / "toy.yaml")
    train = load_corpora(typed.data_config(data))["train"]
    tok = build_tokenizer(
        typed.tokenizer_config(tokenizer_config("bpe", vocab_size=64, min_frequency=1)),
        train,
        tmp_path,
    )
    assert tok.vocab_size <= 64
    assert [len(tok.encode(toy_word(i))) for i in range(24)] == [1] * 24
    ids = tok.encode_batch(train.src[:50])
    assert [len(x) for x in ids] == [len(s.split()) for s in train.src[:50]]
    assert tok.decode(ids[0]) == train.src[0]


def test_bpe_cache_is_reused_not_retrained(tmp_path, monkeypatch):
    cfg = tokenizer_config("bpe", vocab_size=1100)
    first = build_tokenizer(typed.tokenizer_config(cfg), training_corpus(), tmp_path)
    stamp = first.path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached BPE should have been reused")

    monkeypatch.setattr(bpe_module, "_train_bpe", no_training)
    shuffled = Corpus("train", FRENCH[::-1] * 20, ENGLISH[::-1] * 20)  # same pairs, other order
    second = build_tokenizer(typed.tokenizer_config(cfg), shuffled, tmp_path)
    assert second.path == first.path and second.path.stat().st_mtime_ns == stamp
    assert second.encode(FRENCH[2]) == first.encode(FRENCH[2])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        first.path.name,
        first.path.name + ".lock",
    ]
    # Other settings or other data: another cache entry.
    with pytest.raises(AssertionError, match="reused"):
        build_tokenizer(
            typed.tokenizer_config(tokenizer_config("bpe", vocab_size=1200)),
            training_corpus(),
            tmp_path,
        )
    with pytest.raises(AssertionError, match="reused"):
        build_tokenizer(typed.tokenizer_config(cfg), training_corpus(repeats=21), tmp_path)


def test_concurrent_builds_train_once(tmp_path, monkeypatch):
    calls = []
    train = bpe_module._train_bpe

    def counted(*args, **kwargs):
        calls.append(1)
        return train(*args, **kwargs)

    monkeypatch.setattr(bpe_module, "_train_bpe", counted)
    cfg = tokenizer_config("bpe", vocab_size=1100)
    built: list[Tokenizer] = []
    threads = [
        threading.Thread(
            target=lambda: built.append(
                build_tokenizer(typed.tokenizer_config(cfg), training_corpus(), tmp_path)
            )
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 3 and len(calls) == 1
    assert len({tuple(t.encode(FRENCH[0])) for t in built}) == 1


def test_save_and_load_round_trip(bpe, tmp_path):
    bpe.save(tmp_path / "tok")
    again = load_tokenizer(tmp_path / "tok")
    assert type(again) is Tokenizer
    assert (again.pad_id, again.bos_id, again.eos_id, again.unk_id) == (0, 1, 2, 3)
    assert (again.vocab_size, again.name, again.kind) == (bpe.vocab_size, bpe.name, bpe.kind)
    for text in FRENCH + ENGLISH:
        assert again.encode(text) == bpe.encode(text)
        assert again.decode(again.encode(text)) == text
    assert again.encode("<s>") == bpe.encode("<s>")  # special strings still plain text


def test_load_from_a_directory_without_a_tokenizer_is_refused(tmp_path):
    with pytest.raises(DataError) as excinfo:
        load_tokenizer(tmp_path)
    assert "\n" not in str(excinfo.value) and str(tmp_path) in str(excinfo.value)


@pytest.mark.parametrize(
    ("cfg", "part"),
    [
        ({"kind": "sentencepiece"}, "'sentencepiece'"),
        ({"kind": "bpe", "vocab_size": 3}, "vocab_size=3"),
    ],
)
def test_bad_tokenizer_settings_give_one_line_errors(tmp_path, cfg, part):
    with pytest.raises(DataError) as excinfo:
        build_tokenizer(typed.tokenizer_config(cfg), training_corpus(), tmp_path)
    assert "\n" not in str(excinfo.value) and part in str(excinfo.value)


# --- mBERT -----------------------------------------------------------------------------------

needs_vocab = pytest.mark.skipif(
    not MBERT_VOCAB.is_file(), reason=f"the mBERT vocabulary {MBERT_VOCAB} is absent"
)


@pytest.fixture(scope="module")
def mbert() -> Tokenizer:
    """The full vocabulary, as before ``training_types_only`` (see test_vocab_reduction.py)."""
    cfg = tokenizer_config("mbert", vocab_file=str(MBERT_VOCAB), training_types_only=False)
    return build_tokenizer(typed.tokenizer_config(cfg), Corpus("train", [], []), Path("unused"))


@needs_vocab
def test_mbert_gives_the_known_ids(mbert):
    assert mbert.vocab_size == 119_547
    assert (mbert.pad_id, mbert.unk_id, mbert.bos_id, mbert.eos_id) == (0, 100, 101, 102)
    assert [mbert.bos_id, *mbert.encode("Hello world"), mbert.eos_id] == [101, 31178, 11356, 102]
    assert mbert.decode([101, 31178, 11356, 102, 0, 0]) == "Hello world"


@needs_vocab
def test_mbert_matches_transformers_bert_tokenizer(mbert):
    transformers = pytest.importorskip("transformers")
    reference = transformers.BertTokenizer(vocab=str(MBERT_VOCAB), do_lower_case=False)
    for text in [*FRENCH, *ENGLISH, "Aujourd’hui, 3,5 % des élèves — ça alors !"]:
        assert mbert.encode(text) == reference.encode(text, add_special_tokens=False)


@needs_vocab
def test_mbert_decoding_rejoins_what_13a_keeps_together(mbert):
    text = "L'homme est-il là ? It's 3.5 km, or 1,000 m."
    assert mbert.decode(mbert.encode(text)) == "L'homme est-il là? It's 3.5 km, or 1,000 m."
    rows = [mbert.encode(t) for t in (text, *FRENCH[:3])]
    assert mbert.decode_batch(rows) == [mbert.decode(row) for row in rows]  # evaluation's path


@needs_vocab
def test_mbert_save_and_load_round_trip(mbert, tmp_path):
    mbert.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert type(again) is type(mbert)
    assert again.encode(FRENCH[4]) == mbert.encode(FRENCH[4])
    assert again.decode(again.encode(FRENCH[3])) == mbert.decode(mbert.encode(FRENCH[3]))


def test_mbert_without_vocabulary_file_and_hub_says_what_to_set(tmp_path, monkeypatch):
    def offline(name):
        raise ConnectionError("offline mode is enabled")

    monkeypatch.setattr(tokenizer_module.HFTokenizer, "from_pretrained", offline)
    cfg = tokenizer_config("mbert", vocab_file=str(tmp_path / "missing.txt"))
    with pytest.raises(DataError) as excinfo:
        build_tokenizer(typed.tokenizer_config(cfg), Corpus("train", [], []), tmp_path)
    message = str(excinfo.value)
    assert "\n" not in message
    assert "missing.txt" in message and "unreachable" in message and "POSENC_DATA" in message


def test_a_decoded_sentence_is_one_line_whatever_bytes_the_model_emits(bpe):
    """An untrained byte-level model can emit line breaks; a hypotheses file keeps one line
    per sentence."""
    ids = bpe.encode("le chat\r\rdort\nici\u2028là")
    assert bpe.decode(ids) == "le chat  dort ici là"
    assert bpe.decode_batch([ids, bpe.encode("a\nb")]) == ["le chat  dort ici là", "a b"]
