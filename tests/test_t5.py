"""Specification of the T5 relative position bias (``pe=t5``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.model.encodings.base import Site
from posenc.model.encodings.common import relative_position_bucket
from posenc.model.encodings.t5 import T5Encoding


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 300), (8, 20)])
def test_buckets_equal_transformers_t5(bidirectional, num_buckets, max_distance):
    relative = torch.arange(-300, 301)
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)
    assert ours.min() >= 0 and ours.max() < num_buckets


def _reference_bias(table, q_pos, k_pos, bidirectional: bool, max_distance: int) -> torch.Tensor:
    """``bias[0, h, i, j] = table[bucket(k_j - q_i), h]``, one scalar at a time."""
    n_buckets, n_heads = table.shape
    rows = []
    for h in range(n_heads):
        for q in q_pos.tolist():
            for k in k_pos.tolist():
                bucket = T5Attention._relative_position_bucket(
                    torch.tensor(k - q), bidirectional, n_buckets, max_distance
                )
                rows.append(table[int(bucket), h])
    return torch.stack(rows).view(1, n_heads, len(q_pos), len(k_pos))


@pytest.mark.parametrize(
    ("site", "q_pos", "k_pos"),
    [
        (Site.ENCODER, torch.arange(30), torch.arange(30)),
        (Site.DECODER, torch.arange(30), torch.arange(30)),
        (Site.DECODER, torch.tensor([27]), torch.arange(28)),  # one cached decoding step
    ],
)
def test_bias_and_its_gradient_equal_a_loop_reference(site, q_pos, k_pos):
    enc = T5Encoding(site, d_model=16, n_heads=3, n_layers=2, num_buckets=32, max_distance=20)
    weights = torch.randn(1, 3, len(q_pos), len(k_pos))
    fast = enc.context(q_pos, k_pos)
    slow = _reference_bias(enc.table, q_pos, k_pos, site is Site.ENCODER, max_distance=20)
    torch.testing.assert_close(fast, slow, rtol=0, atol=0)
    (g_fast,) = torch.autograd.grad((fast * weights).sum(), enc.table)
    (g_slow,) = torch.autograd.grad((slow * weights).sum(), enc.table)
    torch.testing.assert_close(g_fast, g_slow)


def test_encoder_distinguishes_left_from_right_and_decoder_row_matches_full_matrix():
    enc = T5Encoding(Site.ENCODER, d_model=16, n_heads=2, n_layers=1)
    full = enc.context(torch.arange(9), torch.arange(9))
    assert not torch.allclose(full, full.transpose(-1, -2))
    dec = T5Encoding(Site.DECODER, d_model=16, n_heads=2, n_layers=1)
    full = dec.context(torch.arange(9), torch.arange(9))
    step = dec.context(torch.tensor([6]), torch.arange(7))
    torch.testing.assert_close(step, full[:, :, 6:7, :7])


def test_one_table_per_stack_shared_by_every_layer_and_trained_by_all():
    model = tiny_model("t5", layers=3)
    for stack in (model.encoder, model.decoder):
        params = dict(stack.encoding.named_parameters())
        assert list(params) == ["table"] and params["table"].shape == (32, 4)
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert all(rule is rules[0] for rule in rules)
        assert not any(p for layer in stack.layers for p in layer.self_attn.rule.parameters())
    # The gradient of a layer's loss reaches the shared table whatever the layer.
    src, tgt = torch.randint(3, 40, (2, 9)), torch.randint(3, 40, (2, 8))
    model(src, tgt).logsumexp(-1).mean().backward()
    assert model.encoder.encoding.table.grad.abs().sum() > 0
    assert model.decoder.encoding.table.grad.abs().sum() > 0


def test_table_init_follows_transformers_t5_after_the_models_xavier_pass():
    model = tiny_model("t5", d_model=64, n_heads=16)
    table = model.encoder.encoding.table.detach()
    assert abs(table.std().item() - 64**-0.5) < 0.15 * 64**-0.5
    assert abs(table.mean().item()) < 0.02
