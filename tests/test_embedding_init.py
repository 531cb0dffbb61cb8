"""Token embeddings start at the model config's scale: N(0, d^-1/2) unless ``embed_init_std``
names another standard deviation (``model=seed``: 1.0, as the seed report's ``nn.Embedding``),
with the padding row zero. The scale decides how much an added sinusoid weighs at the start."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, pe_config
from omegaconf import OmegaConf

from posenc.config import ModelConfig
from posenc.model.encodings import encoding_factory
from posenc.model.seq2seq import Seq2Seq

VOCAB = 4000


def _model(**settings) -> Seq2Seq:
    torch.manual_seed(0)
    shape = {"d_model": 64, "n_heads": 4, "d_ff": 64, "encoder_layers": 1, "decoder_layers": 1}
    config = ModelConfig(**shape, dropout=0.0, share_embeddings=False, tie_output=False, **settings)
    return Seq2Seq(VOCAB, 0, 1, 2, config, encoding_factory(pe_config("nonepe")))


@pytest.mark.parametrize(("std", "expected"), [(None, 64**-0.5), (1.0, 1.0), (0.3, 0.3)])
def test_embeddings_are_normal_with_the_configured_deviation_and_a_zero_padding_row(std, expected):
    model = _model(embed_init_std=std)
    for table in (model.src_embed.weight, model.tgt_embed.weight):
        assert torch.all(table[0] == 0)
        assert table[1:].mean().abs() < 0.01 * expected
        assert table[1:].std().item() == pytest.approx(expected, rel=0.01)
    assert model.output.weight.std().item() == pytest.approx(64**-0.5, rel=0.01)


def test_model_seed_initialises_as_the_seed_reports_code_and_others_keep_the_default():
    assert OmegaConf.load(ROOT / "configs" / "model" / "seed.yaml").embed_init_std == 1.0
    for name in ("cpu", "tiny", "small", "base"):
        assert OmegaConf.load(ROOT / "configs" / "model" / f"{name}.yaml").embed_init_std is None


def test_a_non_positive_deviation_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^model.embed_init_std=0 must be a number > 0 or null"):
        ModelConfig.of(
            {
                "d_model": 64,
                "n_heads": 4,
                "d_ff": 64,
                "encoder_layers": 1,
                "decoder_layers": 1,
                "dropout": 0.0,
                "embed_init_std": 0,
            }
        )
