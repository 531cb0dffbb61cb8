"""Preparing a corpus streams: the store holds exactly the pairs, order and tokenizer that the
in-memory loader gives for the same settings, reads the WMT14 release layout (plain or gzip),
keeps nothing from a preparation that did not finish, and a run on a prepared corpus reads no
training text."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, compose, pythonpath, sentences

import posenc.data.prepare as prepare_module
import posenc.data.streams as streams
from posenc.config import data as typed
from posenc.config.settings import Settings
from posenc.data.corpus import DataError
from posenc.data.prepare import run_store
from posenc.data.splits import load_corpora
from posenc.data.store import open_store, prepared, store_key
from posenc.data.tokenizer import build_tokenizer, load_tokenizer
from posenc.job import run
from posenc.training.inputs import encode_pairs

#: stems of the WMT14 fr-en training release (configs/data/wmt14_files.yaml), written gzip
#: where the release ships them so
RELEASE = {
    "training/europarl-v7.fr-en": False,
    "commoncrawl.fr-en": False,
    "un/undoc.2000.fr-en": False,
    "training/news-commentary-v9.fr-en": False,
    "giga-fren.release2.fixed": True,
}


def prepared_store(cfg) -> Path:
    """The store of a composed config's data and tokenizer, prepared as a run prepares it."""
    return run_store(Settings.of(cfg))


def write(directory: Path, stem: str, src: list[str], tgt: list[str], compressed: bool) -> None:
    for lang, lines in (("fr", src), ("en", tgt)):
        path = directory / f"{stem}.{lang}"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(f"{line}\n" for line in lines).encode("utf-8")
        if compressed:
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A miniature WMT14 release: every corpus's files, with repeats, empty lines and pairs the
    length and ratio filters drop."""
    for n, (stem, compressed) in enumerate(RELEASE.items()):
        src, tgt = sentences(40, 10 * n), sentences(40, 10 * n + 1)
        src[3], tgt[5] = "", "   "  # empty sides
        src[7] = " ".join(["long"] * 90)  # over max_words
        tgt[9] = "one"  # ratio 5:1
        src[11:13], tgt[11:13] = src[1:3], tgt[1:3]  # repeats of earlier pairs
        write(tmp_path, stem, src, tgt, compressed)
    write(tmp_path, "dev/newstest2013", sentences(12, 98), sentences(12, 99), False)
    write(tmp_path, "newstest2014", sentences(12, 96), sentences(12, 97), False)
    return tmp_path


def release_config(directory: Path, *overrides: str):
    return compose(*SMOKE, "data=wmt14_files", f"data.dir={directory}", *overrides)


def rows(column) -> list[list[int]]:
    return [column[i] for i in range(len(column))]


@pytest.mark.parametrize("overrides", [(), ("data.train_size=50", "data.seed=7")])
def test_the_store_holds_what_the_in_memory_loader_gives(release, tmp_path, overrides):
    cfg = release_config(release, *overrides)
    directory = prepared_store(cfg)
    store, tokenizer = open_store(directory), load_tokenizer(directory / "tokenizer")
    train = load_corpora(typed.data_config(cfg.data))["train"]
    src, tgt, _ = encode_pairs(tokenizer, train)
    assert rows(store.src) == src and rows(store.tgt) == tgt
    assert len(store) == len(train) == (50 if overrides else 5 * (40 - 6))
    expected = build_tokenizer(typed.tokenizer_config(cfg.tokenizer), train, tmp_path / "bpe")
    assert tokenizer.backend.to_str() == expected.backend.to_str()
    meta = json.loads((directory / "meta.json").read_text())
    assert (meta["pairs_read"], meta["pairs_kept"]) == (200, 170)


def test_chunks_tokenised_by_worker_processes_are_written_in_order(release, monkeypatch):
    monkeypatch.setattr(prepare_module, "CHUNK_PAIRS", 7)  # 170 pairs: 25 chunks, two workers
    cfg = release_config(release)
    directory = prepared_store(cfg)
    store, tokenizer = open_store(directory), load_tokenizer(directory / "tokenizer")
    src, tgt, _ = encode_pairs(tokenizer, load_corpora(typed.data_config(cfg.data))["train"])
    assert rows(store.src) == src and rows(store.tgt) == tgt


def test_local_data_with_held_out_sets_prepares_the_same_pairs(local_dir):
    holdout = ("~data.holdout", "+data.holdout={news:{stem:corpus/train,size:5}}")
    cfg = compose(
        *SMOKE,
        "data=local",
        f"data.dir={local_dir}",
        "data.train=[corpus/train,corpus/news]",
        "data.valid=dev",
        "data.test=test",
        *holdout,
    )
    store = open_store(prepared_store(cfg))
    tokenizer = load_tokenizer(
        prepared(cfg.cache_dir, store_key(cfg.data, cfg.tokenizer)) / "tokenizer"
    )
    src, _, _ = encode_pairs(tokenizer, load_corpora(typed.data_config(cfg.data))["train"])
    assert rows(store.src) == src and len(src) == 70 - 5


def test_compressed_and_plain_files_read_alike(tmp_path):
    lines = ["\ufeffune\tphrase", "", "deux  x\x00", "trois"]
    write(tmp_path, "plain", lines, lines, False)
    write(tmp_path, "packed", lines, lines, True)
    plain = list(streams.pairs(tmp_path, "plain", "fr", "en"))
    assert plain == list(streams.pairs(tmp_path, "packed", "fr", "en"))
    assert [s for s, _ in plain] == ["une phrase", "", "deux x", "trois"]
    (tmp_path / "broken.fr.gz").write_bytes(b"not gzip")
    (tmp_path / "broken.en").write_text("x\n")
    with pytest.raises(DataError, match="cannot read .*broken.fr.gz.*download it again"):
        list(streams.pairs(tmp_path, "broken", "fr", "en"))


def test_a_killed_preparation_leaves_nothing_a_later_run_trusts(release, monkeypatch):
    cfg = release_config(release)
    directory = prepared(cfg.cache_dir, store_key(cfg.data, cfg.tokenizer))

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "_write_ids", killed)
    with pytest.raises(KeyboardInterrupt):
        prepared_store(cfg)
    assert not directory.exists()
    left = [p.name for p in directory.parent.iterdir() if p.name.startswith(f".{directory.name}")]
    assert left == []  # neither the spool nor a half-written store
    monkeypatch.undo()
    assert len(open_store(prepared_store(cfg))) == 170


def test_what_a_hard_killed_preparation_left_is_removed_by_the_next(release):
    """SIGKILL runs no cleanup: its spool and half-written store stay on disk (gigabytes at
    WMT14's size) until the next preparation of the same store, which removes them."""
    cfg = release_config(release)
    directory = prepared(cfg.cache_dir, store_key(cfg.data, cfg.tokenizer))
    for leftover in (f".{directory.name}.spool.x1", f".{directory.name}.x2"):
        (directory.parent / leftover).mkdir(parents=True)
        (directory.parent / leftover / "spool.src").write_text("half\n")
    assert len(open_store(prepared_store(cfg))) == 170
    assert [p.name for p in directory.parent.iterdir() if p.name.startswith(".")] == []


def test_bpe_learns_from_the_first_train_sentences_pairs_only(release, tmp_path):
    cfg = release_config(release, "+tokenizer.train_sentences=20", "tokenizer.vocab_size=300")
    sampled = load_tokenizer(prepared_store(cfg) / "tokenizer")
    train = load_corpora(typed.data_config(cfg.data))["train"]
    first = train.subset(range(20))
    cfg_all = release_config(release, "tokenizer.vocab_size=300")
    expected = build_tokenizer(typed.tokenizer_config(cfg_all.tokenizer), first, tmp_path / "bpe")
    assert sampled.backend.to_str() == expected.backend.to_str()
    for bad in ("0", "true", "1.5"):
        with pytest.raises(
            DataError, match=r"tokenizer.train_sentences=.* must be an integer >= 1 or null"
        ):
            prepared_store(release_config(release, f"+tokenizer.train_sentences={bad}"))


def test_a_run_on_a_prepared_corpus_reads_no_training_text(release, tmp_path, monkeypatch):
    cfg = release_config(release, "trainer.max_steps=2", "eval.enabled=false")
    prepared_store(cfg)
    real = streams.lines

    def held_out_only(path: Path):
        assert "newstest" in path.name, f"training text read: {path}"
        return real(path)

    monkeypatch.setattr(streams, "lines", held_out_only)
    run(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["steps"] == 2 and summary["train_pairs"] > 0


def test_the_command_prepares_ahead_of_a_sweep_with_train_py_overrides(release, tmp_path):
    command = [sys.executable, "-m", "posenc.data.prepare", *SMOKE, "data=wmt14_files"]
    env = {"POSENC_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PATH": ""}
    env["PYTHONPATH"] = pythonpath()
    done = subprocess.run(
        [*command, f"data.dir={release}"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "170 training pairs" in done.stdout
    missing = subprocess.run(
        [*command, f"data.dir={tmp_path / 'nowhere'}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1].startswith("posenc.data.prepare: DataError: ")


def test_the_corpus_benchmark_makes_distinct_pairs_and_sees_a_process_peak_memory(tmp_path):
    from posenc.analysis.bench.corpus import HELD_OUT_STEMS, SOURCE_STEMS, measure, synthetic_corpus

    data = tmp_path / "data"
    for n, stem in enumerate([*SOURCE_STEMS, *HELD_OUT_STEMS.values()]):
        write(data, stem, sentences(4, n), sentences(4, n + 50), False)
    stem = synthetic_corpus(data, tmp_path / "out", 20)
    both = list(streams.pairs(tmp_path / "out", stem, "fr", "en"))
    assert len(both) == len(set(both)) == 20
    assert both[8] == (f"{both[0][0]} (1)", f"{both[0][1]} (1)")
    grow = "import time; x = bytearray(300_000_000); x[::4096] = b'1' * 73243; time.sleep(0.5)"
    usage = measure([sys.executable, "-c", grow], {})
    assert usage.returncode == 0 and 280 < usage.peak_rss_mb < 600
    # a command that writes more to standard error than a pipe holds (a long preparation's
    # progress bar) still ends: nothing waits for the benchmark to read it
    noisy = "import sys; [sys.stderr.write('x' * 1000 + '\\n') for _ in range(1000)]"
    assert measure([sys.executable, "-c", noisy], {}).returncode == 0


def test_the_toy_task_prepares_the_pairs_the_loader_gives(tmp_path):
    cfg = compose(*SMOKE)
    directory = prepared_store(cfg)
    src, tgt, _ = encode_pairs(
        load_tokenizer(directory / "tokenizer"), load_corpora(typed.data_config(cfg.data))["train"]
    )
    store = open_store(directory)
    assert rows(store.src) == src and rows(store.tgt) == tgt


def test_the_worker_pool_ends_under_trainings_stop_handler():
    """Training prepares its corpus with its SIGINT/SIGTERM handler installed (a signal only
    asks to stop after the step). Forked workers must not keep it: a pool that ends early (the
    writer failed) stops its busy workers with SIGTERM, which such a handler would swallow, and
    the run would wait for them forever."""
    code = (
        "import time\n"
        "from posenc.data.prepare import _workers\n"
        "from posenc.training.interrupt import StopRequests\n"
        "def slow(x):\n"
        "    time.sleep(0.5)\n"
        "    return x\n"
        "with StopRequests().installed():\n"
        "    try:\n"
        "        with _workers(2) as pool:\n"
        "            for _ in pool.imap(slow, range(10)):\n"
        "                raise RuntimeError('the writer failed')\n"
        "    except RuntimeError:\n"
        "        print('ended')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert done.stdout == b"ended\n", done.stderr.decode()[-500:]
