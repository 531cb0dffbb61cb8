"""Specification of FIRE, functional interpolation for relative positions (``pe=fire``)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.base import Site
from posenc.model.encodings.fire import FireEncoding, FireFunction, FireGrid
from posenc.model.layers import DecoderCache


def make_function(causal: bool, heads: int = 3, **settings) -> FireFunction:
    """A float64 FIRE function whose ``c`` and threshold are moved off their initial values."""
    torch.manual_seed(0)
    function = FireFunction(heads, sides=1 if causal else 2, **settings).double()
    with torch.no_grad():
        function.c.fill_(0.3)
        function.threshold_scale.fill_(1.1)
    return function


def reference_bias(function: FireFunction, q_pos, k_pos, causal: bool) -> torch.Tensor:
    """``bias[0, h, i, j]``, one pair at a time, from the paper's formula: ``f(psi(i - j) /
    psi(max(L, i)))`` with ``psi(x) = log(|c| x + 1)``; in the encoder, keys after the query use
    the second MLP on ``psi(j - i) / psi(max(L, j))``."""
    c = function.c.abs()
    threshold = (function.threshold_scale * function.threshold_init).abs()
    values = []
    for i in q_pos.tolist():
        for j in k_pos.tolist():
            after = not causal and j > i
            distance = j - i if after else max(i - j, 0)
            span = j if after else i
            normaliser = span if span > threshold else threshold
            x = torch.log(c * distance + 1) / (torch.log(c * normaliser + 1) + function.eps)
            first, _, second = function.mlps[int(after)]
            hidden = torch.relu(first.weight[:, 0] * x + first.bias)
            values.append(second.weight @ hidden + second.bias)
    heads = len(values[0])
    return torch.stack(values).view(len(q_pos), len(k_pos), heads).permute(2, 0, 1)[None]


CASES = [
    (False, torch.arange(25), torch.arange(25), 512.0),
    (True, torch.arange(25), torch.arange(25), 512.0),
    (True, torch.tensor([24]), torch.arange(25), 512.0),  # one cached decoding step
    (True, torch.tensor([21, 22, 23, 24]), torch.arange(25), 512.0),  # a chunk
    (False, torch.arange(30), torch.arange(30), 8.0),  # positions beyond the threshold
    (True, torch.arange(30), torch.arange(30), 8.0),
    (True, torch.tensor([29]), torch.arange(30), 8.0),
]


@pytest.mark.parametrize(("causal", "q_pos", "k_pos", "threshold"), CASES)
def test_bias_and_its_gradients_equal_a_loop_reference(causal, q_pos, k_pos, threshold):
    function = make_function(causal, threshold_init=threshold)
    params = list(function.parameters())
    fast = function(FireGrid.build(q_pos, k_pos, causal))
    slow = reference_bias(function, q_pos, k_pos, causal)
    if causal:  # future keys are masked whatever they get; compare those a query sees
        seen = (k_pos[None, :] <= q_pos[:, None])[None, None]
        fast, slow = fast * seen, slow * seen
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(fast)
    g_fast = torch.autograd.grad((fast * weights).sum(), params, materialize_grads=True)
    g_slow = torch.autograd.grad((slow * weights).sum(), params, materialize_grads=True)
    for fast_grad, slow_grad in zip(g_fast, g_slow, strict=True):
        torch.testing.assert_close(fast_grad, slow_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_the_mlp_input_stays_in_0_1_far_beyond_the_threshold(causal):
    """Progressive interpolation: whatever the length, a query's keys map into ``[0, 1]``; the
    farthest key of a query past the threshold maps to 1 (up to ``eps``)."""
    function = make_function(causal, threshold_init=16.0)
    q_pos = torch.tensor([0, 5, 15, 16, 17, 100, 999, 3999])
    grid = FireGrid.build(q_pos, torch.arange(4000), causal)
    with torch.no_grad():
        x = function.normalised(grid.distance, grid.span)
    assert x.min() >= 0 and x.max() <= 1  # the decoder's future keys (masked) get 0
    far = q_pos > function.threshold()
    assert far.sum() == 3
    torch.testing.assert_close(x[far, 0], torch.ones(3, dtype=x.dtype), rtol=0, atol=1e-6)


def test_the_bias_depends_on_positions_only_through_the_normalised_distance():
    """Below the threshold every query shares the normaliser ``psi(L)``, so the bias depends on
    ``i - j`` alone; past it, queries at different positions meet the same input only where the
    ratio agrees, e.g. at their farthest key (input 1), which all get ``f(1)``."""
    function = make_function(causal=True, threshold_init=10.0)
    positions = torch.arange(40)
    with torch.no_grad():
        bias = function(FireGrid.build(positions, positions, causal=True))[0]
    for i in range(1, 11):  # below L = 11
        for j in range(i + 1):
            torch.testing.assert_close(bias[:, i, j], bias[:, i - j, 0])
    far_row = bias[:, 11:, 0]  # query i >= L = 11, key 0: psi(i) / psi(i) = 1 (up to eps)
    torch.testing.assert_close(far_row, far_row[:, :1].expand_as(far_row), rtol=0, atol=1e-5)
    with torch.no_grad():
        one = function.mlps[0](torch.ones(1, 1, dtype=torch.float64))[0]
    torch.testing.assert_close(far_row[:, 0], one, rtol=0, atol=1e-5)
    assert not torch.allclose(bias[:, 30, 10], bias[:, 20, 0])  # same i - j, past L: differ


def test_the_encoder_gets_the_papers_bias_before_the_query_and_a_mirror_after_it():
    encoder = make_function(causal=False, threshold_init=8.0)
    decoder = make_function(causal=True, threshold_init=8.0)
    decoder.mlps[0].load_state_dict(encoder.mlps[0].state_dict())
    positions = torch.arange(20)
    with torch.no_grad():
        both = encoder(FireGrid.build(positions, positions, causal=False))[0]
        causal = decoder(FireGrid.build(positions, positions, causal=True))[0]
        mirror = encoder.mlps[1]
        after = mirror(encoder.normalised(torch.tensor([3]), torch.tensor([15]))[:, None])[0]
    before = torch.ones(20, 20, dtype=torch.bool).tril()
    torch.testing.assert_close(both[:, before], causal[:, before])
    torch.testing.assert_close(both[:, 12, 15], after)  # psi(15 - 12) / psi(max(L, 15))
    assert not torch.allclose(both, both.transpose(-1, -2))  # left and right differ


def test_one_fire_per_layer_by_default_and_one_per_stack_when_shared():
    model = tiny_model("fire", layers=3)
    for stack, sides in ((model.encoder, 2), (model.decoder, 1)):
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert len({id(rule) for rule in rules}) == 3
        assert not list(stack.encoding.parameters())
        for rule in rules:
            assert len(rule.function.mlps) == sides
    shared = tiny_model("fire", layers=3, share_layers=True)
    for stack in (shared.encoder, shared.decoder):
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert all(rule is rules[0] for rule in rules) and not list(rules[0].parameters())
        names = {name for name, _ in stack.encoding.named_parameters()}
        assert {"shared.c", "shared.threshold_scale"} <= names


@pytest.mark.parametrize("share_layers", [False, True])
def test_cached_decoding_in_chunks_equals_teacher_forcing(share_layers):
    model = tiny_model("fire", share_layers=share_layers, threshold_init=4.0).eval()
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 10))
    src[1, 5:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache, steps, start = DecoderCache(), [], 0
        for size in (3, 1, 4, 2):
            steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
            start += size
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


def test_init_follows_the_papers_code_after_the_models_xavier_pass():
    model = tiny_model("fire")
    function = model.decoder.layers[0].self_attn.rule.function
    assert function.c.item() == pytest.approx(0.1)
    assert function.threshold().item() == pytest.approx(512.0)
    first, _, second = function.mlps[0]
    assert first.weight.shape == (32, 1) and second.weight.shape == (4, 32)
    # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); Xavier would reach 0.41 here
    assert first.weight.abs().max() <= 1.0
    assert second.weight.abs().max() <= 1 / math.sqrt(32)
    encoding = FireEncoding(Site.ENCODER, 16, 2, 1)
    assert encoding.sees_source_order
