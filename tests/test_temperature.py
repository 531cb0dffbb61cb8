"""Specification of the queries' temperature (``pe.temperature``): Llama 4's on its layers
without positions and Scalable-Softmax, each against its formula, where each applies, and the
properties every encoding keeps with it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from test_every_encoding import _decode_in_chunks

from posenc.model.encodings.base import AttentionCall, AttentionRule
from posenc.model.encodings.common import DapeRule
from posenc.model.encodings.wrapping import WrapperRule, rule_hooks
from posenc.model.temperature import Temperature, TemperedRule


def reference_weights(q, k, factor_of_query, mask) -> torch.Tensor:
    """Attention weights one query at a time: ``softmax_j(f_i q_i . k_j / sqrt(D))`` over the
    keys ``mask[b, i]`` allows."""
    b_, h_, lq, d = q.shape
    out = torch.zeros(b_, h_, lq, k.shape[2], dtype=q.dtype)
    for b in range(b_):
        for h in range(h_):
            for i in range(lq):
                keys = [j for j in range(k.shape[2]) if mask[b][i][j]]
                f = factor_of_query(b, h, i)
                scores = torch.stack([f * q[b, h, i] @ k[b, h, j] / math.sqrt(d) for j in keys])
                out[b, h, i, keys] = torch.softmax(scores, dim=0)
    return out


def test_llama4_scales_the_query_at_position_p_by_its_formula():
    """transformers' Llama4TextAttention: log(floor((p + 1) / floor_scale) + 1) * scale + 1."""
    torch.manual_seed(0)
    q, k = (
        torch.randn(1, 2, 12, 4, dtype=torch.float64),
        torch.randn(1, 2, 12, 4, dtype=torch.float64),
    )
    temperature = Temperature.of("llama4", None, 0.3, 4)
    rule = temperature.wrap(AttentionRule(), n_heads=2).double()
    call = AttentionCall(torch.arange(12), torch.arange(12), causal=True)

    def factor(b, h, i):
        return math.log(math.floor((i + 1) / 4) + 1) * 0.3 + 1

    mask = [[[j <= i for j in range(12)] for i in range(12)]]
    torch.testing.assert_close(
        rule.weights(q, k, None, call), reference_weights(q, k, factor, mask)
    )


def test_llama4_at_its_own_floor_scale_changes_nothing_under_8192_positions():
    rule = Temperature.of("llama4", None, None, None).wrap(AttentionRule(), n_heads=2)
    call = AttentionCall(torch.arange(8000, 8191), torch.arange(8191), causal=True)
    assert torch.all(rule.factor(call, torch.float64) == 1)


@pytest.mark.parametrize("causal", [True, False])
def test_ssmax_scales_each_query_by_s_log_n_of_the_keys_it_sees(causal):
    """Nakanishi 2025: softmax((s log n) z), n the keys attended to (the decoder's p + 1, the
    encoder's source length without padding), s learned per head."""
    torch.manual_seed(0)
    q, k = (
        torch.randn(2, 3, 6, 4, dtype=torch.float64),
        torch.randn(2, 3, 6, 4, dtype=torch.float64),
    )
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    rule = Temperature.of("ssmax", None, None, None).wrap(AttentionRule(), n_heads=3).double()
    with torch.no_grad():
        rule.s.copy_(torch.tensor([0.43, 0.2, 1.5]))
    call = AttentionCall(torch.arange(6), torch.arange(6), causal, key_padding_mask=padding)
    mask = [
        [[(j <= i or not causal) and not padding[b, j] for j in range(6)] for i in range(6)]
        for b in range(2)
    ]

    def factor(b, h, i):
        return rule.s[h].item() * math.log(sum(mask[b][i]))

    torch.testing.assert_close(
        rule.weights(q, k, None, call), reference_weights(q, k, factor, mask)
    )
    assert rule.s.requires_grad


def test_it_applies_to_the_off_layers_when_set_else_every_layer_and_never_to_cross_attention():
    def tempered(model, stack):
        layers = getattr(model, stack).layers
        return [isinstance(layer.self_attn.rule, TemperedRule) for layer in layers]

    interleaved = tiny_model("rope", layers=3, off_layers=[2], temperature="ssmax")
    assert tempered(interleaved, "decoder") == [False, False, True]
    everywhere = tiny_model("nonepe", layers=3, temperature="llama4")
    assert tempered(everywhere, "encoder") == [True, True, True]
    listed = tiny_model("rope", layers=3, temperature="ssmax", temperature_layers=[0])
    assert tempered(listed, "decoder") == [True, False, False]
    assert not any(
        isinstance(layer.cross_attn.rule, TemperedRule) for layer in everywhere.decoder.layers
    )


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("nonepe", {"temperature": "ssmax"}),
        ("nonepe", {"temperature": "llama4", "temperature_floor_scale": 3}),
        ("rope", {"off_layers": [1], "temperature": "llama4", "temperature_floor_scale": 2}),
        ("alibi", {"off_layers": [1], "temperature": "ssmax"}),  # on its layer without bias
        ("rope_pp", {"temperature": "ssmax"}),  # one s per projected head: half of the heads
    ],
)
def test_cached_decoding_padding_and_float64_hold_with_a_temperature(name, overrides):
    model = tiny_model(name, **overrides).double().eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 10))
    with torch.no_grad():
        full = model(src, tgt)
        for chunks in ((1,) * 10, (3, 2, 1, 4)):
            chunked = _decode_in_chunks(model, src, tgt, chunks)
            torch.testing.assert_close(chunked, full, atol=1e-12, rtol=1e-10)
        alone = model(src[1:, :5], tgt[1:])
    torch.testing.assert_close(alone, full[1:], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": "yarn"}, "pe.temperature='yarn' is unknown; use one of llama4, ssmax"),
        ({"temperature_scale": 0.1}, "pe.temperature_scale without pe.temperature"),
        (
            {"temperature": "ssmax", "temperature_floor_scale": 8},
            "does nothing with pe.temperature=ssmax",
        ),
        ({"temperature": "ssmax", "temperature_layers": [5]}, "has 2 layers (0 to 1), so layer 5"),
        (
            {"temperature": "llama4", "temperature_scale": -1},
            "pe.temperature_scale=-1 must be a positive number",
        ),
    ],
)
def test_a_temperature_setting_that_cannot_apply_is_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_model("nonepe", **settings)


class Recording(AttentionRule):
    """An inner rule whose every hook records that it was reached."""

    def __init__(self) -> None:
        super().__init__()
        self.reached: list[str] = []


for _name in rule_hooks():
    setattr(
        Recording,
        _name,
        lambda self, *args, _name=_name, **kwargs: self.reached.append(_name) or _name,
    )


@pytest.mark.parametrize(
    "wrap",
    [
        lambda inner: TemperedRule(inner, Temperature("llama4", None, 0.1, 8.0), n_heads=2),
        lambda inner: DapeRule(inner, n_heads=2, hidden=4),
    ],
    ids=["temperature", "dape"],
)
def test_a_wrapper_rule_forwards_every_hook_it_does_not_override(wrap):
    """Once TemperedRule forwarded its hooks by hand: a hook added later and forgotten there
    would have fallen back to the default without a word. Every hook of AttentionRule that a
    wrapper's class does not define itself reaches the inner rule."""
    inner = Recording()
    wrapper = wrap(inner)
    forwarded = [
        name
        for name in rule_hooks()
        if not any(
            name in vars(c)
            for c in type(wrapper).__mro__[: type(wrapper).__mro__.index(WrapperRule)]
        )
    ]
    assert forwarded and "prepare" in forwarded
    for name in forwarded:
        assert getattr(wrapper, name)(*range(5)) == name
    assert inner.reached == forwarded


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple"])
def test_scalable_softmax_is_refused_where_a_bias_would_stay_unscaled(name):
    """SSMax scales the whole softmax input, z -> s log(n) z (Nakanishi 2025); posenc scales the
    queries, which would leave a bias unscaled: the combination is refused, and allowed on the
    layers without a bias."""
    with pytest.raises(ValueError, match="pe.temperature=ssmax with a position bias"):
        tiny_model(name, temperature="ssmax")
    tiny_model(name, temperature="ssmax", off_layers=[1])
