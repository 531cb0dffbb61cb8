"""p-RoPE (Barbero et al. 2025; ``rope`` with ``rope_proportion``): transformers' ``proportional``
frequencies, the paper's rotation pair by pair, zeroed pairs that are never rotated, relative
scores, and plain RoPE unchanged by the default."""

from __future__ import annotations

import math

import conftest
import pytest
import torch
from conftest import compose, pe_config, tiny_model
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from posenc.config import plain
from posenc.config.identity import identity
from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.rope_scaling import SCALINGS
from posenc.model.encodings.rotary import LengthEncoderRule, RotaryEncoding
from posenc.model.encodings.rotation import RotaryRule

CASES = [(8, 0.75), (10, 0.5), (16, 0.25), (32, 0.3), (64, 0.875), (16, 1.0)]
"""(head dim, rope_proportion): even and odd pair counts, fractions that do not divide them."""


def make_prope(
    head_dim: int, proportion: float | None, site: Site = Site.DECODER, **params
) -> RotaryEncoding:
    """A RoPE encoding for two heads of ``head_dim`` dims with ``rope_proportion=proportion``."""
    return RotaryEncoding(site, 2 * head_dim, 2, 1, rope_proportion=proportion, **params)


def rotated(
    encoding: RotaryEncoding, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k (B, H, L, D)`` rotated by the module's fast path at ``positions (L,)``: in
    ``prepare`` (before caching), or at attention time for dynamic NTK's encoder."""
    context = encoding.context(positions, positions)
    rule = encoding.self_rule(0)
    if isinstance(rule, LengthEncoderRule):
        return rule.rotated(q, k, AttentionCall(positions, positions, False, None, context))
    q, k, _ = RotaryRule().prepare(q, k, None, positions, context=context)
    return q, k


def proportional_config(
    head_dim: int, proportion: float, factor: float | None = None
) -> LlamaConfig:
    """A transformers config with ``proportional`` RoPE on heads of ``head_dim`` dims."""
    params = {
        "rope_type": "proportional",
        "rope_theta": 10000.0,
        "partial_rotary_factor": proportion,
    }
    if factor is not None:
        params["factor"] = factor
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        max_position_embeddings=128,
        rope_parameters=params,
    )


def slow_prope(
    x: torch.Tensor, positions: torch.Tensor, proportion: float, base: float = 10000.0
) -> torch.Tensor:
    """The paper's p-RoPE one number at a time: pair ``(2i, 2i+1)`` of ``x (B, H, L, D)`` at
    position ``m`` turns by ``m * theta_i``, ``theta_i = base^(-2i/D)`` for the
    ``floor(p D / 2)`` first (highest-frequency) pairs and ``theta_i = 0`` after them."""
    batch, heads, length, head_dim = x.shape
    kept = math.floor(proportion * head_dim / 2)
    out = torch.empty_like(x)
    for b in range(batch):
        for h in range(heads):
            for m in range(length):
                for i in range(head_dim // 2):
                    theta = base ** (-2 * i / head_dim) if i < kept else 0.0
                    angle = positions[m].item() * theta
                    c, s = math.cos(angle), math.sin(angle)
                    x0, x1 = x[b, h, m, 2 * i].item(), x[b, h, m, 2 * i + 1].item()
                    out[b, h, m, 2 * i] = c * x0 - s * x1
                    out[b, h, m, 2 * i + 1] = s * x0 + c * x1
    return out


@pytest.mark.parametrize(("head_dim", "proportion"), CASES)
def test_inverse_frequencies_equal_transformers_proportional_rope(head_dim, proportion):
    expected, attention = ROPE_INIT_FUNCTIONS["proportional"](
        proportional_config(head_dim, proportion)
    )
    ours = make_prope(head_dim, proportion)
    torch.testing.assert_close(ours.inv_freq, expected, rtol=0, atol=0)
    assert ours.attention_factor == attention == 1.0
    kept = math.floor(proportion * head_dim / 2)
    assert bool((ours.inv_freq[:kept] > 0).all()) and bool((ours.inv_freq[kept:] == 0).all())


def test_transformers_factor_is_linear_scaling_of_the_kept_frequencies():
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](proportional_config(32, 0.5, factor=4.0))
    ours = make_prope(32, 0.5, scaling="linear", factor=4.0)
    torch.testing.assert_close(ours.inv_freq, expected, rtol=0, atol=0)


def test_kept_frequencies_are_ropes_over_the_whole_head_not_over_the_rotated_part():
    """What sets p-RoPE apart from ``rotary_fraction``: the exponent's denominator stays ``D``."""
    prope = make_prope(16, 0.5).inv_freq
    torch.testing.assert_close(prope[:4], make_prope(16, None).inv_freq[:4], rtol=0, atol=0)
    partial = make_prope(16, None, rotary_fraction=0.5).inv_freq
    assert not torch.allclose(prope[:4], partial)


@pytest.mark.parametrize(("head_dim", "proportion"), CASES)
def test_fast_rotation_equals_the_slow_reference(head_dim, proportion):
    encoding = make_prope(head_dim, proportion)
    positions = torch.tensor([0, 1, 2, 5, 13, 40])
    q, k = torch.randn(2, 2, 6, head_dim), torch.randn(2, 2, 6, head_dim)
    fast_q, fast_k = rotated(encoding, q, k, positions)
    torch.testing.assert_close(fast_q, slow_prope(q, positions, proportion), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast_k, slow_prope(k, positions, proportion), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("proportion", [0.25, 0.75])
def test_rotated_q_and_k_equal_transformers_llama_up_to_the_pair_layout(proportion):
    """Llama pairs dims ``(i, i + D/2)`` ("rotate half"), this module ``(2i, 2i+1)``: the same
    numbers once the head dims are permuted."""
    head_dim = 16
    order = torch.stack([torch.arange(8), torch.arange(8) + 8], dim=1).flatten()
    positions = torch.tensor([0, 1, 5, 40, 200])
    q, k = torch.randn(2, 2, 5, head_dim), torch.randn(2, 2, 5, head_dim)
    llama = LlamaRotaryEmbedding(proportional_config(head_dim, proportion))
    cos, sin = llama(q, positions[None])
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = rotated(
        make_prope(head_dim, proportion), q[..., order], k[..., order], positions
    )
    torch.testing.assert_close(ours_q, expected_q[..., order])
    torch.testing.assert_close(ours_k, expected_k[..., order])


@pytest.mark.parametrize("site", [Site.ENCODER, Site.DECODER])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_zeroed_pairs_are_exactly_unrotated_at_every_position(scaling, site):
    """The lowest ``D/2 - floor(p D / 2)`` pairs keep their values at every position, under every
    scaling (YaRN's temperature aside, which scales every pair); the others turn."""
    longrope = {"short_factor": [1.5] * 8, "long_factor": [2.0 + i for i in range(8)]}
    extra = longrope if scaling == "longrope" else {}
    encoding = make_prope(16, 0.5, site, scaling=scaling, factor=4.0, original_max_len=16, **extra)
    positions = torch.arange(0, 300, 7)  # past original_max_len: dynamic NTK's base changes
    q, k = torch.randn(2, 2, len(positions), 16), torch.randn(2, 2, len(positions), 16)
    rq, rk = rotated(encoding, q, k, positions)
    scale = encoding.attention_factor
    torch.testing.assert_close(rq[..., 8:], q[..., 8:] * scale, rtol=0, atol=0)
    torch.testing.assert_close(rk[..., 8:], k[..., 8:] * scale, rtol=0, atol=0)
    assert not torch.allclose(rq[..., 1:, :8], q[..., 1:, :8] * scale)


def test_the_default_leaves_rope_as_it_was(monkeypatch):
    """``rope_proportion: null`` builds the model the YAML built before the setting existed,
    number for number, and stays out of the run identity (run directories keep their names);
    ``1.0`` keeps every frequency, so it is plain RoPE too."""
    assert pe_config("rope")["rope_proportion"] is None
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 5))
    with torch.no_grad():
        default = tiny_model("rope")(src, tgt)
        every_frequency = tiny_model("rope", rope_proportion=1.0)(src, tgt)
        without_the_key = {k: v for k, v in pe_config("rope").items() if k != "rope_proportion"}
        monkeypatch.setattr(conftest, "pe_config", lambda name, **_: dict(without_the_key))
        before = tiny_model("rope")(src, tgt)
    torch.testing.assert_close(default, before, rtol=0, atol=0)
    torch.testing.assert_close(every_frequency, before, rtol=0, atol=0)
    assert "pe.rope_proportion" not in identity(plain(compose("pe=rope")))
    assert identity(plain(compose("pe=rope", "pe.rope_proportion=0.75")))["pe.rope_proportion"]


@pytest.mark.parametrize(
    ("head_dim", "params"),
    [
        (8, {"rope_proportion": 0.0}),
        (8, {"rope_proportion": -0.5}),
        (8, {"rope_proportion": 1.5}),
        (8, {"rope_proportion": math.nan}),
        (8, {"rope_proportion": "half"}),
        (8, {"rope_proportion": True}),
        (8, {"rope_proportion": 0.2}),  # floor(0.2 * 4) = 0 frequencies kept
        (16, {"rope_proportion": 0.5, "rotary_fraction": 0.5}),
    ],
)
def test_invalid_settings_fail_at_construction_in_one_line(head_dim, params):
    with pytest.raises(ValueError, match="rope_proportion") as error:
        RotaryEncoding(Site.DECODER, 2 * head_dim, 2, 1, **params)
    assert "\n" not in str(error.value)
