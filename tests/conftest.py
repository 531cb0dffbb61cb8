"""Shared fixtures: tiny models built from the real ``configs/pe/*.yaml`` files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from posenc.config import ModelConfig
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


SMOKE = ("experiment=smoke", "eval.max_sentences=12", "trainer.progress=false")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Tokenizers trained by tests go to one temporary cache; the hub is never contacted."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
