"""Specification of the dynamic position bias (``pe=dpb``): x-transformers'
``DynamicPositionBias``, an MLP of the (log-spaced) signed distance."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from posenc.model.encodings.base import Site
from posenc.model.encodings.dpb import DynamicPositionBiasEncoding


def make(site: Site, **settings) -> DynamicPositionBiasEncoding:
    torch.manual_seed(0)
    return DynamicPositionBiasEncoding(site, d_model=32, n_heads=3, n_layers=2, **settings).double()


def reference_bias(encoding, q_pos, k_pos, log_distance: bool, norm: bool) -> torch.Tensor:
    """``bias[0, h, i, j]`` one pair at a time, the MLP written out from its weights:
    ``x = phi(i - j)``; ``a = SiLU([LN](W x + b))`` per hidden layer; ``out = W a + b``."""
    linears = [m for m in encoding.mlp if isinstance(m, torch.nn.Linear)]
    norms = [m for m in encoding.mlp if isinstance(m, torch.nn.LayerNorm)]
    causal = encoding.causal
    out = torch.zeros(1, encoding.n_heads, len(q_pos), len(k_pos), dtype=torch.float64)
    for a, i in enumerate(q_pos.tolist()):
        for b, j in enumerate(k_pos.tolist()):
            x = float(max(i - j, 0) if causal else i - j)
            if log_distance:
                x = math.copysign(math.log(abs(x) + 1), x)
            act = torch.tensor([x], dtype=torch.float64)
            for index, linear in enumerate(linears[:-1]):
                act = linear.weight @ act + linear.bias
                if norm:
                    act = F.layer_norm(act, act.shape, norms[index].weight, norms[index].bias)
                act = act * torch.sigmoid(act)
            out[0, :, a, b] = linears[-1].weight @ act + linears[-1].bias
    return out


@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
@pytest.mark.parametrize(("log_distance", "norm"), [(True, False), (False, True)])
@pytest.mark.parametrize(
    ("q_pos", "k_pos"),
    [(torch.arange(9), torch.arange(9)), (torch.tensor([8]), torch.arange(9))],  # a cached step
)
def test_bias_equals_a_loop_reference(site, log_distance, norm, q_pos, k_pos):
    encoding = make(site, log_distance=log_distance, norm=norm)
    torch.testing.assert_close(
        encoding.context(q_pos, k_pos),
        reference_bias(encoding, q_pos, k_pos, log_distance, norm),
    )


def test_the_bias_is_relative_and_the_encoder_tells_left_from_right():
    encoding = make(Site.ENCODER)
    positions = torch.arange(7)
    bias = encoding.context(positions, positions)
    torch.testing.assert_close(bias, encoding.context(positions + 40, positions + 40))
    assert not torch.allclose(bias, bias.transpose(-1, -2))  # i - j and j - i differ
    assert encoding.sees_source_order


def test_log_distance_grows_slowly_so_far_keys_stay_near_the_trained_inputs():
    encoding = make(Site.DECODER)
    first = encoding.mlp[0]
    inputs = []
    first.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
    encoding.context(torch.tensor([10_000]), torch.arange(10_001))
    assert inputs[0].max().item() == pytest.approx(math.log(10_001))  # about 9.2


def test_one_mlp_per_stack_read_by_every_layer_with_x_transformers_defaults():
    model = tiny_model("dpb", d_model=32, layers=3)
    stack = model.decoder.encoding
    rules = {id(layer.self_attn.rule) for layer in model.decoder.layers}
    assert len(rules) == 1
    linears = [m for m in stack.mlp if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(8, 1), (8, 8), (4, 8)]  # d/4, depth 2
    assert linears[0].weight.abs().max() <= 1.0  # nn.Linear's default, not the model's Xavier


@pytest.mark.parametrize("setting", [{"width": 0}, {"depth": 0}])
def test_an_empty_mlp_is_refused_in_one_line(setting):
    with pytest.raises(ValueError, match="must each be at least 1"):
        DynamicPositionBiasEncoding(Site.ENCODER, 16, 2, 1, **setting)
