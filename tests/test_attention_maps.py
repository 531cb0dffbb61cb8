"""What a layer's attention looks at, read from one teacher-forced pass: the maps of the report,
the evaluation and the plots."""

from __future__ import annotations

import pytest
import torch
from conftest import PE_NAMES, tiny_model

from posenc.model.attention import first_calls


@pytest.mark.parametrize("name", PE_NAMES)
def test_attention_maps_are_distributions_with_the_masks_applied(name):
    model = tiny_model(name).train()
    src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 2, 0, 0]])
    tgt_in = torch.tensor([[1, 9, 10, 11], [1, 9, 0, 0]])
    maps = model.attention_maps(src, tgt_in)
    b, h = 2, model.encoder.layers[0].self_attn.n_heads
    assert maps["encoder"].shape == (b, h, 5, 5)
    assert maps["decoder"].shape == (b, h, 4, 4)
    assert maps["cross"].shape == (b, h, 4, 5)
    for weights in maps.values():
        assert torch.all(weights >= 0)
        assert torch.all(weights.sum(-1) <= 1 + 1e-5)
    assert torch.allclose(maps["cross"].sum(-1), torch.ones(b, h, 4))
    assert torch.all(maps["decoder"].triu(1) == 0)  # no look-ahead
    assert torch.all(maps["cross"][1, :, :, 3:] == 0)  # source padding gets nothing
    assert model.training  # the pass ran in eval mode and gave the mode back


def test_first_calls_record_each_modules_first_arguments_and_remove_their_hooks():
    layer = torch.nn.Linear(2, 2)
    with first_calls(layer) as (call,):
        layer(torch.ones(1, 2))
        layer(torch.zeros(1, 2))
    assert call.seen and torch.equal(call.arg(0, "input"), torch.ones(1, 2))
    layer(torch.ones(1, 2))
    assert not layer._forward_pre_hooks
