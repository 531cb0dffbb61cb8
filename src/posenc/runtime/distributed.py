"""Data-parallel training on PyTorch's own engine: ``torchrun --nproc_per_node=N train.py ...``.

torchrun starts N copies of the program and tells each its place through environment variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). :func:`setup`
joins them into one process group (NCCL on GPUs, gloo on CPUs); the training loop wraps the
model in ``DistributedDataParallel``. Rank 0 is the *main* process: it alone writes logs,
checkpoints, metrics and the run's tokenizer, and runs validation and evaluation; the others
train on their own share of the batches and wait for it where needed.

Under torchrun a group is set up whatever the number of processes, one included (as Hugging
Face's Trainer does): ``torchrun --nproc_per_node=1`` trains through NCCL (or gloo) and
``DistributedDataParallel``, the path a multi-GPU run takes, on one device. Without torchrun
every function here is a cheap no-op, so the same code trains on one process.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger("posenc.runtime.distributed")

TIMEOUT = timedelta(minutes=30)  # the longest rank 0 may keep the others waiting (validation)
_owned = False  # whether setup() created the group


def launched() -> bool:
    """Whether torchrun started this process (it sets ``TORCHELASTIC_RUN_ID``), or another
    launcher started several (``WORLD_SIZE`` > 1)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_distributed() -> bool:
    """Whether a process group is up (see :func:`setup`)."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank in the group; 0 without one."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """How many processes train together; 1 without a group."""
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Whether this process writes files and evaluates (rank 0, or the only process)."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank arrives here (no-op without a group)."""
    if is_distributed():
        dist.barrier()


def setup(device: torch.device) -> bool:
    """Join torchrun's process group if launched by torchrun and no group is up yet.

    Uses NCCL when ``device`` is CUDA (each rank then takes GPU ``LOCAL_RANK``), gloo otherwise.
    Ranks other than 0 log warnings and errors only, so the run's log is rank 0's. Returns
    whether this call created the group.
    """
    global _owned
    if is_distributed() or not launched():
        return False
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; run on one process")
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    _owned = True
    if not is_main():
        logging.getLogger().setLevel(logging.WARNING)
    log.info("process group up: %d ranks (%s)", world_size(), dist.get_backend())
    return True


def teardown(wait: bool = True) -> None:
    """Leave the process group that :func:`setup` created (no-op otherwise), all ranks together
    when ``wait`` (gloo's threads of a rank that leaves while another still talks to it can
    abort the process at exit: "terminate called without an active exception"); a rank that
    failed passes ``wait=False`` and leaves at once."""
    global _owned
    if _owned and is_distributed():
        if wait:
            try:
                dist.barrier()
            except RuntimeError as err:  # a rank is gone: leave without it
                log.warning("leaving the process group without the other ranks: %s", err)
        dist.destroy_process_group()
    _owned = False


def local_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` for CUDA under a group, else ``device``."""
    if device.type == "cuda" and is_distributed():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """``values`` summed (``op="sum"``) or maximised (``op="max"``) over the ranks, element by
    element, in float64; returned unchanged without a group."""
    if not is_distributed():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()
