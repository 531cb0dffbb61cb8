"""What a layer's attention looks at, read from one teacher-forced pass: the maps of the report,
the evaluation and the plots."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import PE_NAMES, ROOT, tiny_model
from omegaconf import OmegaConf

from posenc.config import data as typed
from posenc.data.corpus import Corpus
from posenc.data.tokenizer import Tokenizer, build_tokenizer
from posenc.evaluation.attention_maps import (
    SOURCE,
    TARGET,
    _byte_values,
    _readable,
    attention_figure,
    example_attention,
    plot_attention,
    token_labels,
)
from posenc.model.attention import first_calls


@pytest.mark.parametrize("name", PE_NAMES)
def test_attention_maps_are_distributions_with_the_masks_applied(name):
    model = tiny_model(name).train()
    src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 2, 0, 0]])
    tgt_in = torch.tensor([[1, 9, 10, 11], [1, 9, 0, 0]])
    maps = model.attention_maps(src, tgt_in)
    encoder, decoder = model.encoder.layers[0], model.decoder.layers[0]
    b, h = 2, decoder.cross_attn.attended_heads  # a rule's heads: RoPE++ attends with more
    assert maps["encoder"].shape == (b, encoder.self_attn.attended_heads, 5, 5)
    assert maps["decoder"].shape == (b, decoder.self_attn.attended_heads, 4, 4)
    assert maps["cross"].shape == (b, h, 4, 5)
    for weights in maps.values():
        assert torch.all(weights >= 0)
        assert torch.all(weights.sum(-1) <= 1 + 1e-5)
    assert torch.allclose(maps["cross"].sum(-1), torch.ones(b, h, 4))
    assert torch.all(maps["decoder"].triu(1) == 0)  # no look-ahead
    assert torch.all(maps["cross"][1, :, :, 3:] == 0)  # source padding gets nothing
    assert model.training  # the pass ran in eval mode and gave the mode back


@pytest.mark.parametrize("name", ["sinpe", "rope", "alibi"])
def test_every_decoder_layers_cross_attention_comes_from_one_pass_as_layer_by_layer(name):
    model = tiny_model(name, layers=3)
    src = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 2, 0, 0]])
    tgt_in = torch.tensor([[1, 9, 10, 11], [1, 9, 0, 0]])
    passes = []
    model.register_forward_pre_hook(lambda module, args: passes.append(1))
    maps = model.cross_attention_maps(src, tgt_in)
    assert len(passes) == 1 and len(maps) == 3
    for layer, weights in enumerate(maps):
        assert torch.equal(weights, model.attention_maps(src, tgt_in, layer)["cross"])


def test_first_calls_record_each_modules_first_arguments_and_remove_their_hooks():
    layer = torch.nn.Linear(2, 2)
    with first_calls(layer) as (call,):
        layer(torch.ones(1, 2))
        layer(torch.zeros(1, 2))
    assert call.seen and torch.equal(call.arg(0, "input"), torch.ones(1, 2))
    layer(torch.ones(1, 2))
    assert not layer._forward_pre_hooks


def small_bpe(tmp_path) -> Tokenizer:
    """A byte-level BPE trained on a few French and English sentences."""
    french = ["L'été dernier, nous sommes allés à Noël.", "Où est la bibliothèque ?"]
    english = ["Last summer we went to Christmas.", "Where is the library?"]
    config = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "tokenizer" / "bpe.yaml"))
    config.update(vocab_size=120, min_frequency=1)
    return build_tokenizer(
        typed.tokenizer_config(config), Corpus("train", french * 10, english * 10), tmp_path
    )


def test_the_example_holds_the_tokens_of_its_queries_and_keys(tmp_path):
    tokenizer = small_bpe(tmp_path)
    source, target = "L'été dernier.", "Last summer."
    labels = token_labels(tokenizer, source)
    assert "".join(labels).replace("▁", " ").strip() == source  # readable, accents decoded
    assert labels[0].startswith("▁")  # the word boundary is shown
    model = tiny_model(PE_NAMES[0], vocab=tokenizer.vocab_size)
    maps = example_attention(model, tokenizer, source, target, torch.device("cpu"))
    assert maps[SOURCE].tolist() == [*labels, "</s>"]
    assert maps[TARGET].tolist() == ["<s>", *token_labels(tokenizer, target)]
    assert maps["encoder_layer0"].shape[1:] == (len(maps[SOURCE]),) * 2
    assert maps["cross_layer0"].shape[1:] == (len(maps[TARGET]), len(maps[SOURCE]))


def test_the_figure_labels_queries_and_keys_with_tokens_and_has_a_colour_bar_per_site(tmp_path):
    tokenizer = small_bpe(tmp_path)
    model = tiny_model(PE_NAMES[0], vocab=tokenizer.vocab_size)
    device = torch.device("cpu")
    maps = example_attention(model, tokenizer, "Où est la bibliothèque ?", "Where is it?", device)
    np.savez_compressed(tmp_path / "attention.npz", **maps)  # as the evaluation saves it
    with np.load(tmp_path / "attention.npz") as saved:
        maps = {key: saved[key] for key in saved.files}
    fig = attention_figure(maps, "example")
    rows = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    expected = {"encoder": (SOURCE, SOURCE), "decoder": (TARGET, TARGET), "cross": (TARGET, SOURCE)}
    for site, (queries, keys) in expected.items():
        ax = rows[f"{site}, head 0"]
        assert [t.get_text() for t in ax.get_yticklabels()] == maps[queries].tolist()
        assert [t.get_text() for t in ax.get_xticklabels()] == maps[keys].tolist()
        other = rows[f"{site}, head 1"]
        assert [t.get_text() for t in other.get_xticklabels()] == maps[keys].tolist()
    colour_bars = [ax for ax in fig.axes if ax.get_ylabel() == "weight"]
    assert len(colour_bars) == 3
    image = plot_attention(maps, "example", tmp_path / "attention.png")
    assert image.ndim == 3 and image.shape[2] == 3 and (tmp_path / "attention.png").exists()


def test_byte_level_pieces_read_as_text_and_partial_characters_as_bytes():
    values = _byte_values()
    assert _readable("Ġsaut", values) == "▁saut"  # Ġ is the space byte
    assert _readable("Ã©t", values) == "ét"  # two bytes of one character, and a letter
    assert _readable("Ã", values) == "<C3>"  # the first byte of "é" alone
