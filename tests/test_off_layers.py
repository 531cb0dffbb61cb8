"""``pe.off_layers``: any encoding that acts in attention switched off on chosen layers (plain
attention there), e.g. RoPE/NoPE interleaving (Yang et al. 2025; transformers'
``no_rope_layers``). One setting every encoding accepts, outside the encodings' own options."""

from __future__ import annotations

import pytest
import torch
from conftest import PE_NAMES, pe_config, tiny_model

from posenc.model.encodings import encoding_factory
from posenc.model.encodings.base import AttentionRule, Site
from posenc.model.layers import DecoderCache

ATTENTION_ENCODINGS = [
    name
    for name in PE_NAMES
    if encoding_factory(pe_config(name))(Site.ENCODER, 16, 2, 1).acts_in_attention
]
INPUT_ONLY = sorted(set(PE_NAMES) - set(ATTENTION_ENCODINGS))


def test_the_encodings_that_act_in_attention_and_those_that_only_add_to_the_input():
    assert {"rope", "alibi", "t5", "pope", "tupe", "floater"} <= set(ATTENTION_ENCODINGS)
    assert {"sinpe", "learned", "nonepe"} == set(INPUT_ONLY)


def test_an_off_layer_attends_plainly_and_the_others_keep_the_encoding():
    model = tiny_model("rope", layers=3, off_layers=[1])
    for stack in (model.encoder, model.decoder):
        kinds = [type(layer.self_attn.rule) for layer in stack.layers]
        assert kinds[1] is AttentionRule
        assert kinds[0] is kinds[2] is not AttentionRule
    assert type(model.decoder.layers[1].cross_attn.rule) is AttentionRule


def test_rope_switched_off_everywhere_is_no_encoding_at_all():
    """RoPE owns no parameters, so with every layer off the model is nonepe's, weight for
    weight and logit for logit."""
    rope = tiny_model("rope", off_layers=[0, 1]).eval()
    nope = tiny_model("nonepe").eval()
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 6))
    with torch.no_grad():
        assert torch.equal(rope(src, tgt), nope(src, tgt))


def test_switching_a_layer_off_changes_the_model_and_null_changes_nothing():
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 6))
    with torch.no_grad():
        plain = tiny_model("alibi").eval()(src, tgt)
        null = tiny_model("alibi", off_layers=None).eval()(src, tgt)
        off = tiny_model("alibi", off_layers=[0]).eval()(src, tgt)
    assert torch.equal(plain, null)
    assert not torch.allclose(plain, off)


@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_cached_decoding_with_a_layer_off_equals_teacher_forcing(name):
    model = tiny_model(name, off_layers=[1]).eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 8))
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache = DecoderCache()
        steps = [model.decode(tgt[:, i : i + 1], memory, src_pad, cache) for i in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", INPUT_ONLY)
def test_an_encoding_that_only_adds_to_the_input_refuses_in_one_line(name):
    with pytest.raises(ValueError, match="nothing to switch off") as error:
        tiny_model(name, off_layers=[0])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("off_layers", "match"),
    [([2], "has 2 layers"), ([-1], "does not exist"), (["1"], "not a layer")],
)
def test_a_layer_that_does_not_exist_is_refused_in_one_line(off_layers, match):
    with pytest.raises(ValueError, match=match) as error:
        tiny_model("rope", off_layers=off_layers)
    assert "\n" not in str(error.value)
