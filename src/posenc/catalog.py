"""Models built by name from ``configs/``: the tools (benchmark, plots) use every encoding that
has a ``configs/pe/*.yaml``, so a new encoding appears in them without code changes."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from posenc.model import Seq2Seq
from posenc.train import build_model

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def encoding_names(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Names of every ``configs/pe/*.yaml``, ``nonepe`` first, then alphabetical."""
    names = sorted(p.stem for p in (config_dir / "pe").glob("*.yaml"))
    return sorted(names, key=lambda name: name != "nonepe")


def select_encodings(spec: str | None, config_dir: Path = CONFIG_DIR) -> list[str]:
    """The names in a comma-separated ``spec`` (all encodings when None, empty or ``all``).

    Raises:
        ValueError: a name has no ``configs/pe/NAME.yaml``.
    """
    available = encoding_names(config_dir)
    if not spec or spec == "all":
        return available
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"unknown encoding(s) {unknown}; configs/pe has {available}")
    return list(dict.fromkeys(names))


def model_config(pe: str, model: str = "small", config_dir: Path = CONFIG_DIR) -> DictConfig:
    """``{model: configs/model/MODEL.yaml, pe: configs/pe/PE.yaml}`` as one OmegaConf node."""
    path = config_dir / "model" / f"{model}.yaml"
    if not path.exists():
        raise ValueError(f"no model config {path}")
    return OmegaConf.create(
        {"model": OmegaConf.load(path), "pe": OmegaConf.load(config_dir / "pe" / f"{pe}.yaml")}
    )


def build_named_model(
    pe: str, model: str = "small", vocab_size: int = 8000, seed: int = 0
) -> Seq2Seq:
    """The Seq2Seq of ``configs/model/MODEL.yaml`` with encoding ``PE``, initialised from
    ``seed`` (pad 0, bos 1, eos 2), through the training code's own ``build_model``."""
    torch.manual_seed(seed)
    return build_model(model_config(pe, model), vocab_size, PAD_ID, BOS_ID, EOS_ID)
