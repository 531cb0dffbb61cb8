"""The benchmark's measure of how close a training step comes to the machine's limit: FLOPs
counted by torch's counter over forward and backward, against a matmul ceiling."""

from __future__ import annotations

import pytest
import torch

from posenc.analysis.bench.efficiency import (
    CEILING_TARGET,
    ceiling_verdict,
    efficiency_lines,
    step_efficiency,
)
from posenc.analysis.bench.measure import counted_flops, matmul_ceiling


def test_flops_of_a_linear_layer_forward_and_backward_are_three_matmuls():
    layer = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(8, 32, requires_grad=True)
    flops = counted_flops(lambda: layer(x).sum().backward())
    assert flops == 3 * 2 * 8 * 32 * 16  # y = xW, dx = dy W^T, dW = x^T dy


def test_the_matmul_ceiling_is_a_positive_speed():
    assert matmul_ceiling(size=64, repeats=2) > 0


def test_step_efficiency_is_counted_flops_over_the_median_time_as_a_share_of_the_ceiling():
    layer = torch.nn.Linear(4, 4, bias=False)

    def step(batch):
        layer(batch[0]).sum().backward()

    batch = (torch.randn(2, 4), None, None)
    summary = {"train": {"a": {"4": {"median_s": 0.5}}}}
    result = step_efficiency([4], lambda length: batch, {"a": step}, summary, ceiling_flop_s=128.0)
    flops = 2 * 2 * 2 * 4 * 4  # forward and the weight gradient (the input needs none)
    assert result == {"a": {"4": {"flops": flops, "flop_s": 2 * flops, "of_ceiling": 2}}}


@pytest.mark.parametrize(
    ("device", "shares", "verdict"),
    [
        ("cpu", (0.7, 0.65), "pass"),
        ("cpu", (0.7, 0.5), "miss"),
        ("cuda", (0.4, 0.36), "pass"),  # a GPU's target: its model-FLOP utilisation
        ("cuda", (0.4, 0.3), "miss"),
    ],
)
def test_the_reference_must_reach_its_devices_target_share_at_both_lengths(device, shares, verdict):
    efficiency = {"ref": {"64": {"of_ceiling": shares[0]}, "128": {"of_ceiling": shares[1]}}}
    assert ceiling_verdict("ref", efficiency, device) == {
        "target": CEILING_TARGET[device],
        "shares": {64: shares[0], 128: shares[1]},
        "verdict": verdict,
    }
    assert ceiling_verdict("other", efficiency, device)["verdict"] == "-"


@pytest.mark.parametrize(
    ("machine", "where"),
    [
        ({"gpu": None}, "fp32 matmul ceiling on the CPU"),
        ({"gpu": "H"}, "bf16 matmul ceiling on the GPU H"),
    ],
)
def test_the_table_names_the_ceiling_and_the_verdict(machine, where):
    result = {
        "machine": machine,
        "settings": {"lengths": [64]},
        "efficiency": {
            "matmul_size": 2048,
            "matmul_dtype": "bf16" if machine["gpu"] else "fp32",
            "ceiling_flop_s": 100e9,
            "ceiling_end_flop_s": 98e9,
            "train": {"ref": {"64": {"flops": 2e9, "flop_s": 50e9, "of_ceiling": 0.5}}},
            "verdict": {"target": 0.6, "shares": {64: 0.5}, "verdict": "miss"},
        },
    }
    text = "\n".join(efficiency_lines(result))
    assert f"{where}: 100.0 GFLOP/s before" in text and "miss" in text
    assert "| ref | 2.0 / 50.0 / 50% |" in text
