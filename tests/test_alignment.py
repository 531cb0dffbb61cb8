"""The alignment probe (``python -m study alignment-probe``): how monotonically a model's
cross-attention walks through the source, per decoder layer and head."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import SMOKE, compose
from omegaconf import OmegaConf

import posenc
from posenc.config import data as typed
from posenc.data.batching import collate
from posenc.data.splits import load_corpora
from posenc.job import run
from study.__main__ import main as study_main
from study.alignment import monotonicity, probe


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
    data = load_corpora(
        typed.data_config(OmegaConf.load(trained / "config.yaml").data), with_train=False
    )["test"]
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


def test_the_script_probes_every_trained_run_with_a_checkpoint_evaluated_or_not(trained, tmp_path):
    """A run trained without its evaluation (``eval.enabled=false``) is probed like an
    evaluated one; a run without its checkpoint is left out and counted."""
    sweep = tmp_path / "sweep"
    run(compose(*SMOKE, "pe=sinpe", "seed=1", "eval.enabled=false"), sweep / "pe=sinpe,seed=1")
    shutil.copytree(trained, sweep / "pe=sinpe,seed=0")
    shutil.copytree(trained, sweep / "pe=sinpe,seed=2")
    shutil.rmtree(sweep / "pe=sinpe,seed=2" / "checkpoints")
    config = sweep / "pe=sinpe,seed=2" / "config.yaml"
    config.write_text(config.read_text().replace("seed: 0", "seed: 2"))
    assert not (sweep / "pe=sinpe,seed=1" / "metrics.json").exists()
    out = tmp_path / "alignment.md"
    argv = [
        f"--sweep=1+1 layers={sweep}",
        "--systems=sinpe",
        "--pairs=3",
        "--words=1,80",
        f"--out={out}",
    ]
    assert study_main(["alignment-probe", *argv]) == 0
    found = json.loads(out.with_suffix(".json").read_text())
    assert [row["seed"] for row in found["sinpe | 1+1 layers"]] == [0, 1]
    assert "1 runs unfinished or without a checkpoint left out" in out.read_text()
