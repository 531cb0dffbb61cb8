"""Measuring on a noisy machine: a garbage-collection-free clock, the machine's facts, the
process's resident set and its peak (Linux), and random token ids."""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from posenc.runtime.device import tune_malloc


def random_tokens(shape: tuple[int, int], vocab_size: int, seed: int) -> torch.Tensor:
    """Token ids of ``shape`` drawn uniformly from the non-special ids ``3 .. vocab_size - 1``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, shape, generator=generator)


def synchronize() -> None:
    """Wait for the GPU's queued work, when this process has used CUDA (else nothing)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], None]) -> float:
    """Wall-clock seconds of ``fn()``, garbage collected before and paused during the call; on a
    GPU the clock runs from an idle device until ``fn``'s queued kernels have finished."""
    gc.collect()
    gc.disable()
    try:
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        return time.perf_counter() - start
    finally:
        gc.enable()


def machine_info(device: torch.device | None = None) -> dict[str, Any]:
    """CPU, GPU (``device``'s name when it is CUDA, else None), threads, versions and load:
    what the figures depend on."""
    on_gpu = device is not None and device.type == "cuda"
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(affinity) if affinity is not None else os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name(device) if on_gpu else None,
        "cuda": torch.version.cuda if on_gpu else None,
    }


def proc_status_kib(key: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``), or None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the process's peak resident set (Linux >= 4.0); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def map_large_allocations() -> bool:
    """Ask glibc to map every allocation above 64 KiB on its own and to return it when freed,
    and give back what its heap kept until now (the timing ran with
    :func:`~posenc.runtime.device.keep_freed_memory`), so that the resident set follows live
    memory. False when glibc is not there."""
    if not tune_malloc(64 * 1024, 64 * 1024):
        return False
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return True


def matmul_ceiling(
    size: int = 2048,
    repeats: int = 5,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> float:
    """FLOP/s of one ``(size, size) @ (size, size)`` matmul of random ``dtype`` values on
    ``device`` (default the CPU; median of ``repeats`` after a warm-up): the ceiling a training
    step's dense work can reach there (on the CPU, with this process's threads)."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device, dtype) for _ in range(2))
    a @ b
    seconds = statistics.median(timed(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / seconds


def counted_flops(fn: Callable[[], None]) -> int:
    """The floating-point operations of ``fn()`` (forward and backward) counted by
    :class:`torch.utils.flop_counter.FlopCounterMode`: matmuls, convolutions and attention."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())
