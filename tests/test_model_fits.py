"""Models that cannot be trained are refused in one line before anything is allocated: one too
large for the machine (:func:`posenc.model.factory.check_fits`: built on the ``meta`` device
first, a build that draws nothing from the random stream, so every run initialises as before),
a wavelength base that makes no sense, and a toy split larger than memory holds."""

from __future__ import annotations

import pytest
import torch
from conftest import compose

from posenc.config import ModelConfig, plain
from posenc.model.encodings import encoding_factory
from posenc.model.factory import build_model, check_fits
from posenc.model.seq2seq import Seq2Seq


def built(cfg, vocab_size: int) -> Seq2Seq:
    """``build_model`` of a composed config's model and encoding (pad 0, bos 1, eos 2)."""
    return build_model(ModelConfig.of(cfg.model), plain(cfg.pe), vocab_size, 0, 1, 2)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (("pe=learned", "pe.max_len=100000000"), "pe.max_len"),
        (("model.d_model=1000000000",), "model.d_model"),
    ],
)
def test_a_model_larger_than_the_machine_is_refused_before_it_is_allocated(overrides, named):
    with pytest.raises(ValueError, match="more than this machine's") as refused:
        built(compose(*overrides), 8000)
    assert named in str(refused.value) and "\n" not in str(refused.value)


def test_the_estimate_counts_parameters_and_buffers_in_float32():
    def build() -> torch.nn.Module:
        model = torch.nn.Linear(10, 10)  # 110 parameters
        model.register_buffer("table", torch.zeros(90))
        return model

    check_fits(build, memory=800)  # 200 values, 800 bytes: fits
    with pytest.raises(ValueError, match="200 parameters and buffers"):
        check_fits(build, memory=799)


@pytest.mark.parametrize("pe", ["rope", "learned", "kerple", "fope", "t5"])
def test_the_first_build_on_meta_leaves_the_initialisation_as_it_was(pe):
    cfg = compose(f"pe={pe}")
    torch.manual_seed(0)
    direct = Seq2Seq(800, 0, 1, 2, ModelConfig.of(cfg.model), encoding_factory(plain(cfg.pe)))
    after_direct = torch.rand(3)
    torch.manual_seed(0)
    checked = built(cfg, 800)
    assert torch.equal(torch.rand(3), after_direct)
    for (name, a), (_, b) in zip(
        direct.state_dict().items(), checked.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("base", ["0", "-1", "nan", "inf", "1"])
@pytest.mark.parametrize("pe", ["rope", "sinpe", "xpos"])
def test_a_wavelength_base_that_makes_no_sense_is_refused_before_training(pe, base):
    """At 0, -1 or NaN training turned NaN at step 1 with the advice to lower the learning
    rate; at infinity it trained without positions."""
    with pytest.raises(ValueError, match=r"pe.base=\S+ must be a finite number above 1"):
        built(compose(f"pe={pe}", f"pe.base={base}"), 800)


def test_a_toy_split_larger_than_memory_holds_is_refused_before_it_is_generated():
    from posenc.config.data import data_config

    with pytest.raises(ValueError, match=r"data.train_size=1000000000000 must be an integer in"):
        data_config(compose("experiment=smoke", "data.train_size=1000000000000").data)
