"""FLOATER (``configs/pe/floater.yaml``): positions from a neural ODE solved by torchdiffeq, as a
hand-written Runge-Kutta loop would solve it, entering every self-attention layer's q, k, v."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import pe_config, tiny_model

from posenc.model.attention import MultiHeadAttention
from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.floater import FloaterEncoding, FloaterRule, solve_positions
from posenc.model.layers import DecoderCache

RK4_3_8 = {  # torchdiffeq's "rk4": Kutta's 3/8 rule
    "a": [[], [1 / 3], [-1 / 3, 1.0], [1.0, -1.0, 1.0]],
    "b": [1 / 8, 3 / 8, 3 / 8, 1 / 8],
    "c": [0.0, 1 / 3, 2 / 3, 1.0],
}
RK4_CLASSIC = {
    "a": [[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]],
    "b": [1 / 6, 1 / 3, 1 / 3, 1 / 6],
    "c": [0.0, 0.5, 0.5, 1.0],
}


def make_floater(d_model: int = 8, n_heads: int = 2, n_layers: int = 2, **params):
    return FloaterEncoding(Site.ENCODER, d_model, n_heads, n_layers, **params).double()


def paper_h(encoding: FloaterEncoding, t: float, p: torch.Tensor) -> torch.Tensor:
    """``h(t, p) = W_2 relu(W_1 [p; t] + b_1) + w_2 t + b_2``, one row of the state at a time,
    with the time appended to each layer's input as an extra feature."""
    flow = encoding.flow
    w1 = torch.cat([flow.hidden.weight, flow.hidden_time[:, None]], dim=1)
    w2 = torch.cat([flow.output.weight, flow.output_time[:, None]], dim=1)
    rows = []
    for row in p.reshape(-1, p.shape[-1]):
        inner = torch.relu(w1 @ torch.cat([row, row.new_tensor([t])]) + flow.hidden.bias)
        rows.append(w2 @ torch.cat([inner, inner.new_tensor([t])]) + flow.output.bias)
    return torch.stack(rows).reshape(p.shape)


def runge_kutta(encoding: FloaterEncoding, times: list[float], tableau: dict) -> torch.Tensor:
    """Explicit Runge-Kutta with Butcher ``tableau``, one step between neighbouring ``times``,
    from the encoding's initial values: ``(T, 3, N, d)``."""
    p = encoding.initial
    out = [p]
    for t0, t1 in zip(times[:-1], times[1:], strict=True):
        dt = t1 - t0
        stages = []
        for a_row, c in zip(tableau["a"], tableau["c"], strict=True):
            p_stage = p + dt * sum((a * k for a, k in zip(a_row, stages, strict=False)), 0.0)
            stages.append(paper_h(encoding, t0 + c * dt, p_stage))
        p = p + dt * sum(b * k for b, k in zip(tableau["b"], stages, strict=True))
        out.append(p)
    return torch.stack(out)


def grads(output: torch.Tensor, encoding: FloaterEncoding, weight: torch.Tensor):
    """Gradients of ``sum(output * weight)`` for every parameter (zero where one is unused)."""
    params = list(encoding.parameters())
    loss = (output * weight).sum()
    return torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)


@pytest.mark.parametrize("length", [1, 2, 9])
def test_torchdiffeq_equals_a_hand_written_rk4_loop_forward_and_backward(length):
    encoding = make_floater(step=0.3)  # a coarse grid: the solver's steps matter
    fast = encoding.trajectory(length)
    reference = runge_kutta(encoding, [i * 0.3 for i in range(length)], RK4_3_8)
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    weight = torch.randn_like(fast)
    expected = grads(reference, encoding, weight)
    for got, want in zip(grads(fast, encoding, weight), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_at_the_papers_step_the_rk4_variant_does_not_matter():
    """Classical RK4 and the 3/8 rule agree to 1e-5 of the positions' scale at step 0.01 (not to
    RK4's O(step^5): h's ReLU kinks cost accuracy where a unit switches)."""
    encoding = make_floater()
    with torch.no_grad():
        fast = encoding.trajectory(20)
        reference = runge_kutta(encoding, [i * 0.01 for i in range(20)], RK4_CLASSIC)
    assert (fast - reference).abs().amax() < 1e-5 * fast.abs().amax()


def reference_self_attention(
    attention: MultiHeadAttention, x: torch.Tensor, biases: torch.Tensor
) -> torch.Tensor:
    """The paper's layer, one query and key at a time: ``q_i = W_q x_i + b_q + p_q(t_i)`` and so
    for ``k`` and ``v``; ``biases (L, 3, d)`` are the layer's trajectory rows. ``(B, L, d)``."""
    heads, dim = attention.n_heads, attention.head_dim
    w_k, w_v = attention.kv_proj.weight.chunk(2)
    b_k, b_v = attention.kv_proj.bias.chunk(2)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        q = [
            attention.q_proj.weight @ xi + attention.q_proj.bias + biases[i, 0]
            for i, xi in enumerate(x[b])
        ]
        k = [w_k @ xi + b_k + biases[i, 1] for i, xi in enumerate(x[b])]
        v = [w_v @ xi + b_v + biases[i, 2] for i, xi in enumerate(x[b])]
        for i in range(x.shape[1]):
            heads_out = []
            for h in range(heads):
                part = slice(h * dim, (h + 1) * dim)
                scores = torch.stack([q[i][part] @ kj[part] / math.sqrt(dim) for kj in k])
                weights = torch.softmax(scores, dim=0)
                heads_out.append(sum(w * vj[part] for w, vj in zip(weights, v, strict=True)))
            out[b, i] = attention.out_proj.weight @ torch.cat(heads_out) + attention.out_proj.bias
    return out


def test_every_layer_adds_its_own_ode_positions_to_q_k_v_as_the_paper_writes():
    encoding = make_floater(n_layers=2)
    x = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(6)
    for layer in range(2):
        trajectory = encoding.trajectory(6)  # (L, 3, N, d)
        attention = MultiHeadAttention(8, 2, encoding.self_rule(layer)).double()
        call = AttentionCall(
            positions, positions, False, context=encoding.context(positions, positions)
        )
        fast = attention(x, call)
        reference = reference_self_attention(attention, x, trajectory[:, :, layer])
        torch.testing.assert_close(fast, reference)
        weight = torch.randn_like(fast)
        inputs = [x, *encoding.parameters()]
        fast_grads = torch.autograd.grad((fast * weight).sum(), inputs)
        ref_grads = torch.autograd.grad((reference * weight).sum(), inputs)
        for got, want in zip(fast_grads, ref_grads, strict=True):
            torch.testing.assert_close(got, want)


def silence(encoding: FloaterEncoding) -> None:
    """Make ``h`` identically zero."""
    with torch.no_grad():
        for param in encoding.flow.parameters():
            param.zero_()


def test_with_h_zero_the_positions_stay_at_their_initial_values():
    encoding = make_floater()
    silence(encoding)
    trajectory = encoding.trajectory(50)
    torch.testing.assert_close(trajectory, encoding.initial.detach().expand_as(trajectory))


def test_with_h_zero_and_zero_initial_values_it_is_the_sinusoidal_transformer():
    floater, sinpe = tiny_model("floater"), tiny_model("sinpe")
    floater.load_state_dict(sinpe.state_dict(), strict=False)
    for stack in (floater.encoder, floater.decoder):
        silence(stack.encoding)
        with torch.no_grad():
            stack.encoding.initial.zero_()
    src, tgt = torch.randint(3, 40, (2, 9)), torch.randint(3, 40, (2, 7))
    torch.testing.assert_close(floater(src, tgt), sinpe(src, tgt), rtol=0, atol=1e-6)


def test_positions_are_a_continuous_function_of_time():
    """Sampled at half the step, the trajectory passes through the whole-step positions and its
    new samples lie between their neighbours, within O(step^2) of their midpoint."""
    encoding = make_floater()
    with torch.no_grad():
        whole = encoding.trajectory(41)
        half = solve_positions(
            encoding.flow, encoding.initial, torch.arange(81, dtype=torch.float64) * 0.005
        )
    assert (half[0::2] - whole).abs().amax() < 1e-5 * whole.abs().amax()
    midpoints = (whole[:-1] + whole[1:]) / 2
    gaps = (whole[1:] - whole[:-1]).abs().amax()
    assert (half[1::2] - midpoints).abs().amax() < 0.05 * gaps


def test_the_trajectory_at_a_position_does_not_depend_on_how_far_it_is_solved():
    """What makes cached decoding exact: a fixed-step solve on a fixed grid."""
    encoding = FloaterEncoding(Site.DECODER, 8, 2, 2)
    long = encoding.trajectory(200).detach()
    for length in (1, 7, 128):
        assert torch.equal(encoding.trajectory(length).detach(), long[:length])


def count_evaluations(encoding: FloaterEncoding) -> list[int]:
    """A one-element list counting the calls of ``h`` from now on."""
    calls = [0]
    encoding.flow.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_without_autograd_the_trajectory_is_kept_and_extended_bitwise_as_a_fresh_solve():
    encoding = FloaterEncoding(Site.DECODER, 8, 2, 2)
    fresh = encoding.trajectory(40).detach()  # with autograd: nothing kept
    calls = count_evaluations(encoding)
    with torch.no_grad():
        for length in (5, 12, 3, 40):
            assert torch.equal(encoding.trajectory(length), fresh[:length])
    assert calls[0] == 4 * 39  # each step of the grid solved once


def test_a_kept_trajectory_is_dropped_when_the_parameters_change():
    encoding = FloaterEncoding(Site.DECODER, 8, 2, 2)
    other = FloaterEncoding(Site.DECODER, 8, 2, 2)
    with torch.no_grad():
        before = encoding.trajectory(10)
        encoding.flow.output.bias.add_(0.5)  # as an optimizer step: in place
        stepped = encoding.trajectory(10)
    assert not torch.allclose(stepped, before)
    assert torch.equal(stepped, encoding.trajectory(10).detach())
    encoding.load_state_dict(other.state_dict())
    with torch.no_grad():
        loaded = encoding.trajectory(10)
    assert torch.equal(loaded, other.trajectory(10).detach())


def test_cached_decoding_costs_one_rk4_step_per_new_position():
    model = tiny_model("floater").eval()
    calls = count_evaluations(model.decoder.encoding)
    src, tgt = torch.randint(3, 40, (2, 7)), torch.randint(3, 40, (2, 12))
    with torch.no_grad():
        memory, src_pad = model.encode(src)
        cache = DecoderCache()
        for start in range(12):
            model.decode(tgt[:, start : start + 1], memory, src_pad, cache)
    assert calls[0] == 4 * 11


def test_one_solve_per_stack_and_forward_of_four_evaluations_per_position(monkeypatch):
    model = tiny_model("floater")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn.rule, FloaterRule)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule
    evaluations = {"encoder": 0, "decoder": 0}
    for site, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        stack.encoding.flow.register_forward_hook(
            lambda *_, site=site: evaluations.__setitem__(site, evaluations[site] + 1)
        )
    model(torch.randint(3, 40, (2, 9)), torch.randint(3, 40, (2, 5)))
    assert evaluations == {"encoder": 4 * 8, "decoder": 4 * 4}


def test_a_decoding_step_solves_only_up_to_its_position():
    encoding = FloaterEncoding(Site.DECODER, 8, 2, 2)
    q_pos, k_pos = torch.tensor([11]), torch.arange(12)
    biases = encoding.context(q_pos, k_pos)
    trajectory = encoding.trajectory(12).unflatten(-1, (2, 4))
    assert biases.q.shape == (2, 2, 1, 4) and biases.v.shape == (2, 2, 12, 4)
    torch.testing.assert_close(biases.q[:, :, 0], trajectory[11, 0])
    torch.testing.assert_close(biases.k[:, :, 0], trajectory[11, 1])
    torch.testing.assert_close(biases.v.permute(2, 0, 1, 3), trajectory[:, 2])


def test_bfloat16_autocast_solves_in_float32():
    encoding = FloaterEncoding(Site.ENCODER, 8, 2, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trajectory = encoding.trajectory(30)
    assert trajectory.dtype is torch.float32
    torch.testing.assert_close(trajectory, encoding.trajectory(30))


def test_invalid_step_fails_at_construction():
    with pytest.raises(ValueError, match="step"):
        FloaterEncoding(Site.ENCODER, 8, 2, 1, step=0.0)


def test_the_yaml_holds_the_authors_defaults():
    cfg = pe_config("floater")
    assert cfg["step"] == 0.01 and cfg["hidden"] is None and cfg["base"] == 10000.0
    encoding = FloaterEncoding(Site.ENCODER, 16, 2, 3)
    assert encoding.flow.hidden.out_features == 16
    assert encoding.initial.shape == (3, 3, 16)
