"""Specification of TAPE (``pe=tape``): position states that multiply q and k pairwise, start as
RoPE's and are updated in every layer by the attention weights and by a gated mix of heads
from the feed-forward's output, as the authors' code computes them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.base import AttentionCall, Site
from posenc.model.encodings.tape import PositionStates, TapeEncoding, TapeRule


def trained_rule(n_heads=2, d_model=8, channels=3) -> TapeRule:
    torch.manual_seed(0)
    rule = TapeRule(0, d_model, n_heads, channels).double()
    with torch.no_grad():  # trained-looking updates
        for param in rule.parameters():
            param.normal_(0.0, 0.5)
    return rule


def code_layout(x: torch.Tensor) -> torch.Tensor:
    """posenc's pairs ``(2i, 2i+1)`` -> the code's ``(i, i + D/2)``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference_layer(rule, q, k, v, z, y, causal):
    """The code's formulas, loop by loop, in its layout: ``E_c, E_s`` the states' real and
    imaginary parts repeated over both halves; ``q' = q E_c + rotate_half(q) E_s``; softmax
    attention; ``E <- E + rowsum(W_post)_h A E``; ``E <- E + W_down (SiLU(y W_x) (W_up E))``.
    Returns the attention output and the states after attention and after the feed-forward,
    all in the code's layout."""
    batch, heads, length, dim = q.shape
    e_c = torch.cat((z.real, z.real), dim=-1)
    e_s = torch.cat((z.imag, z.imag), dim=-1)
    q, k, v = code_layout(q), code_layout(k), code_layout(v)
    q = q * e_c + rotate_half(q) * e_s
    k = k * e_c + rotate_half(k) * e_s
    post, gate, up, down = (p.detach() for p in (rule.post, rule.gate, rule.up, rule.down))
    out = torch.zeros_like(v)
    mid_c, mid_s = e_c.clone(), e_s.clone()
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                keys = range(i + 1) if causal else range(length)
                scores = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(dim) for j in keys]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                weights = [w / sum(weights) for w in weights]
                s_h = float(post[h].sum())
                for w, j in zip(weights, keys, strict=True):
                    out[b, h, i] += w * v[b, h, j]
                    mid_c[b, h, i] += s_h * w * e_c[b, h, j]
                    mid_s[b, h, i] += s_h * w * e_s[b, h, j]
    new_c, new_s = mid_c.clone(), mid_s.clone()
    for b in range(batch):
        for i in range(length):
            g = [y[b, i] @ gate[p] for p in range(gate.shape[0])]
            g = [x / (1 + math.exp(-x)) for x in map(float, g)]
            for h in range(heads):
                for p in range(gate.shape[0]):
                    for e in range(heads):
                        w = float(down[h, p]) * g[p] * float(up[p, e])
                        new_c[b, h, i] += w * mid_c[b, e, i]
                        new_s[b, h, i] += w * mid_s[b, e, i]
    return out, (mid_c, mid_s), (new_c, new_s)


def halves(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """posenc's real state ``(..., D)`` as the code's ``E_c, E_s``."""
    z = torch.view_as_complex(state.unflatten(-1, (-1, 2)).contiguous())
    return torch.cat((z.real, z.real), -1), torch.cat((z.imag, z.imag), -1)


@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_one_layer_follows_the_code_formulas_loop_by_loop(causal):
    rule = trained_rule()
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    z = torch.polar(
        torch.rand(2, 2, 5, 2, dtype=torch.float64) + 0.5,
        torch.randn(2, 2, 5, 2, dtype=torch.float64),
    )
    y = torch.randn(2, 5, 8, dtype=torch.float64)
    states = PositionStates({(0, 0): torch.view_as_real(z).flatten(-2)})
    call = AttentionCall(
        q_pos=torch.arange(5), k_pos=torch.arange(5), causal=causal, context=states
    )
    q2, k2, key_state = rule.prepare(q, k, y, call.q_pos, states)
    out = rule(q2, k2, v, key_state, call)
    rule.after_feedforward(y, call)
    want_out, want_mid, want_new = reference_layer(rule, q, k, v, z, y, causal)
    torch.testing.assert_close(code_layout(out), want_out)
    for got, want in zip(halves(states.states[(0, 1)]), want_mid, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(halves(states.states[(1, 0)]), want_new, strict=True):
        torch.testing.assert_close(got, want)


def test_a_new_model_is_rope_exactly():
    tape = tiny_model("tape").double().eval()
    rope = tiny_model("rope").double().eval()
    missing, unexpected = rope.load_state_dict(tape.state_dict(), strict=False)
    assert not missing and all(".rule." in name for name in unexpected)
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(tape(src, tgt), rope(src, tgt), rtol=1e-12, atol=1e-12)


def test_shifting_every_position_changes_nothing_even_after_training():
    """The updates are linear in the states with real coefficients, so one phase per pair
    common to all tokens (a shift of every position) cancels in every score."""
    model = tiny_model("tape", layers=3, rope_init=False).double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 40, (2, 6))
    built = []
    with torch.no_grad():
        plain = model(src, tgt)
        for stack in (model.encoder, model.decoder):
            original = stack.encoding.context

            def shifted_context(q, k, original=original):
                built.append(original(q + 37, k + 37))
                return built[-1]

            stack.encoding.context = shifted_context
        shifted = model(src, tgt)
    assert len(built) == 2  # both stacks started from shifted states
    torch.testing.assert_close(shifted, plain, rtol=1e-9, atol=1e-9)


def test_the_states_depend_on_the_tokens_before():
    """The state entering the decoder's second layer at token 3 changes with token 0."""
    model = tiny_model("tape", rope_init=False).double().eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    encoding = model.decoder.encoding
    built = []
    original = encoding.context
    encoding.context = lambda q, k: built.append(original(q, k)) or built[-1]
    with torch.no_grad():
        for first in (5, 6):
            model(torch.tensor([[3, 4, 5]]), torch.tensor([[first, 7, 8, 9]]))
    before, after = (states.states[(1, 0)][..., 3, :] for states in built)
    assert (before - after).abs().max() > 1e-3


def test_the_last_layer_has_no_updates():
    encoding = TapeEncoding(Site.ENCODER, 16, 2, 3)
    rules = [encoding.self_rule(i) for i in range(3)]
    assert [rule.updates for rule in rules] == [True, True, False]
    assert not list(rules[2].parameters())
    encoding.switch_off([2])
    assert not encoding.self_rule(1).updates


def test_a_one_layer_stack_is_rope_whatever_its_weights():
    tape = tiny_model("tape", layers=1, rope_init=False).double().eval()
    with torch.no_grad():
        for param in tape.parameters():
            param.add_(0.3 * torch.randn_like(param))
    rope = tiny_model("rope", layers=1).double().eval()
    rope.load_state_dict(tape.state_dict())  # no TAPE parameter is left to drop
    src = torch.randint(3, 40, (2, 7))
    tgt = torch.randint(3, 40, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(tape(src, tgt), rope(src, tgt), rtol=1e-12, atol=1e-12)


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="head dim 3 must be even"):
        TapeEncoding(Site.ENCODER, 6, 2, 2)
    with pytest.raises(ValueError, match="pe.channels=0"):
        TapeEncoding(Site.ENCODER, 8, 2, 2, channels=0)
