"""A run's own memory: what the run itself held, not what an earlier job of the same process
(a reused sweep worker) left in it."""

from __future__ import annotations

import ctypes.util
import json
import sys

import pytest
import torch
from conftest import SMOKE, compose

from posenc.job import run
from posenc.runtime.device import keep_freed_memory

GLIBC = sys.platform.startswith("linux") and ctypes.util.find_library("c") is not None
LEFT_MB = 400  #: what the "earlier job" allocates and frees


def summary(run_dir) -> dict:
    return json.loads((run_dir / "train_summary.json").read_text())


@pytest.mark.skipif(not GLIBC, reason="the resident set and glibc's heap are Linux's")
def test_memory_an_earlier_job_freed_is_not_the_next_runs_own(tmp_path):
    run(compose(*SMOKE), tmp_path / "first")
    keep_freed_memory()  # as training sets it: glibc keeps what is freed
    left = torch.ones(LEFT_MB * 2**20 // 4)  # an earlier job's large tensors, touched and freed
    del left
    run(compose(*SMOKE), tmp_path / "second")
    first, second = summary(tmp_path / "first"), summary(tmp_path / "second")
    assert 0 < second["own_memory_mb"] < LEFT_MB / 2
    assert abs(second["own_memory_mb"] - first["own_memory_mb"]) < LEFT_MB / 4
    assert second["peak_memory_mb"] >= second["own_memory_mb"]
