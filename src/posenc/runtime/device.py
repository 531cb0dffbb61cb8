"""The device a run uses, its precision, its seeds and the memory it holds."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import platform
import random
import resource
import sys
from pathlib import Path
from typing import Any

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


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else ``platform``'s guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: torch.device) -> dict[str, Any]:
    """``{"cpu", "cpu_capability", "gpu"}``: the hardware a run computed on. The same code and
    seed round differently on other processors (another CPU model or vector unit, another GPU),
    so runs compare bit for bit only on the same hardware; ``gpu`` is None off CUDA."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": gpu,
    }


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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def tune_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's thresholds (bytes): allocations above ``mmap_threshold`` get their own
    mapping, returned to the OS when freed; free heap memory above ``trim_threshold`` is given
    back. False where there is no glibc (nothing changes there)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
    )


def release_freed_memory(device: torch.device) -> float:
    """Collect Python's garbage and give glibc's free heap back to the system (what an earlier
    job of a reused sweep worker left), then :func:`memory_mb` now: the base a run's own memory
    is measured from. 0 on CUDA, whose allocator's peak is reset per run instead."""
    if device.type == "cuda":
        return 0.0
    gc.collect()
    with contextlib.suppress(OSError):  # no glibc: the base includes what the heap kept
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return memory_mb(device)


def keep_freed_memory() -> bool:
    """Serve large allocations from glibc's heap and keep what is freed there (1 GiB and 2 GiB
    thresholds).

    By default glibc maps every allocation above 32 MiB afresh and unmaps it when it is freed, so
    a training step's large temporaries (the logits of a 4,096-token batch over an 8,000-type
    vocabulary are 131 MB, with as much again for their log-softmax and gradient) are faulted in
    page by page at every step, a measurable share of a CPU training step. With this the process
    keeps its peak memory instead of returning it between steps."""
    return tune_malloc(1 << 30, 1 << 31)
