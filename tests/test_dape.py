"""Specification of DAPE (Zheng et al., NeurIPS 2024, arXiv 2405.14722), the ``dape`` option of
the bias encodings (ALiBi, KERPLE, FIRE, T5): the logits of self-attention become

    S + P + f(S, P),     S = q k^T / sqrt(D),  P the encoding's bias (H, Lq, Lk),

with ``f`` a per-layer MLP ``2H -> dape_hidden -> H`` (LeakyReLU) applied at every (query, key)
pair to the ``H`` scores and ``H`` biases of that pair. Keys a ``split`` head does not look at
keep their penalty: ``f`` reads a bias of 0 there and adds nothing."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import compose, pe_config, tiny_model

from posenc.config import plain
from posenc.config.identity import identity
from posenc.model.encodings import encoding_factory
from posenc.model.encodings.base import AttentionCall, AttentionRule, EncodingModule, Site
from posenc.model.encodings.common import SPLIT_PENALTY, DapeRule
from posenc.model.layers import DecoderCache
from posenc.training.optim import parameter_groups

NAMES = ["alibi", "kerple", "fire", "t5"]
FORMS = [
    ("alibi", {}),  # encoder: split
    ("alibi", {"encoder_bias": "asymmetric"}),
    ("kerple", {}),  # encoder: split
    ("kerple", {"encoder_bias": "symmetric"}),
    ("fire", {}),
    ("fire", {"share_layers": True}),
    ("t5", {}),
]
H, D = 4, 3


def _encoding(name: str, site: Site, dtype=torch.float64, **overrides):
    """A DAPE encoding of ``name`` for ``H`` heads of dim ``D``, with the rule of its layer 0."""
    torch.manual_seed(0)
    cfg = pe_config(name, dape=True, **overrides)
    encoding = encoding_factory(cfg)(site, d_model=H * D, n_heads=H, n_layers=2).to(dtype)
    rule = encoding.self_rule(0).to(dtype)
    return encoding, rule


def _split_blocked(h: int, i: int, j: int) -> bool:
    """Whether ``split`` head ``h`` does not look at key ``j`` from query ``i``: even heads look
    at keys at or before the query, odd heads at keys at or after it."""
    return j > i if h % 2 == 0 else j < i


def _reference_attention(q, k, v, bias, rule: DapeRule, q_pos, k_pos, causal, padding, split):
    """DAPE attention written out pair by pair: ``(B, H, Lq, D)``."""
    w1, b1, w2, b2 = rule.hidden.weight, rule.hidden.bias, rule.out.weight, rule.out.bias
    batch, heads, lq, dim = q.shape
    lk = k.shape[2]
    out = torch.zeros_like(q)
    for b in range(batch):
        logits = [[[None] * lk for _ in range(lq)] for _ in range(heads)]
        for i in range(lq):
            for j in range(lk):
                scores = [(q[b, h, i] * k[b, h, j]).sum() / math.sqrt(dim) for h in range(heads)]
                blocked = [
                    split and _split_blocked(h, int(q_pos[i]), int(k_pos[j])) for h in range(heads)
                ]
                seen = [bias[0, h, i, j] * (0.0 if blocked[h] else 1.0) for h in range(heads)]
                hidden = w1 @ torch.stack(scores + seen) + b1
                hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)  # LeakyReLU
                f = w2 @ hidden + b2
                for h in range(heads):
                    adjust = 0.0 if blocked[h] else f[h]
                    logits[h][i][j] = scores[h] + bias[0, h, i, j] + adjust
        for h in range(heads):
            for i in range(lq):
                keys = [
                    j
                    for j in range(lk)
                    if not (padding is not None and padding[b, j])
                    and not (causal and k_pos[j] > q_pos[i])
                ]
                weights = torch.softmax(torch.stack([logits[h][i][j] for j in keys]), dim=0)
                out[b, h, i] = (weights[:, None] * v[b, h, keys]).sum(0)
    return out


def _call(encoding, q_pos, k_pos, causal, padding):
    return AttentionCall(q_pos, k_pos, causal, padding, context=encoding.context(q_pos, k_pos))


CALLS = {
    # site, q_pos, k_pos, key padding of batch item 1 (from this key on)
    "encoder": (Site.ENCODER, torch.arange(6), torch.arange(6), 4),
    "decoder": (Site.DECODER, torch.arange(6), torch.arange(6), None),
    "decoder-chunk": (Site.DECODER, torch.arange(3, 6), torch.arange(6), None),
}


@pytest.mark.parametrize("call_kind", list(CALLS))
@pytest.mark.parametrize(("name", "overrides"), FORMS, ids=lambda v: v or "default")
def test_the_fast_path_equals_the_formula_pair_by_pair(name, overrides, call_kind):
    """Values and gradients (q, k, v, the MLP, the encoding's own parameters) in float64."""
    site, q_pos, k_pos, pad_from = CALLS[call_kind]
    encoding, rule = _encoding(name, site, **overrides)
    assert isinstance(rule, DapeRule)
    with torch.no_grad():
        for param in [*encoding.parameters(), *rule.parameters()]:
            param.add_(0.1 * torch.randn_like(param))
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, H, len(q_pos), D, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, H, len(k_pos), D, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, H, len(k_pos), D, dtype=torch.float64, generator=gen, requires_grad=True)
    padding = None
    if pad_from is not None:
        padding = torch.zeros(2, len(k_pos), dtype=torch.bool)
        padding[1, pad_from:] = True
    causal = site is Site.DECODER
    split = name in ("alibi", "kerple") and not causal
    split = split and overrides.get("encoder_bias", "split") == "split"
    params = list({id(p): p for p in [*encoding.parameters(), *rule.parameters()]}.values())
    tensors = [q, k, v, *params]
    weights = torch.randn(2, H, len(q_pos), D, dtype=torch.float64, generator=gen)

    call = _call(encoding, q_pos, k_pos, causal, padding)
    fast = rule(q, k, v, None, call)
    fast_grads = torch.autograd.grad((fast * weights).sum(), tensors, allow_unused=True)

    call = _call(encoding, q_pos, k_pos, causal, padding)
    bias = rule.inner.bias(q, k, None, call)
    slow = _reference_attention(q, k, v, bias, rule, q_pos, k_pos, causal, padding, split)
    slow_grads = torch.autograd.grad((slow * weights).sum(), tensors, allow_unused=True)

    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-10)
    for tensor, a, b in zip(tensors, fast_grads, slow_grads, strict=True):
        if a is None or b is None:
            assert a is None and b is None, tensor.shape
            continue
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert all(g is not None for g in fast_grads[:3])
    assert fast_grads[3 + [id(p) for p in params].index(id(rule.out.weight))].abs().sum() > 0


@pytest.mark.parametrize("chunks", [(1,) * 8, (3, 1, 4)], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_cached_decoding_equals_teacher_forcing_and_never_looks_ahead(name, chunks):
    """One token or several at a time onto the cache give the teacher-forced logits, greedy
    generation with and without the cache agree, and a later target token changes nothing
    before it."""
    model = tiny_model(name, dape=True).eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 8))
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_pad = model.encode(src)
        cache, steps, start = DecoderCache(), [], 0
        for size in chunks:
            steps.append(model.decode(tgt[:, start : start + size], memory, src_pad, cache))
            start += size
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-4)
        changed = tgt.clone()
        changed[:, 5:] = torch.randint(3, 40, (2, 3))
        later = model(src, changed)
    torch.testing.assert_close(later[:, :5], full[:, :5])
    assert not torch.allclose(later[:, 5:], full[:, 5:])
    cached = model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=True)
    assert cached == model.generate(src, max_len_a=2.0, max_len_b=5, use_cache=False)


def _dape_twin(name: str, plain_model, **overrides):
    """A DAPE model with ``plain_model``'s weights and its MLPs' output layers zeroed."""
    model = tiny_model(name, dape=True, **overrides)
    source = plain_model.state_dict()
    state = model.state_dict()
    mlp_keys = []
    for key in state:
        plain_key = key.replace("rule.inner.", "rule.")
        if plain_key in source:
            state[key] = source[plain_key].clone()
        else:
            assert ".rule.hidden." in key or ".rule.out." in key, key
            mlp_keys.append(key)
            if ".rule.out." in key:
                state[key] = torch.zeros_like(state[key])
    model.load_state_dict(state)
    assert len(mlp_keys) == 4 * (2 + 2)  # 2 layers x 2 stacks, 2 linear layers of 2 tensors
    return model


@pytest.mark.parametrize(("name", "overrides"), FORMS, ids=lambda v: v or "default")
def test_with_the_output_layer_zeroed_dape_is_the_plain_encoding_exactly(name, overrides):
    plain_model = tiny_model(name, **overrides).eval()
    model = _dape_twin(name, plain_model, **overrides).eval()
    src = torch.randint(3, 40, (2, 8))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), plain_model(src, tgt))
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
        assert not torch.allclose(model(src, tgt), plain_model(src, tgt))


@pytest.mark.parametrize("name", NAMES)
def test_equal_biases_with_different_content_get_different_adjustments(name):
    """The MLP reads the scores: the same positions (so the same bias) with other q/k give
    another adjustment, and each pair's adjustment depends on that pair alone."""
    encoding, rule = _encoding(name, Site.DECODER)
    pos = torch.arange(5)
    call = _call(encoding, pos, pos, True, None)
    q, k = torch.randn(2, 1, H, 5, D, dtype=torch.float64).unbind(0)
    other_q = torch.randn_like(q)
    with torch.no_grad():
        plain_bias = rule.inner.bias(q, k, None, call)
        assert torch.equal(plain_bias, rule.inner.bias(other_q, k, None, call))
        a, b = rule.bias(q, k, None, call), rule.bias(other_q, k, None, call)
        assert (a - b).abs().amin() > 0  # every entry moves
        changed_key = k.clone()
        changed_key[:, :, 2] += 1.0
        c = rule.bias(q, changed_key, None, call)
    moved = (c != a).any(dim=1)[0]  # (Lq, Lk): which pairs the change reached
    assert moved[:, 2].all() and not moved[:, [0, 1, 3, 4]].any()


def test_split_heads_keep_their_mask_and_the_mlp_reads_zero_there():
    encoding, rule = _encoding("alibi", Site.ENCODER)
    pos = torch.arange(6)
    call = _call(encoding, pos, pos, False, None)
    q, k = torch.randn(2, 2, H, 6, D, dtype=torch.float64).unbind(0)
    with torch.no_grad():
        bias = rule.bias(q, k, None, call)
    blocked = torch.tensor(
        [[[_split_blocked(h, i, j) for j in range(6)] for i in range(6)] for h in range(H)]
    )
    assert (bias[:, blocked] == SPLIT_PENALTY).all()
    assert (bias[:, ~blocked] > SPLIT_PENALTY / 2).all()
    assert rule.masking_bias == SPLIT_PENALTY


@pytest.mark.parametrize("name", NAMES)
def test_each_layer_has_its_own_mlp_which_weight_decay_leaves_alone(name):
    model = tiny_model(name, dape=True, layers=3)
    for stack in (model.encoder, model.decoder):
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert all(isinstance(rule, DapeRule) for rule in rules)
        assert len({id(rule.hidden.weight) for rule in rules}) == 3
        assert rules[0].hidden.weight.shape == (32, 2 * 4)
        assert rules[0].out.weight.shape == (4, 32)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    _, no_decay = parameter_groups(model, weight_decay=0.01)
    in_no_decay = {id(p) for p in no_decay["params"]}
    mlps = [m for m in model.modules() if isinstance(m, DapeRule)]
    assert all(isinstance(m, EncodingModule) for m in mlps)
    assert {id(p) for m in mlps for p in m.parameters()} <= in_no_decay


def test_dape_hidden_sets_the_width():
    model = tiny_model("alibi", dape=True, dape_hidden=8)
    assert model.encoder.layers[0].self_attn.rule.hidden.weight.shape == (8, 8)


@pytest.mark.parametrize("name", NAMES)
def test_scores_and_mlp_run_in_float32_under_bf16_autocast(name):
    encoding, rule = _encoding(name, Site.DECODER, dtype=torch.float32)
    pos = torch.arange(5)
    call = _call(encoding, pos, pos, True, None)
    q, k = torch.randn(2, 2, H, 5, D).bfloat16().unbind(0)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = rule.bias(q, k, None, call)
        exact = rule.bias(q.float(), k.float(), None, call)
    assert low.dtype is torch.float32
    torch.testing.assert_close(low, exact, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"dape": True, "dape_hidden": 0}, ["dape_hidden=0", "pe.dape_hidden=32"]),
        ({"dape": True, "dape_hidden": -4}, ["dape_hidden=-4", "pe.dape_hidden=32"]),
        ({"dape": True, "dape_hidden": 2.5}, ["dape_hidden=2.5", "pe.dape_hidden=32"]),
        ({"dape": True, "dape_hidden": True}, ["dape_hidden=True", "pe.dape_hidden=32"]),
        ({"dape": "yes"}, ["dape='yes'", "pe.dape=true"]),
        ({"dape_hidden": 64}, ["dape_hidden=64", "pe.dape=true"]),
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_bad_settings_are_refused_in_one_line(name, settings, words):
    with pytest.raises(ValueError) as info:
        encoding_factory(pe_config(name, **settings))(Site.ENCODER, 16, 2, 1)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("name", NAMES)
def test_off_by_default_and_absent_from_the_run_identity(name):
    """``dape: null`` in the YAML: the model and the run identity of runs from before the
    setting existed."""
    cfg = pe_config(name)
    assert cfg["dape"] is None and cfg["dape_hidden"] is None
    assert not isinstance(tiny_model(name).encoder.layers[0].self_attn.rule, DapeRule)
    assert not any(key.startswith("pe.dape") for key in identity(plain(compose(f"pe={name}"))))
    on = identity(plain(compose(f"pe={name}", "pe.dape=true")))
    assert on["pe.dape"] is True and "pe.dape_hidden" not in on
