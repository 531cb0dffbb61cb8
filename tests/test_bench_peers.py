"""The benchmark's peers (``scripts/bench.py --peers``): a plain ``torch.nn.Transformer`` of
posenc's shape, the seed report's approach re-implemented, and x-transformers when installed
(tiny shapes: seconds)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import json
import logging
import math
import runpy
import sys

import pytest
import torch
from conftest import PE_NAMES, ROOT, pe_config
from omegaconf import OmegaConf

from posenc.analysis.bench import peers as peers_module
from posenc.analysis.bench import render
from posenc.analysis.bench import runner as bench
from posenc.analysis.bench.peer_models import XT_INSTALL, TorchTransformer, xt_version
from posenc.analysis.bench.seed_model import (
    RELATIVE,
    ROTARY,
    SeedTransformer,
    relative_attention,
    relative_index,
    rotary_tables,
    rotate_interleaved,
)
from posenc.config import ModelConfig
from posenc.model.encodings import encoding_factory
from posenc.model.factory import BOS_ID, EOS_ID, PAD_ID
from posenc.model.seq2seq import Seq2Seq, count_parameters
from posenc.training.losses import summed_losses

VOCAB = 48
TINY = ModelConfig.of(OmegaConf.load(ROOT / "configs" / "model" / "tiny.yaml"))
SEED = ModelConfig.of(OmegaConf.load(ROOT / "configs" / "model" / "seed.yaml"))
XT_INSTALLED = xt_version() is not None
SPEC = peers_module.load_spec()


def tiny_spec() -> dict:
    """``configs/bench/peers.yaml`` with the seed setting shrunk to the tiny model."""
    spec = copy.deepcopy(SPEC)
    spec["seed"].update(model="tiny", batch=2, length=6)
    return spec


def batch(rows: int = 3, length: int = 9, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (rows, length), generator=generator)
    tgt = torch.randint(3, VOCAB, (rows, length + 1), generator=generator)
    return src, tgt[:, :-1], tgt[:, 1:]


# ---------------------------------------------------------------- the configured peers


def test_the_configured_peers_are_the_issue_s():
    spec = peers_module.load_spec()
    assert spec["torch"]["max_ratio"] == 0.8 and spec["x_transformers"]["max_ratio"] == 0.7
    seed = spec["seed"]
    assert seed["min_decode_speedup"] == 3.0
    assert (seed["batch"], seed["length"]) == (8, 40)  # the seed report's batches
    shape = ModelConfig.of(OmegaConf.load(ROOT / "configs" / "model" / f"{seed['model']}.yaml"))
    assert (shape.d_model, shape.encoder_layers, shape.decoder_layers) == (64, 6, 6)
    assert (shape.d_ff, shape.n_heads) == (2048, 8)
    assert seed["compare"] == {RELATIVE: "rpe", ROTARY: "rope"}
    assert set(spec["x_transformers"]["variants"]) <= set(PE_NAMES)


# ---------------------------------------------------------------- plain torch.nn.Transformer


def test_the_plain_transformer_trains_on_a_repeated_batch():
    torch.manual_seed(0)
    work = bench.Trainer.default(TorchTransformer(TINY, VOCAB, PAD_ID))
    data = batch()
    losses = []
    for _ in range(12):
        with torch.no_grad():
            loss, _ = summed_losses(work.model, data, PAD_ID, work.smoothing)
        losses.append(float(loss) / int(data[2].ne(PAD_ID).sum()))
        work.train_step(data)
    assert losses[-1] < 0.8 * losses[0]
    assert work.optimizer.param_groups[0]["weight_decay"] > 0  # its matrices are decayed
    assert len(work.optimizer.param_groups[0]["params"]) == len(work.model.decayed_parameters())


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        (TINY, 0),  # pre-norm, shared and tied tables: the same count
        (dataclasses.replace(TINY, norm_first=False), 4 * TINY.d_model),
        (SEED, 4 * SEED.d_model),  # post-norm, separate tables, untied output
    ],
    ids=["pre-norm", "post-norm", "seed-shape"],
)
def test_the_plain_transformer_has_posenc_s_parameters_but_the_documented_difference(config, extra):
    """nn.Transformer ends each stack with a LayerNorm (2 * d weights and biases) whatever
    norm_first is; posenc's post-norm stacks have none. Everything else counts the same:
    packed in-projection (3d^2 + 3d) = q (d^2 + d) + kv (2d^2 + 2d)."""
    posenc = Seq2Seq(VOCAB, PAD_ID, BOS_ID, EOS_ID, config, encoding_factory(pe_config("nonepe")))
    plain = TorchTransformer(config, VOCAB, PAD_ID)
    assert count_parameters(plain) - count_parameters(posenc) == extra


def test_the_plain_transformer_uses_the_standard_causal_mask():
    torch.manual_seed(0)
    model = TorchTransformer(TINY, VOCAB, PAD_ID).eval()
    src, tgt_in, _ = batch()
    full = model(src, tgt_in)
    changed = tgt_in.clone()
    changed[:, -1] = 3 + (changed[:, -1] - 2) % (VOCAB - 3)
    again = model(src, changed)
    torch.testing.assert_close(full[:, :-1], again[:, :-1])  # no position sees the future
    assert not torch.allclose(full[:, -1], again[:, -1])


# ---------------------------------------------------------------- the seed's approach


def test_relative_index_clips_the_distance_j_minus_i():
    assert relative_index(3, 5, 1).tolist() == [[1, 2, 2, 2, 2], [0, 1, 2, 2, 2], [0, 0, 1, 2, 2]]


def test_relative_attention_is_the_formula_computed_by_loops():
    torch.manual_seed(0)
    b, h, lq, lk, d, k = 2, 2, 3, 5, 4, 2
    q, key, v = torch.randn(b, h, lq, d), torch.randn(b, h, lk, d), torch.randn(b, h, lk, d)
    table_k, table_v = torch.randn(2 * k + 1, d), torch.randn(2 * k + 1, d)
    mask = torch.zeros(b, 1, 1, lk, dtype=torch.bool)
    mask[1, ..., -1] = True  # the second row's last key is padding
    index = relative_index(lq, lk, k)
    fast = relative_attention(q, key, v, table_k[index], table_v[index], mask)
    slow = torch.zeros_like(fast)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                rows = [max(-k, min(k, j - i)) + k for j in range(lk)]
                e = [
                    float("-inf")
                    if mask[bi, 0, 0, j]
                    else sum(
                        q[bi, hi, i, c] * (key[bi, hi, j, c] + table_k[rows[j], c])
                        for c in range(d)
                    )
                    / math.sqrt(d)
                    for j in range(lk)
                ]
                alpha = torch.tensor(e).softmax(dim=0)
                for j in range(lk):
                    slow[bi, hi, i] += alpha[j] * (v[bi, hi, j] + table_v[rows[j]])
    torch.testing.assert_close(fast, slow)


def test_rotary_rotates_interleaved_pairs():
    torch.manual_seed(0)
    length, d = 5, 8
    x = torch.randn(2, length, d)
    cos, sin = rotary_tables(length, d)
    fast = rotate_interleaved(x, cos, sin)
    slow = torch.empty_like(x)
    for pos in range(length):
        for m in range(d // 2):
            angle = pos * 10000.0 ** (-2 * m / d)
            a, b = x[:, pos, 2 * m], x[:, pos, 2 * m + 1]
            slow[:, pos, 2 * m] = a * math.cos(angle) - b * math.sin(angle)
            slow[:, pos, 2 * m + 1] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(fast, slow)
    # hence scores depend on the distance only
    q, k = torch.randn(d), torch.randn(d)
    rq = rotate_interleaved(q.expand(length, d), cos, sin)
    rk = rotate_interleaved(k.expand(length, d), cos, sin)
    torch.testing.assert_close(rq[3] @ rk[1], rq[4] @ rk[2])


@pytest.mark.parametrize("variant", [RELATIVE, ROTARY])
def test_the_seed_s_uncached_greedy_decoding_is_the_argmax_loop(variant):
    torch.manual_seed(0)
    model = SeedTransformer(TINY, VOCAB, variant, PAD_ID)
    src = batch(rows=3, length=7)[0]
    model.train()
    produced = model.greedy(src, 6, BOS_ID)
    assert model.training  # the mode is restored
    model.eval()
    tokens = torch.full((3, 1), BOS_ID)
    with torch.no_grad():
        for _ in range(6):
            tokens = torch.cat([tokens, model(src, tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    assert produced.tolist() == tokens[:, 1:].tolist()


@pytest.mark.parametrize("variant", [RELATIVE, ROTARY])
def test_the_seed_model_trains_and_its_decoder_is_causal(variant):
    torch.manual_seed(0)
    work = peers_module.SeedWorkload.default(SeedTransformer(TINY, VOCAB, variant, PAD_ID))
    data = batch()
    with torch.no_grad():
        before = float(summed_losses(work.model, data, PAD_ID, 0.0)[0])
    for _ in range(10):
        work.train_step(data)
    with torch.no_grad():
        after = float(summed_losses(work.model, data, PAD_ID, 0.0)[0])
    assert after < 0.8 * before
    model = work.model.eval()
    src, tgt_in, _ = data
    changed = tgt_in.clone()
    changed[:, -1] = 3 + (changed[:, -1] - 2) % (VOCAB - 3)
    torch.testing.assert_close(model(src, tgt_in)[:, :-1], model(src, changed)[:, :-1])


# ---------------------------------------------------------------- timing and the report


def test_peers_take_their_turn_in_the_rotated_order(monkeypatch):
    order: list[str] = []

    class OnePeer:
        def units(self, length, batch):
            return [[(lambda: order.append("peer"), times)]]

        def result(self, samples, summary):
            return {"times": times}

    times: list[float] = []
    monkeypatch.setattr(bench, "timed", lambda call: order.append("x") or call() or 0.0)
    settings = bench.BenchSettings(
        encodings=["nonepe"], lengths=[4], tokens=8, repeats=3, decode_batch=1, model="tiny"
    )
    bench.run_timing(settings, OnePeer())
    calls = [name for name in order if name == "peer" or name == "x"]
    # each repetition: nonepe (train, decode) and the peer, the order rotated by one
    slots = ["".join(calls[i : i + 4]) for i in range(0, 12, 4)]
    assert slots == ["xxxpeer", "xpeerxx", "xxxpeer"]
    assert times == [0.0, 0.0, 0.0]  # one sample per repetition, from the (fake) clock


def run_bench(tmp_path, monkeypatch, *extra: str) -> tuple[dict, str]:
    out = tmp_path / "bench.json"
    argv = [
        "--quick",
        "--pe=nonepe,sinpe",
        "--model=tiny",
        f"--vocab={VOCAB}",
        "--tokens=128",
        "--decode-batch=2",
        "--threads=1",
        "--no-memory",
        f"--out={out}",
        *extra,
    ]
    monkeypatch.setattr(peers_module, "load_spec", tiny_spec)
    monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / "bench.py"), run_name="__main__")
    assert done.value.code == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_peers_flag_runs_end_to_end_and_writes_the_peers_section(tmp_path, monkeypatch):
    result, report = run_bench(tmp_path, monkeypatch, "--peers", "--device=cpu")
    peers = result["peers"]
    assert peers["errors"] == {}
    plain = peers["torch"]
    assert len(plain["samples_s"]["train"]["64"]) == 1  # one repetition, like the encodings
    assert plain["parameters"] == result["parameters"]["nonepe"]
    for name in ("nonepe", "sinpe"):
        figures = plain["ratios"][name]["64"]
        assert figures["ratio"] > 0 and figures["verdict"] in ("pass", "miss")
    seed = peers["seed"]
    assert seed["setting"]["batch"] == 2 and seed["setting"]["length"] == 6
    for name in ("rpe", "rope"):
        assert seed["ratios"][name]["train"]["ratio"] > 0
        assert seed["ratios"][name]["decode_speedup"]["verdict"] in ("pass", "miss")
    xt = peers["x_transformers"]
    if XT_INSTALLED:
        assert xt["installed"] and xt["version"] == xt_version()
        assert set(xt["ratios"]) == {"nonepe", "sinpe"}
        assert xt["ratios"]["sinpe"]["64"]["ratio"] > 0
        assert "| sinpe |" in report and "x-transformers L=64" in report
    else:
        assert xt == {"installed": False, "version": None, "message": XT_INSTALL}
    assert "## Peers, timed in the same repetitions" in report
    assert "| rpe | - |" in report  # compared at the seed setting only


def test_without_peers_the_section_is_empty(tmp_path, monkeypatch):
    result, report = run_bench(tmp_path, monkeypatch)
    assert result["peers"] is None and "Peers" not in report


def test_a_missing_x_transformers_is_one_line_saying_how_to_install_it(monkeypatch, caplog):
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "x-transformers":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    settings = bench.BenchSettings(encodings=["nonepe"], model="tiny", vocab_size=VOCAB)
    with caplog.at_level(logging.WARNING, logger="posenc.analysis.bench"):
        peers = peers_module.Peers(settings, tiny_spec())
    assert peers.xt == {}
    lines = [r.getMessage() for r in caplog.records if "x-transformers" in r.getMessage()]
    assert lines == [XT_INSTALL] and "\n" not in XT_INSTALL and "pip install" in XT_INSTALL
    section = peers.result({"train": {}}, {})
    assert section["x_transformers"]["installed"] is False
    assert f"- {XT_INSTALL}." in render.peers_table(section, ["64"])


@pytest.mark.skipif(not XT_INSTALLED, reason="x-transformers is not installed")
@pytest.mark.parametrize("name", sorted(SPEC["x_transformers"]["variants"]))
def test_every_x_transformers_variant_builds_and_trains(name):
    settings = bench.BenchSettings(encodings=[name], model="tiny", vocab_size=VOCAB, lengths=[9])
    peers = peers_module.Peers(settings, tiny_spec())
    assert name in peers.xt, peers.errors
    work = peers.xt[name]
    data = batch()
    with torch.no_grad():
        before = float(summed_losses(work.model, data, PAD_ID, 0.0)[0])
    for _ in range(8):
        work.train_step(data)
    with torch.no_grad():
        assert float(summed_losses(work.model, data, PAD_ID, 0.0)[0]) < before
    width = TINY.d_model // TINY.n_heads
    options = peers._xt_options(name)
    assert options["enc_attn_dim_head"] == width and options["dec_depth"] == TINY.decoder_layers
