"""xPos (``configs/pe/xpos.yaml``): RoPE with the decay ``zeta^((m-n)/scale_base)`` in the
decoder, plain RoPE in the encoder."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import pe_config, tiny_model

from posenc.model.encodings import encoding_class
from posenc.model.encodings.base import AttentionRule, Site
from posenc.model.encodings.rotary import RotaryEncoding
from posenc.model.encodings.rotation import RotaryRule
from posenc.model.encodings.xpos import XPosEncoding

HEAD_DIM = 8


def make_xpos(site: Site = Site.DECODER, **params) -> XPosEncoding:
    return XPosEncoding(site, 2 * HEAD_DIM, 2, 1, **params)


def rotate_qk(encoding, q, k, positions):
    """The fast path: tables from ``context``, rotation in ``RotaryRule.prepare``."""
    tables = encoding.context(positions, positions)
    q, k, _ = RotaryRule().prepare(q, k, None, positions, context=tables)
    return q, k


def paper_zeta(head_dim: int, gamma: float = 0.4) -> list[float]:
    """Sun et al. 2022: ``zeta_i = (i/(D/2) + gamma) / (1 + gamma)``, ``i = 0 .. D/2 - 1``."""
    return [(i / (head_dim / 2) + gamma) / (1 + gamma) for i in range(head_dim // 2)]


def paper_xpos(
    x: torch.Tensor, positions: torch.Tensor, sign: int, scale_base: float = 512.0
) -> torch.Tensor:
    """xPos with Python loops, in the paper's adjacent-pair layout: pair ``(2i, 2i+1)`` at
    position ``m`` is rotated by ``m * theta_i`` and scaled by ``zeta_i^(sign * m / scale_base)``
    (``sign`` +1 for queries, -1 for keys)."""
    head_dim = x.shape[-1]
    out = x.clone()
    for m, pos in enumerate(positions.tolist()):
        for i, zeta in enumerate(paper_zeta(head_dim)):
            angle = pos * 10000.0 ** (-2 * i / head_dim)
            c, s = math.cos(angle), math.sin(angle)
            matrix = zeta ** (sign * pos / scale_base) * torch.tensor([[c, -s], [s, c]])
            for b in range(x.shape[0]):
                for h in range(x.shape[1]):
                    out[b, h, m, 2 * i : 2 * i + 2] = matrix @ x[b, h, m, 2 * i : 2 * i + 2]
    return out


def test_zeta_is_the_papers_and_torchscales():
    encoding = make_xpos()
    expected = torch.tensor(paper_zeta(HEAD_DIM))
    torch.testing.assert_close(encoding.log_zeta.exp(), expected)
    # torchscale's XPOS buffer: (arange(0, D, 2) + 0.4 D) / (1.4 D)
    d = HEAD_DIM
    torch.testing.assert_close(expected, (torch.arange(0, d, 2) + 0.4 * d) / (1.4 * d))


def test_decoder_matches_the_loop_reference_forward_and_backward():
    encoding = make_xpos(scale_base=64.0)
    positions = torch.tensor([0, 2, 9, 50, 300])
    q = torch.randn(2, 2, 5, HEAD_DIM, requires_grad=True)
    k = torch.randn(2, 2, 5, HEAD_DIM, requires_grad=True)
    fast_q, fast_k = rotate_qk(encoding, q, k, positions)
    ref_q = paper_xpos(q, positions, +1, scale_base=64.0)
    ref_k = paper_xpos(k, positions, -1, scale_base=64.0)
    torch.testing.assert_close(fast_q, ref_q)
    torch.testing.assert_close(fast_k, ref_k)
    weight = torch.randn(2, 2, 5, 5)

    def grads(rq, rk):
        return torch.autograd.grad(((rq @ rk.transpose(-1, -2)) * weight).sum(), (q, k))

    for fast, ref in zip(grads(fast_q, fast_k), grads(ref_q, ref_k), strict=True):
        torch.testing.assert_close(fast, ref)


def test_decoder_scores_depend_only_on_the_relative_position():
    encoding = make_xpos()
    q, k = torch.randn(1, 2, 6, HEAD_DIM), torch.randn(1, 2, 6, HEAD_DIM)
    positions = torch.tensor([0, 1, 4, 9, 17, 40])
    scores = []
    for shift in [0, 13, 700]:
        rq, rk = rotate_qk(encoding, q, k, positions + shift)
        scores.append((rq @ rk.transpose(-1, -2)).tril())
    torch.testing.assert_close(scores[1], scores[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(scores[2], scores[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pair", range(HEAD_DIM // 2))
def test_causal_decay_shrinks_each_frequencys_score_by_zeta_to_the_distance(pair):
    """A q and k living in one frequency pair: xPos score = RoPE score * zeta^((m-n)/512)."""
    q, k = torch.zeros(1, 1, 1, HEAD_DIM), torch.zeros(1, 1, 1, HEAD_DIM)
    q[..., 2 * pair : 2 * pair + 2] = torch.tensor([0.6, -1.1])
    k[..., 2 * pair : 2 * pair + 2] = torch.tensor([0.9, 0.4])
    zeta = paper_zeta(HEAD_DIM)[pair]
    rope = RotaryEncoding(Site.DECODER, 2 * HEAD_DIM, 2, 1)
    query_at = 1000
    ratios = []
    for key_at in [1000, 990, 700, 200, 0]:
        distance = query_at - key_at

        def score(encoding, query_at=query_at, key_at=key_at):
            rq, _ = rotate_qk(encoding, q, q, torch.tensor([query_at]))
            _, rk = rotate_qk(encoding, k, k, torch.tensor([key_at]))
            return (rq * rk).sum()

        ratio = score(make_xpos()) / score(rope)
        assert ratio.item() == pytest.approx(zeta ** (distance / 512), rel=1e-4)
        ratios.append(ratio.item())
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < ratios[0]


def test_encoder_form_is_plain_rope():
    q, k = torch.randn(2, 2, 7, HEAD_DIM), torch.randn(2, 2, 7, HEAD_DIM)
    positions = torch.arange(7)
    rope = RotaryEncoding(Site.ENCODER, 2 * HEAD_DIM, 2, 1)
    encoder = rotate_qk(make_xpos(Site.ENCODER), q, k, positions)
    torch.testing.assert_close(encoder, rotate_qk(rope, q, k, positions), rtol=0, atol=0)
    decoder_q, _ = rotate_qk(make_xpos(Site.DECODER), q, k, positions)
    assert not torch.allclose(decoder_q[..., 1:, :], encoder[0][..., 1:, :])


def test_tables_stay_finite_and_bounded_far_beyond_training_lengths():
    tables = make_xpos().context(torch.arange(8192), torch.arange(8192))
    for table in (tables.q, tables.k):
        assert torch.isfinite(torch.view_as_real(table).bfloat16()).all()
    biggest = (1.4 / 0.4) ** (8191 / 512)  # 1 / zeta_0^(n / scale_base) at the last position
    assert tables.k.abs().max() <= biggest * (1 + 1e-5)


def test_xpos_rotates_self_attention_only():
    model = tiny_model("xpos")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        assert isinstance(layer.self_attn.rule, RotaryRule)
    for layer in model.decoder.layers:
        assert type(layer.cross_attn.rule) is AttentionRule


def test_an_odd_head_dim_fails_at_construction():
    with pytest.raises(ValueError, match="head dim"):
        XPosEncoding(Site.DECODER, 18, 2, 1)


def test_the_yaml_holds_the_papers_defaults():
    cfg = pe_config("xpos")
    assert cfg["gamma"] == 0.4 and cfg["scale_base"] == 512.0 and cfg["base"] == 10000.0


def test_runs_made_before_xpos_had_its_own_module_still_name_it():
    assert encoding_class("posenc.model.encodings.rotary.XPosEncoding") is XPosEncoding
    assert encoding_class("posenc.model.encodings.xpos.XPosEncoding") is XPosEncoding
