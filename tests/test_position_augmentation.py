"""``pe.augment``: positions drawn at random in training only (SHAPE's shifts, randomized
positions, CAPE's scaling), true positions at test time, for every encoding whose computation
the mode changes; one setting every encoding accepts."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import PE_NAMES, pe_config, tiny_model

from posenc.model.encodings import encoding_class
from posenc.model.positions import AUGMENT_MODES, PositionAugmentation

RANGES = {"shift": 50, "random": 64, "scale": 2.0}
DECLARED = {
    name: encoding_class(pe_config(name)["_target_"], name).augment_modes for name in PE_NAMES
}
ACCEPTED = [(name, mode) for name in PE_NAMES for mode in sorted(DECLARED[name])]
REFUSED = [
    (name, mode) for name in PE_NAMES for mode in AUGMENT_MODES if mode not in DECLARED[name]
]


def batch():
    torch.manual_seed(5)
    src, tgt = torch.randint(3, 40, (2, 9)), torch.randint(3, 40, (2, 7))
    src[1, 6:] = 0
    return src, tgt


def test_shift_adds_one_offset_from_zero_to_k():
    shift = PositionAugmentation.of("shift", 3)
    torch.manual_seed(0)
    drawn = [shift(5) for _ in range(200)]
    offsets = {int(p[0]) for p in drawn}
    assert offsets == {0, 1, 2, 3}
    for p in drawn:
        assert torch.equal(p, torch.arange(5) + p[0])


def test_random_positions_are_an_ordered_subset_of_the_range():
    random = PositionAugmentation.of("random", 20)
    torch.manual_seed(0)
    for _ in range(50):
        p = random(8)
        assert p.dtype == torch.long and len(set(p.tolist())) == 8
        assert bool((p[1:] > p[:-1]).all()) and int(p.min()) >= 0 and int(p.max()) < 20
    assert torch.equal(random(30), torch.arange(30))  # longer than the range: every position


def test_scale_multiplies_the_positions_by_one_factor_within_lam():
    scale = PositionAugmentation.of("scale", 2.0)
    torch.manual_seed(0)
    factors = [float(scale(4)[1]) for _ in range(300)]
    assert 0.5 <= min(factors) < 0.6 and 1.9 < max(factors) <= 2.0
    assert sum(f < 1 for f in factors) > 100 and sum(f > 1 for f in factors) > 100
    p = scale(6)
    torch.testing.assert_close(p, torch.arange(6) * p[1])


@pytest.mark.parametrize(
    ("mode", "range_", "match"),
    [
        ("jitter", 5, "unknown"),
        ("shift", None, "needs pe.augment_range"),
        ("shift", 2.5, "needs pe.augment_range"),
        ("random", 1, "needs pe.augment_range"),
        ("scale", 1.0, "needs pe.augment_range"),
        (None, 10, "without pe.augment"),
    ],
)
def test_bad_settings_are_refused_in_one_line(mode, range_, match):
    with pytest.raises(ValueError, match=match) as error:
        PositionAugmentation.of(mode, range_)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("name", "mode"), ACCEPTED)
def test_an_accepted_mode_changes_training_and_never_evaluation(name, mode):
    src, tgt = batch()
    plain = tiny_model(name).train()
    model = tiny_model(name, augment=mode, augment_range=RANGES[mode]).train()
    with torch.no_grad():
        reference = plain(src, tgt)
        torch.manual_seed(1)
        draws = [model(src, tgt) for _ in range(3)]
    assert all(torch.isfinite(d).all() for d in draws)
    assert any(not torch.allclose(d, reference, atol=1e-4) for d in draws)
    loss = model(src, tgt).logsumexp(-1).mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        assert torch.equal(model.eval()(src, tgt), plain.eval()(src, tgt))
        generated = model.generate(src, max_len_a=1.0, max_len_b=3)
    assert generated == plain.generate(src, max_len_a=1.0, max_len_b=3)


@pytest.mark.parametrize(("name", "mode"), REFUSED)
def test_a_mode_that_changes_nothing_an_encoding_computes_is_refused_in_one_line(name, mode):
    with pytest.raises(ValueError, match="would change nothing") as error:
        tiny_model(name, augment=mode, augment_range=RANGES[mode])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "name", [n for n in PE_NAMES if DECLARED[n] and "shift" not in DECLARED[n]]
)
def test_why_relative_encodings_refuse_shift_they_read_only_distances(name):
    """An encoding that reads positions but refuses ``shift`` computes the same logits with
    shifted positions (forced past the refusal): only absolute positions have anything to learn
    from it. (Those that accept no mode read no position indices: their positions come from
    content or gates, counted over consecutive keys.)"""
    src, tgt = batch()
    model = tiny_model(name).train()
    with torch.no_grad():
        reference = model(src, tgt)
        for stack in (model.encoder, model.decoder):
            stack.encoding.augmentation = PositionAugmentation.of("shift", 200)
        torch.manual_seed(3)
        shifted = model(src, tgt)
    torch.testing.assert_close(shifted, reference, atol=2e-4, rtol=1e-4)


def test_encoder_and_decoder_draw_their_own_positions():
    model = tiny_model("sinpe", augment="shift", augment_range=1000).train()
    seen = {}
    for site, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        original = stack.encoding.embed

        def spy(x, positions, original=original, site=site):
            seen[site] = positions
            return original(x, positions)

        stack.encoding.embed = spy
    torch.manual_seed(0)
    model(*batch())
    assert int(seen["encoder"][0]) != int(seen["decoder"][0])
    assert not math.isclose(float(seen["encoder"][0]), 0.0)
