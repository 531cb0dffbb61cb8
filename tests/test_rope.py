"""RoPE (``configs/pe/rope.yaml``): the rotation of the paper, relative scores, and the
context-extension scalings of transformers' ``modeling_rope_utils``."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import pe_config, tiny_model
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import posenc.model.encodings.rotary as rotary
from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.rope_scaling import SCALINGS
from posenc.model.encodings.rotary import CrossRotaryRule, RotaryEncoding
from posenc.model.encodings.rotation import RotaryRule, rotation_table
from posenc.model.positions import PositionAugmentation


def make_rope(head_dim: int = 8, n_heads: int = 2, **params) -> RotaryEncoding:
    """A decoder-site RoPE encoding for heads of ``head_dim`` dims."""
    return RotaryEncoding(Site.DECODER, head_dim * n_heads, n_heads, 1, **params)


def rotate_qk(
    encoding: RotaryEncoding, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast path: tables from ``context``, rotation in ``RotaryRule.prepare``."""
    tables = encoding.context(positions, positions)
    q, k, _ = RotaryRule().prepare(q, k, None, positions, context=tables)
    return q, k


def paper_rotate(
    x: torch.Tensor, positions: torch.Tensor, theta: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """RoFormer eq. (13)-(15), one 2x2 rotation at a time: the adjacent pair ``(2i, 2i+1)`` of
    ``x (B, H, L, D)`` at position ``m`` is multiplied by ``scale * [[cos, -sin], [sin, cos]]``
    of the angle ``m * theta_i``; dims from ``2 * len(theta)`` on are left alone."""
    out = x.clone()
    for m, pos in enumerate(positions.tolist()):
        for i, t in enumerate(theta.tolist()):
            c, s = math.cos(pos * t), math.sin(pos * t)
            matrix = scale * torch.tensor([[c, -s], [s, c]], dtype=x.dtype)
            for b in range(x.shape[0]):
                for h in range(x.shape[1]):
                    out[b, h, m, 2 * i : 2 * i + 2] = matrix @ x[b, h, m, 2 * i : 2 * i + 2]
    return out


def llama_order(head_dim: int, rotated: int) -> torch.Tensor:
    """Index ``p`` with ``x_ours = x_llama[..., p]``: Llama's pair ``(i, i + r/2)`` ("rotate
    half") is our adjacent pair ``(2i, 2i + 1)``; unrotated dims keep their place."""
    half = rotated // 2
    pairs = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return torch.cat([pairs, torch.arange(rotated, head_dim)])


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_default_frequencies_are_the_papers(fraction):
    rotated = int(16 * fraction)
    expected = [10000.0 ** (-2 * i / rotated) for i in range(rotated // 2)]
    torch.testing.assert_close(
        make_rope(16, rotary_fraction=fraction).inv_freq, torch.tensor(expected)
    )


@pytest.mark.parametrize(
    ("head_dim", "params"),
    [
        (8, {}),
        (8, {"rotary_fraction": 0.5}),
        (9, {"rotary_fraction": 0.5}),  # odd head dim: 4 rotated, 5 passed through
        (8, {"scaling": "yarn", "factor": 4.0, "original_max_len": 16}),
        (8, {"scaling": "linear", "factor": 2.0, "rotary_fraction": 0.75}),
    ],
)
def test_fast_rotation_equals_the_papers_2x2_rotations_forward_and_backward(head_dim, params):
    encoding = make_rope(head_dim, **params)
    positions = torch.tensor([0, 3, 7, 30, 101])
    q = torch.randn(2, 2, 5, head_dim, requires_grad=True)
    k = torch.randn(2, 2, 5, head_dim, requires_grad=True)
    weight_q, weight_k = torch.randn(2, 2, 5, head_dim), torch.randn(2, 2, 5, head_dim)

    fast_q, fast_k = rotate_qk(encoding, q, k, positions)
    ref_q = paper_rotate(q, positions, encoding.inv_freq, encoding.attention_factor)
    ref_k = paper_rotate(k, positions, encoding.inv_freq, encoding.attention_factor)
    torch.testing.assert_close(fast_q, ref_q)
    torch.testing.assert_close(fast_k, ref_k)

    def grads(rq, rk):
        loss = (rq * weight_q).sum() + (rk * weight_k).sum() + (rq @ rk.transpose(-1, -2)).sum()
        return torch.autograd.grad(loss, (q, k))

    for fast, ref in zip(grads(fast_q, fast_k), grads(ref_q, ref_k), strict=True):
        torch.testing.assert_close(fast, ref)


@pytest.mark.parametrize("proportion", [None, 0.25, 0.75])  # plain RoPE, p-RoPE
@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn"])
def test_scores_depend_only_on_the_relative_position(scaling, proportion):
    encoding = make_rope(
        16, scaling=scaling, factor=4.0, original_max_len=32, rope_proportion=proportion
    )
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    positions = torch.tensor([0, 1, 2, 5, 9, 20])
    scores = []
    for shift in [0, 7, 300]:
        rq, rk = rotate_qk(encoding, q, k, positions + shift)
        scores.append(rq @ rk.transpose(-1, -2))
    torch.testing.assert_close(scores[1], scores[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scores[2], scores[0], atol=1e-4, rtol=1e-4)


def test_rotation_preserves_norms_and_yarn_scales_them_by_its_temperature():
    q, k = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    positions = torch.arange(100, 109)
    rq, rk = rotate_qk(make_rope(), q, k, positions)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(rk.norm(dim=-1), k.norm(dim=-1))
    yarn = make_rope(scaling="yarn", factor=4.0, original_max_len=16)
    temperature = 0.1 * math.log(4.0) + 1.0
    rq, _ = rotate_qk(yarn, q, k, positions)
    torch.testing.assert_close(rq.norm(dim=-1), temperature * q.norm(dim=-1))


def test_bfloat16_inputs_are_rotated_in_float32_and_returned_in_bfloat16():
    q = torch.randn(2, 2, 9, 8).bfloat16()
    positions = torch.arange(500, 509)
    rq, rk = rotate_qk(make_rope(), q, q, positions)
    assert rq.dtype is torch.bfloat16 and rk.dtype is torch.bfloat16
    reference, _ = rotate_qk(make_rope(), q.float(), q.float(), positions)
    torch.testing.assert_close(rq, reference.bfloat16())


def test_partial_rotation_leaves_the_tail_dims_unchanged():
    q, k = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    rq, rk = rotate_qk(make_rope(16, rotary_fraction=0.25), q, k, torch.arange(3, 12))
    torch.testing.assert_close(rq[..., 4:], q[..., 4:], rtol=0, atol=0)
    torch.testing.assert_close(rk[..., 4:], k[..., 4:], rtol=0, atol=0)
    assert not torch.allclose(rq[..., 1:, :4], q[..., 1:, :4])


def test_factor_is_ignored_without_scaling():
    plain, with_factor = make_rope(), make_rope(scaling="none", factor=8.0, original_max_len=3)
    torch.testing.assert_close(with_factor.inv_freq, plain.inv_freq, rtol=0, atol=0)
    assert with_factor.attention_factor == plain.attention_factor == 1.0


def test_linear_scaling_is_position_interpolation():
    """Chen et al. 2023: rotating position ``m`` with factor ``s`` = rotating ``m / s``."""
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    interpolated = rotate_qk(make_rope(scaling="linear", factor=4.0), q, k, torch.arange(0, 16, 4))
    plain = rotate_qk(make_rope(), q, k, torch.arange(4))
    torch.testing.assert_close(interpolated, plain)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rotary_fraction": 0.375}, "rotary_fraction"),
        ({"rotary_fraction": 0.0}, "rotary_fraction"),
        ({"scaling": "dynamic"}, "scaling"),
        ({"scaling": "linear", "factor": 0.5}, "factor"),
        ({"cross_attention": "both"}, "cross_attention"),
        ({"cross_attention": "rotated", "scaling": "dynamic_ntk"}, "dynamic_ntk"),
    ],
)
def test_invalid_settings_fail_at_construction(params, message):
    with pytest.raises(ValueError, match=message):
        make_rope(8, **params)


def llama_config(head_dim: int, fraction: float, rope_parameters: dict) -> LlamaConfig:
    """A transformers config whose heads have ``head_dim`` dims, ``fraction`` of them rotated."""
    params = {"rope_theta": 10000.0, "partial_rotary_factor": fraction, **rope_parameters}
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        max_position_embeddings=128,
        rope_parameters=params,
    )


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn", "llama3"])
def test_inverse_frequencies_match_transformers(scaling, fraction):
    head_dim, factor, original = 32, 4.0, 32
    ours = make_rope(
        head_dim,
        rotary_fraction=fraction,
        scaling=scaling,
        factor=factor,
        original_max_len=original,
    )
    if scaling == "ntk":
        # transformers has NTK-aware scaling only in its "dynamic" form, whose base is
        # base * (factor * S / M - factor + 1)^(r/(r-2)) at length S; at S = M (2 factor - 1) /
        # factor that is the static base * factor^(r/(r-2)).
        config = llama_config(head_dim, fraction, {"rope_type": "dynamic", "factor": factor})
        length = int(128 * (2 * factor - 1) / factor)
        inv_freq, attention = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=length)
    else:
        extra = (
            {"original_max_position_embeddings": original} if scaling in ("yarn", "llama3") else {}
        )
        if scaling == "llama3":  # Llama 3.1's band limits, posenc's defaults
            extra |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        config = llama_config(head_dim, fraction, {"rope_type": scaling, "factor": factor, **extra})
        inv_freq, attention = ROPE_INIT_FUNCTIONS[scaling](config)
    torch.testing.assert_close(ours.inv_freq, inv_freq)
    assert ours.attention_factor == pytest.approx(attention)


@pytest.mark.parametrize(
    ("params", "rope_parameters"),
    [
        ({}, {"rope_type": "default"}),
        ({"scaling": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
        (
            {"scaling": "yarn", "factor": 4.0, "original_max_len": 32},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        ),
    ],
)
def test_rotated_q_and_k_match_transformers_llama(params, rope_parameters):
    """Llama's ``rotate_half`` layout is ours up to a permutation of head dims: same numbers
    once permuted, YaRN's temperature included."""
    head_dim = 32
    order = llama_order(head_dim, head_dim)
    positions = torch.tensor([0, 1, 5, 40, 200])
    q, k = torch.randn(2, 2, 5, head_dim), torch.randn(2, 2, 5, head_dim)
    llama = LlamaRotaryEmbedding(llama_config(head_dim, 1.0, rope_parameters))
    cos, sin = llama(q, positions[None])
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = rotate_qk(
        make_rope(head_dim, **params), q[..., order], k[..., order], positions
    )
    torch.testing.assert_close(ours_q, expected_q[..., order])
    torch.testing.assert_close(ours_k, expected_k[..., order])


def test_partial_rotation_matches_llamas_layout_up_to_the_permutation():
    """The same check with a quarter of the dims rotated (Llama's rotation on the first r)."""
    head_dim, rotated = 16, 4
    order = llama_order(head_dim, rotated)
    positions = torch.arange(20, 26)
    q, k = torch.randn(1, 2, 6, head_dim), torch.randn(1, 2, 6, head_dim)
    encoding = make_rope(head_dim, rotary_fraction=0.25)
    angles = positions[:, None].float() * encoding.inv_freq
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated_q, rotated_k = apply_rotary_pos_emb(
        q[..., :rotated], k[..., :rotated], cos[None], sin[None]
    )
    expected_q = torch.cat([rotated_q, q[..., rotated:]], -1)
    expected_k = torch.cat([rotated_k, k[..., rotated:]], -1)
    ours_q, ours_k = rotate_qk(encoding, q[..., order], k[..., order], positions)
    torch.testing.assert_close(ours_q, expected_q[..., order])
    torch.testing.assert_close(ours_k, expected_k[..., order])


def test_rope_rotates_self_attention_only_and_builds_its_tables_once_per_stack(monkeypatch):
    model = tiny_model("rope")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn.rule, RotaryRule)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    calls = []
    original = rotary.rotation_table
    monkeypatch.setattr(
        rotary, "rotation_table", lambda *a, **kw: calls.append(1) or original(*a, **kw)
    )
    model(torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5)))
    assert len(calls) == 2  # one per stack, shared by both layers of each


def test_the_yaml_holds_the_papers_defaults():
    cfg = pe_config("rope")
    assert cfg["base"] == 10000.0 and cfg["rotary_fraction"] == 1.0
    assert cfg["scaling"] == "none"


def cross_weights(rule: CrossRotaryRule, q, k, q_pos, k_pos):
    return rule.weights(q, k, None, AttentionCall(q_pos, k_pos, causal=False))


@pytest.mark.parametrize("scaling", ["none", "yarn"])
def test_rotated_cross_attention_rotates_queries_at_target_and_keys_at_source_positions(scaling):
    """x-transformers' ``context_pos``: the paper's rotation of q at each target position and of
    k at each source position, then plain softmax attention (values untouched)."""
    encoding = make_rope(8, cross_attention="rotated", scaling=scaling, factor=2.0).double()
    rule = encoding.cross_rule(0)
    q = torch.randn(2, 2, 4, 8, dtype=torch.float64)
    k, v = (
        torch.randn(2, 2, 6, 8, dtype=torch.float64),
        torch.randn(2, 2, 6, 8, dtype=torch.float64),
    )
    q_pos, k_pos = torch.tensor([0, 1, 2, 7]), torch.arange(6)
    theta, factor = encoding.inv_freq.double(), encoding.attention_factor
    rq, rk = paper_rotate(q, q_pos, theta, factor), paper_rotate(k, k_pos, theta, factor)
    expected = torch.softmax(rq @ rk.transpose(-1, -2) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(cross_weights(rule, q, k, q_pos, k_pos), expected)
    call = AttentionCall(q_pos, k_pos, causal=False)
    torch.testing.assert_close(rule(q, k, v, None, call), expected @ v)


def test_rotated_cross_attention_depends_on_target_minus_source_position():
    rule = make_rope(8, cross_attention="rotated").cross_rule(0)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8)
    q_pos, k_pos = torch.tensor([0, 1, 2]), torch.arange(5)
    base = cross_weights(rule, q, k, q_pos, k_pos)
    shifted = cross_weights(rule, q, k, q_pos + 40, k_pos + 40)
    torch.testing.assert_close(shifted, base, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(cross_weights(rule, q, k, q_pos + 3, k_pos), base, atol=1e-3)


def test_cross_attention_is_plain_by_default_and_rotated_on_request():
    for layer in tiny_model("rope").decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    model = tiny_model("rope", cross_attention="rotated")
    for layer in model.decoder.layers:
        assert isinstance(layer.cross_attn.rule, CrossRotaryRule)
    assert "cross-attention (q at target" in model.decoder.encoding.applies_to


def test_rotated_cross_attention_refuses_position_augmentation_in_one_line():
    encoding = make_rope(8, cross_attention="rotated")
    with pytest.raises(ValueError, match="true source positions") as error:
        encoding.augment(PositionAugmentation.of("random", 64), "rope")
    assert "\n" not in str(error.value)


def test_rotating_some_heads_leaves_the_others_without_positions():
    """``rotate_num_heads=n``: the last n heads are RoPE's, the first H - n are plain (x-
    transformers' ``rotate_num_heads``)."""
    full, partial = make_rope(n_heads=4), make_rope(n_heads=4, rotate_num_heads=1)
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    positions = torch.arange(6)
    rotated = RotaryRule().prepare(q, k, q, positions, full.context(positions, positions))
    some = RotaryRule(1).prepare(q, k, q, positions, partial.context(positions, positions))
    torch.testing.assert_close(some[0][:, :3], q[:, :3])  # untouched
    torch.testing.assert_close(some[1][:, :3], k[:, :3])
    torch.testing.assert_close(some[0][:, 3:], rotated[0][:, 3:])  # the last head as RoPE's
    torch.testing.assert_close(some[1][:, 3:], rotated[1][:, 3:])
    with pytest.raises(ValueError, match="rotate_num_heads=5 must be a number of heads from 1"):
        make_rope(n_heads=4, rotate_num_heads=5)


def test_the_rotated_heads_follow_the_configured_form_in_every_rule():
    encoding = make_rope(n_heads=2, rotate_num_heads=1, cross_attention="rotated")
    assert encoding.self_rule(0).heads == 1 and encoding.cross_rule(0).heads == 1
    dynamic = RotaryEncoding(Site.ENCODER, 16, 2, 1, scaling="dynamic_ntk", factor=2.0,
                             rotate_num_heads=1)  # fmt: skip
    assert dynamic.self_rule(0).heads == 1


def test_llama3_keeps_short_waves_divides_long_ones_and_blends_between():
    """Llama 3.1's bands (the formula's cases, one pair at a time, at a training length of 64):
    wavelengths below 64/4 kept, above 64/1 divided by the factor, a linear blend in 1/wavelength
    between."""
    encoding = make_rope(32, scaling="llama3", factor=8.0, original_max_len=64)
    theta = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    for i, t in enumerate(theta.tolist()):
        wavelength = 2 * math.pi / t
        if wavelength < 64 / 4:
            expected = t
        elif wavelength > 64 / 1:
            expected = t / 8
        else:
            a = (64 / wavelength - 1) / (4 - 1)
            expected = (1 - a) * t / 8 + a * t
        assert encoding.inv_freq[i].item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="llama3 needs 0 < low_freq_factor < high_freq_factor"):
        make_rope(scaling="llama3", factor=2.0, low_freq_factor=4.0, high_freq_factor=1.0)


def test_yarn_temperature_with_deepseeks_mscale_matches_transformers():
    params = {"scaling": "yarn", "factor": 4.0, "original_max_len": 32}
    ours = make_rope(32, mscale=0.707, mscale_all_dim=1.0, **params)
    config = llama_config(
        32,
        1.0,
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
    )
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](config)
    torch.testing.assert_close(ours.inv_freq, inv_freq)
    assert ours.attention_factor == pytest.approx(attention)
    assert ours.attention_factor != pytest.approx(make_rope(32, **params).attention_factor)


LONG_FACTORS = {
    "short_factor": [1.0 + 0.1 * i for i in range(8)],
    "long_factor": [1.0 + i for i in range(8)],
}


@pytest.mark.parametrize("length", [32, 33, 100])
def test_longrope_matches_transformers_short_and_long_frequencies_and_temperature(length):
    """transformers' ``longrope`` (Phi-3): short factors up to the training length, long ones
    beyond, and the temperature sqrt(1 + ln(factor) / ln(original))."""
    ours = make_rope(16, scaling="longrope", factor=4.0, original_max_len=32, **LONG_FACTORS)
    config = llama_config(
        16,
        1.0,
        {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 32}
        | LONG_FACTORS,
    )
    expected, attention = ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=length)
    got = SCALINGS["longrope"].at_lengths(ours.inv_freq, ours.settings, torch.tensor([length]))[0]
    torch.testing.assert_close(got, expected)
    assert ours.attention_factor == pytest.approx(attention)
    short, _ = ROPE_INIT_FUNCTIONS["longrope"](config)
    torch.testing.assert_close(ours.inv_freq, short)


def test_longrope_turns_a_source_by_its_length_and_a_target_position_by_the_length_it_ends():
    encoder = RotaryEncoding(
        Site.ENCODER, 32, 2, 1, scaling="longrope", factor=4.0, original_max_len=4, **LONG_FACTORS
    )
    tables = encoder.context(torch.arange(6), torch.arange(6))
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # lengths 6 and 4
    table = tables.table(padding)
    short = rotation_table(torch.arange(6), encoder.inv_freq, encoder.attention_factor)
    assert torch.allclose(table[1, 0], short) and not torch.allclose(table[0, 0], short)
    decoder = make_rope(16, scaling="longrope", factor=4.0, original_max_len=4, **LONG_FACTORS)
    rows = decoder.context(torch.arange(6), torch.arange(6)).q
    torch.testing.assert_close(rows[:4], short[:4])  # positions 0-3 complete lengths 1-4
    assert not torch.allclose(rows[4:], short[4:])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scaling": "longrope", "factor": 2.0}, "needs short_factor as 8 positive numbers"),
        (
            {"scaling": "longrope", "factor": 2.0, **LONG_FACTORS, "long_factor": [1.0] * 3},
            "needs long_factor as 8 positive numbers",
        ),
        ({"scaling": "yarn", "factor": 2.0, **LONG_FACTORS}, "short_factor is LongRoPE's"),
    ],
)
def test_longrope_factors_are_refused_unless_one_per_pair_and_with_longrope(params, message):
    with pytest.raises(ValueError, match=message):
        make_rope(16, **params)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"scaling": "llama3", "factor": 2.0, "mscale": 1.0}, "mscale is YaRN's; set scaling=yarn"),
        ({"scaling": "none", "low_freq_factor": 2.0}, "low_freq_factor is Llama 3's"),
        ({"scaling": "yarn", "factor": 2.0, "mscal": 1.0}, "mscal is no setting of rope"),
    ],
)
def test_a_scaling_reads_its_own_parameters_and_refuses_another_scalings(params, message):
    """Each scaling's parameters are its entry's class (SCALINGS): given to another scaling
    they would be ignored without a word, so they are refused, as is a key no scaling has."""
    with pytest.raises(ValueError, match=message):
        make_rope(16, **params)
    own = make_rope(16, scaling="yarn", factor=2.0, mscale=1.0, mscale_all_dim=None)
    assert own.settings.own.mscale == 1.0 and own.settings.own.mscale_all_dim is None
