"""Where one encoding's training step spends its time: :mod:`torch.profiler` over a few steps of
the benchmark's workload (its model, batch and precision, :mod:`.runner`), the operators that
take most of the device's time, and how busy the device was (its kernels' time over the steps'
wall time: far below 1 on a GPU means the step waits on Python and kernel launches, not on
arithmetic)."""

from __future__ import annotations

import time
from typing import Any

from torch.profiler import ProfilerActivity, profile

from posenc.analysis.bench.measure import synchronize
from posenc.analysis.bench.runner import BenchSettings, build_workload, training_batch


def profile_step(
    settings: BenchSettings,
    name: str,
    length: int,
    steps: int = 5,
    warmup: int = 3,
    rows: int = 25,
) -> dict[str, Any]:
    """Profile ``steps`` training steps of encoding ``name`` (built as the benchmark builds
    ``settings``' encodings) on batches of
    ``settings.tokens // length`` pairs of ``length`` tokens, after ``warmup`` steps.

    Returns ``{"encoding", "length", "batch", "step_s", "device_busy", "table"}``: the mean wall
    seconds of a profiled step (the profiler adds a little), the share of that time the device's
    kernels ran (the CPU's operators on the CPU), and the operator table, sorted by self time on
    the device, ``rows`` long.
    """
    work = build_workload(name, settings)
    batch = training_batch(max(1, settings.tokens // length), length, settings)
    for _ in range(warmup):
        work.train_step(batch)
    on_gpu = settings.torch_device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    synchronize()
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            work.train_step(batch)
        synchronize()
        wall = time.perf_counter() - start
    averages = profiler.key_averages()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    busy_us = sum(getattr(event, key) for event in averages)
    return {
        "encoding": name,
        "length": length,
        "batch": max(1, settings.tokens // length),
        "step_s": wall / steps,
        "device_busy": busy_us / 1e6 / wall,
        "table": averages.table(sort_by=key, row_limit=rows),
    }
