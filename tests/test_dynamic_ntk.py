"""Dynamic NTK scaling of RoPE (``rope`` with ``scaling: dynamic_ntk``, a test-time variant):
transformers' ``dynamic`` frequencies at every length, RoPE itself up to the training length, a
decoder whose positions keep the base of the length they complete (so that cached decoding
equals teacher forcing) and an encoder at each source's own length."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.rope_scaling import dynamic_ntk_inverse_frequencies
from posenc.model.encodings.rotary import LengthEncoderRule, LengthTables, RotaryEncoding
from posenc.model.encodings.rotation import RotaryRule
from posenc.model.layers import DecoderCache

DYNAMIC = {"scaling": "dynamic_ntk", "factor": 4.0}
LONGROPE = {  # tiny_model's heads have 8 dims: 4 rotated pairs
    "scaling": "longrope",
    "factor": 4.0,
    "short_factor": [1.0, 1.2, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
}
length_following = pytest.mark.parametrize(
    "scaling", [DYNAMIC, LONGROPE], ids=lambda params: params["scaling"]
)
"""The scalings whose frequencies follow the sequence length share these properties."""


def make_dynamic(
    site: Site, head_dim: int = 8, original_max_len: int = 16, **params
) -> RotaryEncoding:
    params = {**DYNAMIC, "original_max_len": original_max_len, **params}
    return RotaryEncoding(site, 2 * head_dim, 2, 1, **params)


def rotated(encoding: RotaryEncoding, q, k, positions, key_padding_mask=None):
    """The fast path of either stack: the decoder rotates in ``prepare`` (before caching), the
    encoder at attention time."""
    context = encoding.context(positions, positions)
    if encoding.causal:
        q, k, _ = RotaryRule().prepare(q, k, None, positions, context=context)
        return q, k
    call = AttentionCall(positions, positions, False, key_padding_mask, context)
    return LengthEncoderRule().rotated(q, k, call)


def dynamic_base(length: int, head_dim: int, factor: float, trained: int) -> float:
    """The formula: ``10000 (factor L / trained - factor + 1)^(D/(D-2))`` past ``trained``."""
    if length <= trained:
        return 10000.0
    return 10000.0 * (factor * length / trained - factor + 1) ** (head_dim / (head_dim - 2))


def paper_rotate(x: torch.Tensor, base_of) -> torch.Tensor:
    """One 2x2 rotation at a time: pair ``(2i, 2i+1)`` of sequence ``b`` at position ``m`` of
    ``x (B, H, L, D)`` turns by ``m * base^(-2i/D)``, ``base = base_of(b, m)``."""
    out = x.clone()
    head_dim = x.shape[-1]
    for b in range(x.shape[0]):
        for m in range(x.shape[2]):
            for i in range(head_dim // 2):
                angle = m * base_of(b, m) ** (-2 * i / head_dim)
                c, s = math.cos(angle), math.sin(angle)
                matrix = torch.tensor([[c, -s], [s, c]], dtype=x.dtype)
                for h in range(x.shape[1]):
                    out[b, h, m, 2 * i : 2 * i + 2] = matrix @ x[b, h, m, 2 * i : 2 * i + 2]
    return out


def assert_same_rotation_and_gradients(fast, reference, q, k) -> None:
    """Forward to float32 tables' precision, and the gradients of a loss on both."""
    for got, want in zip(fast, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weight = torch.randn_like(q)

    def grads(rq, rk):
        loss = (rq * weight).sum() + (rq @ rk.transpose(-1, -2)).sum()
        return torch.autograd.grad(loss, (q, k))

    for got, want in zip(grads(*fast), grads(*reference), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def qk(batch: int, length: int, head_dim: int = 8):
    return (
        torch.randn(batch, 2, length, head_dim, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )


def test_decoder_positions_turn_at_the_base_of_the_length_they_complete():
    encoding = make_dynamic(Site.DECODER, original_max_len=4)
    q, k = qk(2, 11)
    fast = rotated(encoding, q, k, torch.arange(11))
    reference = [paper_rotate(x, lambda b, m: dynamic_base(m + 1, 8, 4.0, 4)) for x in (q, k)]
    assert_same_rotation_and_gradients(fast, reference, q, k)


def test_encoder_sources_turn_at_the_base_of_their_own_length():
    encoding = make_dynamic(Site.ENCODER, original_max_len=4)
    q, k = qk(3, 9)
    lengths = [9, 3, 6]
    mask = torch.arange(9)[None, :] >= torch.tensor(lengths)[:, None]
    fast = rotated(encoding, q, k, torch.arange(9), mask)
    reference = [paper_rotate(x, lambda b, m: dynamic_base(lengths[b], 8, 4.0, 4)) for x in (q, k)]
    assert_same_rotation_and_gradients(fast, reference, q, k)


def llama_config(head_dim: int, fraction: float, trained: int) -> LlamaConfig:
    rope = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}
    return LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        max_position_embeddings=trained,
        rope_parameters={**rope, "partial_rotary_factor": fraction},
    )


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("length", [1, 64, 128, 129, 200, 1000, 5000])
def test_inverse_frequencies_match_transformers_dynamic_rope_at_every_length(length, fraction):
    ours = make_dynamic(Site.ENCODER, 32, original_max_len=128, rotary_fraction=fraction)
    expected, attention = ROPE_INIT_FUNCTIONS["dynamic"](
        llama_config(32, fraction, 128), seq_len=length
    )
    got = dynamic_ntk_inverse_frequencies(ours.inv_freq, 4.0, 128, torch.tensor([length]))
    torch.testing.assert_close(got[0], expected)
    assert attention == 1.0


def llama_order(head_dim: int) -> torch.Tensor:
    """Index ``p`` with ``x_ours = x_llama[..., p]``: Llama's pair ``(i, i + D/2)`` is ours
    ``(2i, 2i + 1)``."""
    half = torch.arange(head_dim // 2)
    return torch.stack([half, half + head_dim // 2], dim=1).flatten()


@pytest.mark.parametrize("length", [40, 128, 300])
def test_a_source_is_rotated_as_llama_rotates_a_whole_prompt(length):
    head_dim, order = 32, llama_order(32)
    q, k = torch.randn(1, 2, length, head_dim), torch.randn(1, 2, length, head_dim)
    positions = torch.arange(length)
    llama = LlamaRotaryEmbedding(llama_config(head_dim, 1.0, 128))
    expected_q, expected_k = apply_rotary_pos_emb(q, k, *llama(q, positions[None]))
    encoder = make_dynamic(Site.ENCODER, head_dim, 128)
    ours_q, ours_k = rotated(encoder, q[..., order], k[..., order], positions)
    torch.testing.assert_close(ours_q, expected_q[..., order], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours_k, expected_k[..., order], rtol=1e-4, atol=1e-4)


def test_a_target_is_rotated_as_llamas_cached_generation_rotates_one_token_at_a_time():
    """transformers recomputes the frequencies at each step for the length so far and rotates
    the new token with them: the teacher-forced decoder's rotation, position by position."""
    head_dim, order, length = 32, llama_order(32), 200
    q, k = torch.randn(1, 2, length, head_dim), torch.randn(1, 2, length, head_dim)
    llama = LlamaRotaryEmbedding(llama_config(head_dim, 1.0, 128))
    steps = [
        apply_rotary_pos_emb(q[:, :, m : m + 1], k[:, :, m : m + 1], *llama(q, torch.tensor([[m]])))
        for m in range(length)
    ]
    expected_q, expected_k = (torch.cat(parts, dim=2) for parts in zip(*steps, strict=True))
    decoder = make_dynamic(Site.DECODER, head_dim, 128)
    ours_q, ours_k = rotated(decoder, q[..., order], k[..., order], torch.arange(length))
    torch.testing.assert_close(ours_q, expected_q[..., order], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours_k, expected_k[..., order], rtol=1e-4, atol=1e-4)


def test_up_to_the_training_length_it_is_rope_and_beyond_the_slowest_wavelength_grows():
    rope = make_dynamic(Site.ENCODER, 16, 32, scaling="none")

    def frequencies(length: int) -> torch.Tensor:
        return dynamic_ntk_inverse_frequencies(rope.inv_freq, 4.0, 32, torch.tensor([length]))[0]

    for length in (1, 5, 32):
        assert torch.equal(frequencies(length), rope.inv_freq)
    wavelengths = [2 * math.pi / frequencies(n)[-1] for n in (32, 33, 64, 256, 4096)]
    assert all(a < b for a, b in zip(wavelengths, wavelengths[1:], strict=False))
    assert frequencies(4096)[0] == rope.inv_freq[0] == 1.0  # theta_0 = base^0, any base


def test_a_model_within_its_training_length_is_the_rope_model():
    rope = tiny_model("rope", original_max_len=16)
    dynamic = tiny_model("rope", original_max_len=16, **DYNAMIC)
    dynamic.load_state_dict(rope.state_dict())
    src, tgt = torch.randint(3, 40, (2, 12)), torch.randint(3, 40, (2, 15))
    src[1, 8:] = 0
    with torch.no_grad():
        torch.testing.assert_close(dynamic(src, tgt), rope(src, tgt), rtol=0, atol=1e-6)
    assert dynamic.generate(src, max_len_a=1.0, max_len_b=3) == rope.generate(
        src, max_len_a=1.0, max_len_b=3
    )


@pytest.mark.parametrize("chunks", [(1,) * 10, (3, 2, 1, 4), (4, 6)], ids=str)
@length_following
def test_cached_decoding_in_any_chunks_equals_teacher_forcing_beyond_the_training_length(
    chunks, scaling
):
    model = tiny_model("rope", original_max_len=3, **scaling).eval()
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 10))
    src[1, 5:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache = DecoderCache()
        steps, start = [], 0
        for size in chunks:
            steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
            start += size
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)


@length_following
def test_cached_greedy_decoding_gives_the_tokens_of_full_recomputation_beyond_training(scaling):
    model = tiny_model("rope", original_max_len=3, **scaling).eval()
    src = torch.randint(3, 40, (3, 9))
    src[2, 4:] = 0
    cached = model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=True)
    assert cached == model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=False)
    assert max(map(len, cached)) > 3


def test_lengths_of_1024_under_bfloat16_autocast_stay_finite():
    model = tiny_model("rope", d_model=16, n_heads=2, layers=1, original_max_len=32, **DYNAMIC)
    src, tgt = torch.randint(3, 40, (1, 1024)), torch.randint(3, 40, (1, 1024))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    logits.float().logsumexp(-1).mean().backward()
    assert torch.isfinite(logits.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@length_following
def test_a_sources_base_follows_its_own_length_not_the_batch_or_its_padding(scaling):
    model = tiny_model("rope", original_max_len=3, **scaling).eval()
    src = torch.randint(3, 40, (2, 8))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 4))
    with torch.no_grad():
        batch = model(src, tgt)
        alone = model(src[1:, :5], tgt[1:])
        padded = model(torch.cat([src, torch.zeros(2, 6, dtype=torch.long)], 1), tgt)
    torch.testing.assert_close(batch[1:], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded, batch, atol=1e-5, rtol=1e-4)


def test_the_encoder_layers_of_a_call_share_one_table():
    tables = make_dynamic(Site.ENCODER, original_max_len=2).context(
        torch.arange(5), torch.arange(5)
    )
    assert isinstance(tables, LengthTables)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    assert tables.table(mask) is tables.table(mask)


@pytest.mark.parametrize(
    ("params", "message"),
    [({"original_max_len": 0}, "original_max_len"), ({"rotary_fraction": 0.25}, "2 rotated")],
)
def test_invalid_settings_fail_at_construction(params, message):
    with pytest.raises(ValueError, match=message):
        make_dynamic(Site.DECODER, 8, **params)
