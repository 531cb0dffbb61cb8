"""The local mix can be had anywhere: ``posenc-data fetch`` downloads the pinned originals, refuses
any that is not the pinned file, cleans them by the documented rules and checks every file it
makes, writing the mix whole or not at all. Served here by a local HTTP server as a mirror."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import ROOT, pythonpath

from posenc.data import fetch as fetch_module
from posenc.data.cleaning import RECIPES, lines_of
from posenc.data.fetch import MARKER, DataFetchError, fetch, is_complete, local_data_dir
from posenc.data.sources import ORIGINALS, PRODUCTS, Original, Product

SHARED = ROOT.parent / "shared"


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator:
    """``serve(folder)`` -> the base URL of an HTTP server on 127.0.0.1 rooted at ``folder``."""
    servers = []

    def start(folder: Path) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=folder))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def toy_manifest(tmp_path, monkeypatch) -> Path:
    """A manifest of two originals (a text with untidy whitespace, a zip) and the files they
    make, served from ``tmp_path / "raw"`` (returned)."""
    text = "Bonjour\u00a0 le monde \nDeux\r lignes\n".encode()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("fra-eng/fra.txt", "Hi.\tSalut.\tCC\nHi.\tSalut.\tCC\nRun!\tCours !\tCC\n")
    originals = {
        "owner/repo/abc123/text.fr": text,
        "owner/repo/abc123/fra-eng.zip": archive.getvalue(),
    }
    raw = tmp_path / "raw"
    for path, data in originals.items():
        (raw / path).parent.mkdir(parents=True, exist_ok=True)
        (raw / path).write_bytes(data)
    cleaned = b"Bonjour le monde\nDeux lignes\n"
    manifest = [Original(path, sha(data), len(data)) for path, data in originals.items()]
    products = [
        Product(
            "news/text.fr", "lines", ("owner/repo/abc123/text.fr",), sha(cleaned), len(cleaned)
        ),
        Product(
            "tatoeba/train.fr",
            "tatoeba_fr",
            ("owner/repo/abc123/fra-eng.zip",),
            sha(b"Salut.\nCours !\n"),
            len(b"Salut.\nCours !\n"),
        ),
    ]
    monkeypatch.setattr(fetch_module, "ORIGINALS", tuple(manifest))
    monkeypatch.setattr(fetch_module, "PRODUCTS", tuple(products))
    return raw


def test_the_manifest_makes_every_file_from_originals_or_files_made_before_it():
    known = {o.path for o in ORIGINALS}
    for product in PRODUCTS:
        assert product.recipe in RECIPES
        assert set(product.sources) <= known, product.path
        known.add(product.path)
    assert len({p.path for p in PRODUCTS}) == len(PRODUCTS) == 29


def test_lines_split_on_newline_alone_and_whitespace_runs_become_one_space():
    raw = "a\u2028b\r c\n\u00a0 d\u202f e \n".encode()
    assert lines_of(raw) == ["a\u2028b\r c", "\u00a0 d\u202f e "]
    assert RECIPES["lines"]([raw]) == b"a b c\nd e\n"


def test_training_pairs_drop_empty_sides_test_lines_repeats_and_the_excluded_stem():
    fr = b"Un.\n\nTest.\nUn.\nDeux.\nTrois.\n"
    en = b"One.\nEmpty.\nTest.\nOne.\nTwo.\nThree.\n"
    tests = (b"Test.\n", b"")
    assert RECIPES["pairs_fr"]([fr, en, *tests]) == b"Un.\nDeux.\nTrois.\n"
    assert RECIPES["pairs_en"]([fr, en, *tests]) == b"One.\nTwo.\nThree.\n"
    excluded = (b"Deux.\n", b"Two.\n")
    assert RECIPES["pairs_en"]([fr, en, *tests, *excluded]) == b"One.\nThree.\n"


def test_a_fetch_builds_the_mix_checks_it_and_marks_it(toy_manifest, tmp_path, serve):
    target = fetch(tmp_path / "cache" / "data", mirror=serve(toy_manifest))
    assert (target / "news" / "text.fr").read_bytes() == b"Bonjour le monde\nDeux lignes\n"
    assert (target / "tatoeba" / "train.fr").read_bytes() == b"Salut.\nCours !\n"
    assert (target / MARKER).is_file() and is_complete(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["data", "data-raw"]


@pytest.mark.parametrize(
    "served",
    [
        b"<!DOCTYPE html><html><body>404</body></html>",  # an error page
        b"Bonjour\xc2\xa0 le monde \n",  # a short read
        b"Bonjour le monde \nDeux\r lignes\n",  # the no-break space gone
    ],
)
def test_an_original_that_is_not_the_pinned_file_is_refused_and_nothing_written(
    toy_manifest, tmp_path, serve, served
):
    (toy_manifest / "owner/repo/abc123/text.fr").write_bytes(served)
    target = tmp_path / "cache" / "data"
    with pytest.raises(DataFetchError, match=r"owner/repo/abc123/text\.fr is not the pinned file"):
        fetch(target, mirror=serve(toy_manifest))
    assert not target.exists()
    assert not (target.parent / "data-raw" / "owner/repo/abc123/text.fr").exists()


def test_with_no_server_the_fetch_fails_at_once_in_one_line_writing_no_mix(toy_manifest, tmp_path):
    target = tmp_path / "cache" / "data"
    started = time.monotonic()
    with pytest.raises(DataFetchError) as refused:
        fetch(target, mirror="http://127.0.0.1:9/")  # the discard port: nothing listens
    assert time.monotonic() - started < 10
    message = str(refused.value)
    assert "\n" not in message and "POSENC_DATA" in message and str(target) in message
    assert message.startswith("cannot download http://127.0.0.1:9/owner/repo/abc123/text.fr")
    assert not target.exists()


def test_an_interrupted_fetch_downloads_again_only_what_is_missing_or_wrong(
    toy_manifest, tmp_path, serve
):
    raw = tmp_path / "cache" / "data-raw"
    (raw / "owner/repo/abc123").mkdir(parents=True)
    (raw / "owner/repo/abc123/text.fr").write_bytes(b"half a fi")  # cut off mid-download
    url = serve(toy_manifest)
    target = fetch(tmp_path / "cache" / "data", mirror=url)
    assert is_complete(target)
    shutil.rmtree(toy_manifest)  # the server is gone: the mix is there, nothing to download
    assert fetch(target, mirror=url) == target


def test_a_folder_that_is_not_a_fetched_mix_is_never_written_over(toy_manifest, tmp_path, serve):
    target = tmp_path / "mine"
    (target / "notes.txt").parent.mkdir()
    (target / "notes.txt").write_text("my own files")
    with pytest.raises(DataFetchError, match="is not a complete local mix that posenc fetched"):
        fetch(target, mirror=serve(toy_manifest))
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


@pytest.mark.skipif(not (SHARED / "data-raw").is_dir(), reason="needs the raw originals' copies")
def test_the_real_originals_make_the_curated_mix_byte_for_byte(tmp_path, serve):
    target = fetch(tmp_path / "data", mirror=serve(SHARED / "data-raw"))
    for product in PRODUCTS:
        made = (target / product.path).read_bytes()
        assert sha(made) == product.sha256, product.path
        if (SHARED / "data").is_dir():
            assert made == (SHARED / "data" / product.path).read_bytes(), product.path


def test_a_first_run_without_the_data_or_a_network_stops_in_one_line_leaving_no_run(tmp_path):
    """``python train.py`` with no ``POSENC_DATA``, no fetched mix and nothing to fetch from:
    one line naming the first original's URL, the folder the data would go to and the way out,
    status 1, no run folder, in seconds."""
    env = {
        **os.environ,
        "POSENC_CACHE": str(tmp_path / "cache"),
        "POSENC_DATA_MIRROR": "http://127.0.0.1:9/",
        "PYTHONPATH": pythonpath(),
    }
    env.pop("POSENC_DATA", None)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "pe=rope"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and time.monotonic() - started < 30
    output = done.stderr.splitlines() + done.stdout.splitlines()
    said = [line for line in output if "DataFetchError" in line]
    assert len(said) == 1 and "cannot download http://127.0.0.1:9/" in said[0], done.stderr[-2000:]
    assert str(tmp_path / "cache" / "data") in said[0] and "POSENC_DATA" in said[0]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "data-raw").is_dir(), reason="needs the raw originals' copies")
def test_a_first_run_fetches_the_mix_and_trains_and_scores_on_it(tmp_path, serve):
    env = {
        **os.environ,
        "POSENC_CACHE": str(tmp_path / "cache"),
        "POSENC_DATA_MIRROR": serve(SHARED / "data-raw"),
        "PYTHONPATH": pythonpath(),
    }
    env.pop("POSENC_DATA", None)
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "experiment=first",
            "trainer.max_steps=20",
            "trainer.valid_every=10",
            "eval.max_sentences=20",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert is_complete(tmp_path / "cache" / "data")
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert f"dir: {tmp_path / 'cache' / 'data'}" in config
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_a_script_reads_posenc_data_or_else_the_fetched_mix(
    toy_manifest, tmp_path, serve, monkeypatch
):
    """The scripts' default data folder (the benchmark's, the GPU bundle's) is no folder of the
    machine posenc was developed on: ``POSENC_DATA``, else the mix fetched into the cache."""
    monkeypatch.setenv("POSENC_DATA", str(tmp_path / "mine"))
    assert local_data_dir() == tmp_path / "mine"
    monkeypatch.delenv("POSENC_DATA")
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POSENC_DATA_MIRROR", serve(toy_manifest))
    assert local_data_dir() == tmp_path / "cache" / "data" and is_complete(local_data_dir())
