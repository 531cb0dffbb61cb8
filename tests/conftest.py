"""Shared fixtures: tiny models built from the real ``configs/pe/*.yaml`` files, and small
aligned text files for the data tests."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from posenc.analysis.report.runs import Entry, Run
from posenc.config import ModelConfig
from posenc.data.corpus import Corpus
from posenc.data.streams import Cleaner
from posenc.evaluation.metrics import corpus_scores
from posenc.model.encodings import encoding_factory
from posenc.model.seq2seq import Seq2Seq

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("POSENC_DATA", ROOT.parent / "shared" / "data"))
"""The shared offline data beside the checkout (as CI places it), or ``POSENC_DATA``."""
PE_NAMES = sorted(p.stem for p in (ROOT / "configs" / "pe").glob("*.yaml"))


def pe_config(name: str, **overrides) -> dict:
    """The ``configs/pe/NAME.yaml`` node as a dict, with overrides."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "pe" / f"{name}.yaml"))
    cfg.update(overrides)
    return cfg


def tiny_model(
    name: str,
    vocab: int = 40,
    d_model: int = 32,
    n_heads: int = 4,
    layers: int = 2,
    seed: int = 0,
    **pe_overrides,
) -> Seq2Seq:
    """A small Seq2Seq (pad 0, bos 1, eos 2) with encoding ``name``, dropout off."""
    torch.manual_seed(seed)
    config = ModelConfig(
        d_model=d_model,
        n_heads=n_heads,
        d_ff=2 * d_model,
        dropout=0.0,
        encoder_layers=layers,
        decoder_layers=layers,
    )
    factory = encoding_factory(pe_config(name, **pe_overrides))
    return Seq2Seq(vocab, 0, 1, 2, config, factory)


# Tiny test models only lose from thread contention on small machines.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _deterministic():
    """Every test starts from seed 0 on one thread (a test that sets threads, e.g. through the
    benchmark's ``--threads``, gets one thread back after it)."""
    torch.manual_seed(0)
    yield
    torch.set_num_threads(1)


def compose(*overrides: str):
    """The real ``configs/train.yaml`` composed with ``overrides`` (no Hydra job started)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import posenc.job  # noqa: F401  (registers the config resolvers)

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def pythonpath() -> str:
    """``PYTHONPATH`` for a child Python: src/ first, then this process's own entries (where
    posenc is not installed, as on the GPU machine, its packages come from there)."""
    return os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))


SMOKE = ("experiment=smoke", "eval.max_sentences=12", "trainer.progress=false")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tokenizers trained by tests go to one temporary cache; the hub is never contacted."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if "POSENC_DATA" not in os.environ and SHARED_DATA.is_dir():  # else fetched (a mirror)
        monkeypatch.setenv("POSENC_DATA", str(SHARED_DATA))


def write_pair(directory: Path, stem: str, src: list[str], tgt: list[str]) -> None:
    path = directory / stem
    path.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{path}.fr").write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    Path(f"{path}.en").write_text("".join(f"{t}\n" for t in tgt), encoding="utf-8")


def sentences(n: int, seed: int, words: int = 5) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"m{rng.randrange(500)}" for _ in range(words)) for _ in range(n)]


@pytest.fixture
def local_dir(tmp_path: Path) -> Path:
    """Small aligned files: train (two stems), valid and test with one empty line each."""
    write_pair(tmp_path, "corpus/train", sentences(60, 1), sentences(60, 2))
    write_pair(tmp_path, "corpus/news", sentences(10, 3), sentences(10, 4))
    valid_src, valid_tgt = sentences(30, 5), sentences(30, 6)
    valid_tgt[7] = ""
    write_pair(tmp_path, "dev", valid_src, valid_tgt)
    test_src, test_tgt = sentences(20, 7), sentences(20, 8)
    test_src[3] = "   "
    write_pair(tmp_path, "test", test_src, test_tgt)
    return tmp_path


def torchrun(run_dir: Path, *overrides: str, procs: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node=procs train.py OVERRIDES`` into ``run_dir``."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={procs}",
            str(ROOT / "train.py"),
            *overrides,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=run_dir.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )


def run_script(name: str, *args: object) -> subprocess.CompletedProcess:
    """``python scripts/NAME.py ARGS``, its output captured as text, its status not checked."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


def run_study(command: str, *args: object) -> subprocess.CompletedProcess:
    """``python -m study COMMAND ARGS`` from the repository's root, its output captured as text,
    its status not checked."""
    return subprocess.run(
        [sys.executable, "-m", "study", command, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )


#: the references of :func:`scored_entry`'s runs
SCORED_REFERENCES = [f"the cat number {i} sat on the mat near door {i % 7}" for i in range(40)]


def scored_entry(
    tmp_path: Path, system: str, seed: int, garbage_every: int, garbage="x y z"
) -> Entry:
    """A finished run of ``system`` whose hypotheses equal the references but every
    ``garbage_every``-th one (0: none; 1: all), which is ``garbage``."""
    folder = tmp_path / f"{system}-{seed}"
    folder.mkdir()
    hyps = [
        garbage if garbage_every and i % garbage_every == seed % garbage_every else ref
        for i, ref in enumerate(SCORED_REFERENCES)
    ]
    (folder / "hyp.txt").write_text("\n".join(hyps) + "\n")
    (folder / "ref.txt").write_text("\n".join(SCORED_REFERENCES) + "\n")
    run = Run(folder.name, folder, {"pe.name": system, "seed": seed})
    return Entry(
        system, run, corpus_scores(hyps, SCORED_REFERENCES), folder / "hyp.txt", folder / "ref.txt"
    )


def clean_pairs(
    corpus: Corpus, min_words: int, max_words: int, max_ratio: float, dedup: bool
) -> tuple[Corpus, dict[str, int]]:
    """A corpus filtered as training's stream filters it (:class:`~posenc.data.streams.Cleaner`,
    its filters, then its duplicates).

    Returns the kept pairs (original order) and ``{'input', 'empty', 'length', 'ratio',
    'duplicate', 'kept'}`` counts.
    """
    cleaner = Cleaner(min_words, max_words, max_ratio, dedup)
    passed = [
        i for i, pair in enumerate(zip(corpus.src, corpus.tgt, strict=True)) if cleaner.keeps(*pair)
    ]
    return corpus.subset([passed[i] for i in cleaner.distinct()]), cleaner.stats
