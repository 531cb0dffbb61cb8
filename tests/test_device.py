"""Runtime facts of the machine: glibc is told to keep a training step's large temporaries."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from posenc.runtime.device import keep_freed_memory, tune_malloc

GLIBC = sys.platform.startswith("linux") and ctypes.util.find_library("c") is not None


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt exists only on Linux")
def test_glibc_takes_the_thresholds_that_keep_freed_memory():
    assert keep_freed_memory()
    assert tune_malloc(64 * 1024, 64 * 1024)  # what the benchmark's memory probe sets
    assert keep_freed_memory()  # and back
