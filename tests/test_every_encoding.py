"""Properties every encoding in ``configs/pe/`` must have, checked on a tiny model."""

from __future__ import annotations

import pytest
import torch
from conftest import PE_NAMES, pe_config, tiny_model

from posenc.model.attention import MultiHeadAttention
from posenc.model.encodings import encoding_class
from posenc.model.encodings.base import AttentionCall, AttentionRule, EncodingModule
from posenc.model.layers import DecoderCache, FeedForward
from posenc.training.optim import parameter_groups

OPTION_FORMS = [
    (name, dict(overrides))
    for name in PE_NAMES
    for overrides in encoding_class(pe_config(name)["_target_"], name).option_forms
]
"""The forms that configs choose between, as each encoding class declares them
(:attr:`StackEncoding.option_forms`), run besides each config's own."""
SINK_FORMS = [
    (name, {"sinks": True})
    for name in ("nonepe", "sinpe", "learned", "rope", "hope", "alibi", "t5", "kerple", "fire")
]
"""``pe.sinks`` on encodings of each kind whose attention is the default softmax (input-level,
rotary, bias): the option any such encoding accepts (``tests/test_sinks.py``)."""

every_form = pytest.mark.parametrize(
    ("name", "overrides"),
    [(name, {}) for name in PE_NAMES] + OPTION_FORMS + SINK_FORMS,
    ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value.values())),
)


@pytest.mark.parametrize("name", PE_NAMES)
def test_cached_greedy_decoding_gives_the_same_tokens_as_full_recomputation(name):
    model = tiny_model(name).eval()
    src = torch.randint(3, 40, (4, 9))
    src[1, 6:] = 0
    src[3, 3:] = 0
    cached = model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=True)
    full = model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=False)
    assert cached == full
    assert any(len(row) > 3 for row in cached)


def _decode_in_chunks(model, src, tgt, chunks):
    """Logits ``(B, Lt, V)`` of ``tgt`` fed to the cached decoder ``chunks[0]`` tokens first,
    then ``chunks[1]`` more, and so on."""
    memory, src_pad = model.encode(src)
    cache = DecoderCache()
    steps, start = [], 0
    for size in chunks:
        steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
        start += size
    assert start == tgt.shape[1] and cache.length == start
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("chunks", [(1,) * 10, (3, 2, 1, 4), (4, 6), (10,)], ids=str)
@pytest.mark.parametrize("name", PE_NAMES)
def test_cached_decoding_in_any_chunks_equals_teacher_forcing(name, chunks):
    """Feeding the decoder one token or several at a time onto its cache (beam search,
    speculative or chunked decoding) gives the teacher-forced logits."""
    model = tiny_model(name).eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 10))
    with torch.no_grad():
        full = model(src, tgt)
        chunked = _decode_in_chunks(model, src, tgt, chunks)
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-4)


@every_form
def test_every_encoding_computes_in_float64(name, overrides):
    """A float64 model computes in float64 throughout: teacher forcing and chunked cached
    decoding agree to float64 precision, which exact reference tests rely on."""
    model = tiny_model(name, **overrides).double().eval()
    src = torch.randint(3, 40, (2, 7))
    src[0, 4:] = 0
    tgt = torch.randint(3, 40, (2, 9))
    with torch.no_grad():
        full = model(src, tgt)
        chunked = _decode_in_chunks(model, src, tgt, (2, 3, 1, 3))
    assert full.dtype is torch.float64
    torch.testing.assert_close(chunked, full, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("name", PE_NAMES)
def test_the_decoder_never_looks_ahead(name):
    model = tiny_model(name).eval()
    src = torch.randint(3, 40, (2, 7))
    tgt = torch.randint(3, 40, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(3, 40, (2, 3))
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@every_form
def test_source_padding_does_not_change_the_output(name, overrides):
    model = tiny_model(name, **overrides).eval()
    src = torch.randint(3, 40, (1, 6))
    padded = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    tgt = torch.randint(3, 40, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-4)


@every_form
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_nan_or_inf_at_length_1024(name, overrides, dtype):
    if "max_len" in pe_config(name):  # learned tables refuse positions beyond their rows
        overrides = {**overrides, "max_len": 1024}
    model = tiny_model(name, d_model=16, n_heads=2, layers=1, **overrides)
    src = torch.randint(3, 40, (1, 1024))
    tgt = torch.randint(3, 40, (1, 1024))
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is torch.bfloat16):
        logits = model(src, tgt)
        loss = logits.float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(logits.float()).all()
    for param in model.parameters():
        if param.grad is not None:
            assert torch.isfinite(param.grad).all()


@every_form
def test_an_encoding_sees_source_order_exactly_when_it_says_so(name, overrides):
    """An encoding that claims position information translates a source and its reversal
    differently; one that does not (nonepe, symmetric distance biases; declared in the guide
    table) gives the same logits. Parameters are perturbed so that learned tables that start at
    zero (CoPE) carry positions too."""
    model = tiny_model(name, **overrides).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    src = torch.randint(3, 40, (2, 8))
    src[1, 5:] = 0
    lengths = src.ne(0).sum(1)
    reversed_src = src.clone()
    for row, length in enumerate(lengths.tolist()):
        reversed_src[row, :length] = src[row, :length].flip(0)
    tgt = torch.randint(3, 40, (2, 6))
    with torch.no_grad():
        delta = (model(src, tgt) - model(reversed_src, tgt)).abs().max().item()
    if model.encoder.encoding.sees_source_order:
        assert delta > 1e-3, f"the encoder cannot tell a source from its reversal ({delta:.1e})"
    else:
        assert delta < 1e-4, f"declared blind to word order, yet differs by {delta:.1e}"


@every_form
def test_every_parameter_gets_a_gradient(name, overrides):
    """At a point away from initialisation (parameters perturbed): a factor that starts at zero
    (TAPE's ``W_up``, as its code starts) holds back the gradients of the matrices it
    multiplies at the first step only."""
    model = tiny_model(name, **overrides)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    src = torch.randint(3, 40, (2, 9))
    tgt = torch.randint(3, 40, (2, 8))
    model(src, tgt).logsumexp(-1).mean().backward()
    for pname, param in model.named_parameters():
        assert param.requires_grad, pname
        assert param.grad is not None and param.grad.abs().sum() > 0, pname


@every_form
def test_weight_decay_follows_one_rule_for_every_encoding(name, overrides):
    """Decayed: exactly the attention projections and feed-forward matrices. Not decayed:
    embeddings (the tied output layer), norms, biases and every parameter of an encoding
    (position tables, gates, slopes, kernels). Each parameter is in exactly one group."""
    model = tiny_model(name, **overrides)
    decay, no_decay = parameter_groups(model, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    in_decay = {id(p) for p in decay["params"]}
    in_no_decay = {id(p) for p in no_decay["params"]}
    assert not in_decay & in_no_decay
    assert in_decay | in_no_decay == {id(p) for p in model.parameters()}
    expected = set()
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            expected |= {id(module.q_proj.weight), id(module.kv_proj.weight)}
            expected.add(id(module.out_proj.weight))
        elif isinstance(module, FeedForward):
            expected |= {id(module.up.weight), id(module.down.weight)}
    assert in_decay == expected
    owned_by_encodings = {
        id(p) for m in model.modules() if isinstance(m, EncodingModule) for p in m.parameters()
    }
    assert owned_by_encodings <= in_no_decay


@pytest.mark.parametrize("name", PE_NAMES)
def test_attention_weights_are_what_the_layer_applies(name):
    """``attention_weights`` (used by plots and reports) reproduces the layer's own output."""
    model = tiny_model(name).eval()
    layer = model.encoder.layers[0].self_attn
    x = torch.randn(2, 7, 32)
    positions = torch.arange(7)
    for encoding, causal in [(model.encoder.encoding, False), (model.decoder.encoding, True)]:
        attn = model.decoder.layers[0].self_attn if causal else layer
        call = AttentionCall(
            positions, positions, causal, context=encoding.context(positions, positions)
        )
        weights = attn.attention_weights(x, call)
        assert weights.shape == (2, 4, 7, 7)
        assert (weights >= 0).all() and (weights.sum(-1) <= 1 + 1e-5).all()
        if causal:
            assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize("name", PE_NAMES)
def test_cross_attention_carries_no_position_information(name):
    """Source and target positions do not lie on one axis: permuting the memory's positions
    changes nothing in cross-attention."""
    model = tiny_model(name).eval()
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    attn = model.decoder.layers[0].cross_attn
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    perm = torch.randperm(7)
    call = AttentionCall(torch.arange(5), torch.arange(7), causal=False)
    with torch.no_grad():
        torch.testing.assert_close(
            attn(x, call, memory=memory), attn(x, call, memory=memory[:, perm])
        )


def long_position_drift(model, length: int = 1040, span: int = 16) -> tuple[float, float]:
    """How far bf16-autocast logits fall from float32 ones, per position (mean absolute
    difference over the vocabulary over the float32 logits' spread), averaged over the first
    and over the last ``span`` positions of a ``length``-token source and target."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
        src, tgt = torch.randint(3, 40, (1, length)), torch.randint(3, 40, (1, length))
        exact = model(src, tgt).float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(src, tgt).float()
    drift = (low - exact).abs().mean(-1)[0] / exact.std()
    return float(drift[:span].mean()), float(drift[-span:].mean())


@every_form
def test_bf16_autocast_keeps_positions_near_1000_as_exact_as_the_first(name, overrides):
    """Under bf16 autocast every encoding computes its angles, distances and tables in float32
    (a rotary angle m * theta in bf16 is off by radians at m = 1000: transformers issues 25681
    and 29496): the logits at positions near 1,000 drift from float32 no more than at the
    first positions, beyond bf16's own rounding of the matrix products."""
    if "max_len" in pe_config(name):
        overrides = {**overrides, "max_len": 1100}
    early, late = long_position_drift(tiny_model(name, d_model=32, layers=1, **overrides).eval())
    assert late <= 2 * early + 1e-3, (early, late)


def test_the_drift_check_catches_angles_computed_in_bf16(monkeypatch):
    import posenc.model.encodings.rotary as rotary

    def bf16_angles(positions, inv_freq, scale=1.0):  # the bug: the autocast dtype's angles
        low = torch.bfloat16 if torch.is_autocast_enabled("cpu") else torch.float32
        angles = (positions.to(low)[:, None] * inv_freq.to(low)).float()
        return torch.complex(angles.cos() * scale, angles.sin() * scale)

    monkeypatch.setattr(rotary, "rotation_table", bf16_angles)
    early, late = long_position_drift(tiny_model("rope", d_model=32, layers=1).eval())
    assert late > 4 * early
