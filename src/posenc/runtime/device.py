"""The device a run uses, its precision, its seeds and the memory it holds."""

from __future__ import annotations

import random
import resource
import sys
from pathlib import Path

import numpy as np
import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; otherwise the named device (ValueError when
    the name is unknown or names CUDA on a machine without it)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={name!r} is unknown; use auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name} but this machine has no CUDA device; use device=auto")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA with ``auto``; ``fp32`` never; ``bf16`` always."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision != "auto":
        raise ValueError(f"trainer.precision={precision!r} is unknown; use auto, fp32 or bf16")
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (every job of a multirun calls this again)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def memory_mb(device: torch.device) -> float:
    """Memory in use now: the CUDA allocator's peak on a GPU, else this process's resident set
    (``/proc/self/statm``; the lifetime high-water mark where /proc does not exist)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * resource.getpagesize() / 2**20
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
