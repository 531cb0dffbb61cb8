"""The optimizer: AdamW with one weight-decay rule, through torch's fused kernel on CPU and CUDA,
taking the same steps as torch's reference implementation."""

from __future__ import annotations

import torch
from conftest import tiny_model

from posenc.training.optim import make_optimizer, parameter_groups


def test_adamw_is_fused_on_the_cpu_and_steps_like_the_reference_implementation():
    fused_model, reference_model = tiny_model("t5"), tiny_model("t5")
    reference_model.load_state_dict(fused_model.state_dict())
    fused = make_optimizer(fused_model, 1e-2, (0.9, 0.98), 0.01)
    reference = torch.optim.AdamW(
        parameter_groups(reference_model, 0.01), lr=1e-2, betas=(0.9, 0.98), foreach=False
    )
    assert fused.defaults["fused"] is True
    for step in range(3):
        torch.manual_seed(step)
        grads = [torch.randn_like(p) for p in fused_model.parameters()]
        for model, optimizer in ((fused_model, fused), (reference_model, reference)):
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
    for got, want in zip(fused_model.parameters(), reference_model.parameters(), strict=True):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
