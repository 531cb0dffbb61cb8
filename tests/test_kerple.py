"""Specification of KERPLE, logarithmic variant (``pe=kerple``)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from posenc.model.encodings.base import Site
from posenc.model.encodings.common import SPLIT_PENALTY
from posenc.model.encodings.kerple import KerpleEncoding


def _reference_bias(pairs, q_pos, k_pos, form: str) -> torch.Tensor:
    """``-p_h log(1 + a_h d)`` per entry. ``pairs`` holds ``(p, a)`` for keys at or before the
    query and, for ``asymmetric``, ``(p', a')`` for keys after it; ``form`` is ``causal`` (the
    paper's decoder) or an encoder form."""
    (p, a), (p2, a2) = pairs[0], pairs[-1]
    rows = []
    for h in range(len(p)):
        for i in q_pos.tolist():
            for j in k_pos.tolist():
                if form == "causal":
                    value = -p[h] * torch.log(1 + a[h] * max(i - j, 0))
                elif form == "symmetric":
                    value = -p[h] * torch.log(1 + a[h] * abs(i - j))
                elif form == "asymmetric" and j > i:
                    value = -p2[h] * torch.log(1 + a2[h] * (j - i))
                elif form == "asymmetric":
                    value = -p[h] * torch.log(1 + a[h] * (i - j))
                elif (j - i) * (1 if h % 2 else -1) >= 0:  # split: the head's own side
                    value = -p[h] * torch.log(1 + a[h] * abs(i - j))
                else:
                    value = torch.tensor(SPLIT_PENALTY)
                rows.append(value)
    return torch.stack(rows).view(1, len(p), len(q_pos), len(k_pos))


@pytest.mark.parametrize(
    ("site", "form", "q_pos", "k_pos"),
    [
        (Site.ENCODER, "symmetric", torch.arange(25), torch.arange(25)),
        (Site.ENCODER, "asymmetric", torch.arange(25), torch.arange(25)),
        (Site.ENCODER, "split", torch.arange(25), torch.arange(25)),
        (Site.DECODER, "causal", torch.arange(25), torch.arange(25)),
        (Site.DECODER, "causal", torch.tensor([24]), torch.arange(25)),  # one cached step
        (Site.DECODER, "causal", torch.tensor([21, 22, 23, 24]), torch.arange(25)),  # a chunk
    ],
)
def test_bias_and_its_gradients_equal_a_loop_reference(site, form, q_pos, k_pos):
    encoder_bias = "symmetric" if form == "causal" else form
    enc = KerpleEncoding(site, d_model=16, n_heads=3, n_layers=2, encoder_bias=encoder_bias)
    params = list(enc.parameters())
    pairs = [(params[i], params[i + 1]) for i in range(0, len(params), 2)]
    assert len(pairs) == (2 if form == "asymmetric" else 1)
    weights = torch.randn(1, 3, len(q_pos), len(k_pos))
    fast = enc.context(q_pos, k_pos)
    slow = _reference_bias(pairs, q_pos, k_pos, form)
    torch.testing.assert_close(fast, slow)
    g_fast = torch.autograd.grad((fast * weights).sum(), params)
    g_slow = torch.autograd.grad((slow * weights).sum(), params)
    for fast_grad, slow_grad in zip(g_fast, g_slow, strict=True):
        torch.testing.assert_close(fast_grad, slow_grad)


def test_the_asymmetric_sides_start_independent():
    enc = KerpleEncoding(Site.ENCODER, 16, n_heads=64, n_layers=1, encoder_bias="asymmetric")
    assert not torch.equal(enc.p, enc.p_after) and not torch.equal(enc.a, enc.a_after)
    assert enc.p_after.max() <= 2.0 and enc.a_after.max() <= 1.0


def test_init_follows_the_official_code():
    enc = KerpleEncoding(Site.ENCODER, d_model=16, n_heads=256, n_layers=1)
    p, a = enc.p.detach(), enc.a.detach()
    assert p.min() >= 0.01 and p.max() <= 2.0 and abs(p.mean().item() - 1.0) < 0.15
    assert a.min() >= 0.01 and a.max() <= 1.0 and abs(a.mean().item() - 0.5) < 0.08


def test_p_and_a_stay_positive_by_projection_and_keep_their_gradient():
    enc = KerpleEncoding(Site.ENCODER, 16, n_heads=2, n_layers=1, encoder_bias="symmetric")
    with torch.no_grad():
        enc.p.copy_(torch.tensor([-3.0, 0.5]))
        enc.a.copy_(torch.tensor([0.2, -1.0]))
    positions = torch.arange(6)
    bias = enc.context(positions, positions)
    assert enc.p.tolist() == pytest.approx([0.01, 0.5]) and enc.a.tolist() == pytest.approx(
        [0.2, 0.01]
    )
    expected = _reference_bias(
        [(torch.tensor([0.01, 0.5]), torch.tensor([0.2, 0.01]))], positions, positions, "symmetric"
    )
    torch.testing.assert_close(bias, expected)
    # The projection sits outside autograd: a clamped parameter still gets its gradient.
    grads = torch.autograd.grad(bias.sum(), [enc.p, enc.a])
    assert all((g != 0).all() for g in grads)
    # An optimiser step that drives them negative is undone at the next forward.
    opt = torch.optim.SGD(enc.parameters(), lr=100.0)
    (-enc.context(positions, positions).sum()).backward()
    opt.step()
    assert (enc.p < 0).any() or (enc.a < 0).any()
    bias = enc.context(positions, positions)
    assert (enc.p >= 0.01).all() and (enc.a >= 0.01).all()
    assert (bias <= 0).all() and torch.isfinite(bias).all()


def test_the_symmetric_bias_depends_only_on_the_distance():
    enc = KerpleEncoding(Site.ENCODER, d_model=16, n_heads=3, n_layers=1, encoder_bias="symmetric")
    positions = torch.arange(10)
    bias = enc.context(positions, positions)[0].detach()
    torch.testing.assert_close(bias, bias.transpose(-1, -2))
    shifted = enc.context(positions + 7, positions + 7)[0].detach()
    torch.testing.assert_close(bias, shifted)
    for d in range(10):
        diagonal = torch.diagonal(bias, offset=d, dim1=-2, dim2=-1)
        torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal))
    assert (torch.diagonal(bias, dim1=-2, dim2=-1) == 0).all()
    assert (bias[:, 0, 1:] < bias[:, 0, :-1]).all()  # strictly decreasing with distance


def test_one_parameter_set_per_stack_shared_by_every_layer():
    model = tiny_model("kerple", layers=3)
    for stack in (model.encoder, model.decoder):
        shapes = {name: p.shape for name, p in stack.encoding.named_parameters()}
        assert shapes == {"p": (4,), "a": (4,)}
        rules = [layer.self_attn.rule for layer in stack.layers]
        assert all(rule is rules[0] for rule in rules)
        assert not list(rules[0].parameters())
