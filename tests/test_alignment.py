"""The alignment probe (``scripts/alignment_probe.py``): how monotonically a model's
cross-attention walks through the source, per decoder layer and head."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SMOKE, compose
from omegaconf import OmegaConf

import posenc
from posenc.analysis.alignment import monotonicity, probe
from posenc.data.batching import collate
from posenc.data.splits import load_corpora
from posenc.job import run


def test_a_diagonal_walk_scores_one_and_a_backward_walk_minus_one():
    diagonal = np.eye(6)[None]  # (H=1, Lq=6, Lk=6)
    assert monotonicity(diagonal)[0] == pytest.approx(1.0)
    assert monotonicity(diagonal[:, ::-1])[0] == pytest.approx(-1.0)


def test_attention_blind_to_position_scores_nothing():
    uniform = np.full((2, 5, 7), 1 / 7)  # every query the same weights: no variation
    assert np.isnan(monotonicity(uniform)).all()
    assert np.isnan(monotonicity(np.eye(2)[None])).all()  # two queries: no correlation


def test_each_head_is_scored_on_its_own():
    heads = np.stack([np.eye(5), np.eye(5)[::-1], np.full((5, 5), 0.2)])
    assert monotonicity(heads)[:2] == pytest.approx([1.0, -1.0])
    assert np.isnan(monotonicity(heads)[2])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("alignment") / "pe=sinpe"
    run(compose(*SMOKE, "pe=sinpe"), run_dir)
    return run_dir


def test_the_probe_is_each_pairs_own_score_averaged_whatever_the_batch(trained):
    """Padding a pair beside longer ones changes nothing: the batched probe equals a loop over
    the pairs one at a time."""
    loaded = posenc.load_run(trained, "device=cpu")
    data = load_corpora(OmegaConf.load(trained / "config.yaml").data, with_train=False)["test"]
    sources, targets = data.src[:5], data.tgt[:5]
    result = probe(loaded, sources, targets)
    layers = len(loaded.model.decoder.layers)
    expected = []
    for source, target in zip(sources, targets, strict=True):
        src, tgt_in, _ = collate(
            [loaded.tokenizer.encode(source)],
            [loaded.tokenizer.encode(target)],
            loaded.tokenizer.pad_id,
            loaded.tokenizer.bos_id,
            loaded.tokenizer.eos_id,
        )
        expected.append(
            [
                monotonicity(loaded.model.attention_maps(src, tgt_in, layer)["cross"][0].numpy())
                for layer in range(layers)
            ]
        )
    assert result.pairs == 5
    assert result.scores.shape == (layers, loaded.model.decoder.layers[0].cross_attn.n_heads)
    np.testing.assert_allclose(result.scores, np.nanmean(expected, axis=0), atol=1e-5)
