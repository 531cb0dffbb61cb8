"""How close a training step comes to this machine's limit: its FLOPs (forward and backward,
counted by :class:`torch.utils.flop_counter.FlopCounterMode`) over its median time, as a share of
the matmul ceiling the benchmark measures before anything else: on the CPU a 2048^3 fp32 matmul
with the same threads, on a GPU an 8192^3 matmul in the training step's precision (bf16), so the
share is the step's model-FLOP utilisation against the rate the device reached in the same run.
Targets: the reference encoding's step at least 60% of the CPU's ceiling, at least 35% of a
GPU's, at the lengths named here."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

from posenc.analysis.bench.measure import counted_flops

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

#: the reference encoding's training step must reach this share of the matmul ceiling, by
#: device type ...
CEILING_TARGET = {"cpu": 0.60, "cuda": 0.35}
#: ... at these lengths
CEILING_LENGTHS = (64, 128)


def step_efficiency(
    lengths: Iterable[int],
    batch_of: Callable[[int], Batch],
    train_steps: dict[str, Callable[[Batch], None]],
    summary: dict[str, Any],
    ceiling_flop_s: float,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{encoding: {length: {flops, flop_s, of_ceiling}}}`` of each timed training step
    (``train_steps[name](batch_of(length))``, timed before as ``summary['train']``)."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for length in lengths:
        batch = batch_of(length)
        for name, train_step in train_steps.items():
            figures = summary["train"].get(name, {}).get(str(length))
            if figures is None:
                continue
            flops = counted_flops(partial(train_step, batch))
            flop_s = flops / figures["median_s"]
            result.setdefault(name, {})[str(length)] = {
                "flops": flops,
                "flop_s": flop_s,
                "of_ceiling": flop_s / ceiling_flop_s,
            }
    return result


def ceiling_verdict(
    reference: str, efficiency: dict[str, Any], device_type: str = "cpu"
) -> dict[str, Any]:
    """The reference's share of the ceiling at :data:`CEILING_LENGTHS` and pass/miss against
    the ``device_type``'s :data:`CEILING_TARGET`."""
    shares = {
        length: efficiency.get(reference, {}).get(str(length), {}).get("of_ceiling")
        for length in CEILING_LENGTHS
    }
    measured = [share for share in shares.values() if share is not None]
    target = CEILING_TARGET[device_type]
    verdict = "-" if not measured else "pass" if min(measured) >= target else "miss"
    return {"target": target, "shares": shares, "verdict": verdict}


def efficiency_lines(result: dict[str, Any]) -> list[str]:
    """The markdown table of shares of the ceiling, or nothing when it was not measured."""
    section = result.get("efficiency")
    if not section:
        return []
    lengths = [str(length) for length in result["settings"]["lengths"]]
    verdict = section["verdict"]
    lines = [
        "",
        "## Training step against the machine's limit",
        "",
        f"{section.get('matmul_dtype', 'fp32')} matmul ceiling on {_where(result['machine'])}: "
        f"{section['ceiling_flop_s'] / 1e9:.1f} GFLOP/s before the timing, "
        f"{section['ceiling_end_flop_s'] / 1e9:.1f} after ({section['matmul_size']}^3 matmul). "
        "Each cell: GFLOP per step, GFLOP/s, share of the ceiling. Target: the reference "
        f"encoding at least {verdict['target']:.0%} at L={', L='.join(map(str, CEILING_LENGTHS))}"
        f" — {verdict['verdict']}.",
        "",
        "| pe | " + " | ".join(f"L={length}" for length in lengths) + " |",
        "|" + "---|" * (len(lengths) + 1),
    ]
    for name, per_length in section["train"].items():
        cells = []
        for length in lengths:
            figures = per_length.get(length)
            cells.append(
                "-"
                if figures is None
                else f"{figures['flops'] / 1e9:.1f} / {figures['flop_s'] / 1e9:.1f} / "
                f"{figures['of_ceiling']:.0%}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _where(machine: dict[str, Any]) -> str:
    """``the GPU NAME`` or ``the CPU``."""
    return f"the GPU {machine['gpu']}" if machine.get("gpu") else "the CPU"
