"""Ensembles (``python -m posenc.translate run_dir=A run_dir=B``, as fairseq's ``--path
a.pt:b.pt``): at each step the log of the mean of the models' probabilities (fairseq's
``EnsembleModel``: ``logsumexp(log_softmax) - log M``), each model with its own encoding, encoder
output and decoder cache; an ensemble of one decodes exactly as its model; greedy decoding,
sampling and beam search agree with and without the caches and with a reference that recomputes
every model from scratch; models or runs with different vocabularies are refused in one line;
the commands translate and evaluate with several runs."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from dataclasses import dataclass

import pytest
import torch
from conftest import SMOKE, compose, tiny_model
from omegaconf import OmegaConf
from torch import Tensor

from posenc.config import data as typed
from posenc.config.settings import Settings
from posenc.data.splits import load_corpora
from posenc.data.tokenizer import load_tokenizer
from posenc.evaluation.decode import DecodeSettings, decode_sources
from posenc.evaluation.standalone import compose_run_config
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.ensemble import Ensemble, mean_log_probs
from posenc.model.factory import load_run_model
from posenc.model.sampling import Sampling
from posenc.model.search import beam_search
from posenc.translate import main as translate_main

PAD, BOS, EOS = 0, 1, 2
LIMITS = {"max_len_a": 2.0, "max_len_b": 5}
CPU = torch.device("cpu")


def padded_sources(vocab: int = 40) -> Tensor:
    """``(3, 9)`` random sources of 9, 6 and 3 tokens, right-padded."""
    src = torch.randint(3, vocab, (3, 9))
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    return src


def two_models() -> list:
    """Two tiny models with other encodings and weights, one vocabulary, in float64."""
    return [tiny_model("rope", seed=1).double().eval(), tiny_model("alibi", seed=2).double().eval()]


# ---------------------------------------------------------------- an ensemble of one


@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "learned"])
def test_an_ensemble_of_one_decodes_token_for_token_as_its_model(name):
    model = tiny_model(name).eval()
    one = Ensemble([model])
    src = padded_sources()
    greedy = model.generate(src, **LIMITS)
    assert any(len(row) > 3 for row in greedy)
    assert one.generate(src, **LIMITS) == greedy
    assert one.generate(src, **LIMITS, beam_size=4) == model.generate(src, **LIMITS, beam_size=4)
    assert one.nbest(src, 3, 4, lenpen=0.6) == model.nbest(src, 3, 4, lenpen=0.6)  # scores too
    sampling = Sampling(top_p=0.9, temperature=1.5, seed=3)
    assert one.generate(src, **LIMITS, sampling=sampling) == model.generate(
        src, **LIMITS, sampling=sampling
    )
    tgt_in = torch.tensor([[BOS, 5, 6], [BOS, 7, 8], [BOS, 9, 3]])
    assert torch.equal(one(src, tgt_in), model(src, tgt_in))


# ---------------------------------------------------------------- the averaging rule


def test_a_step_gives_the_log_of_the_mean_of_the_models_probabilities():
    """fairseq's rule (``EnsembleModel.forward_decoder``: ``logsumexp(stack(log_probs)) -
    log(M)``), the arithmetic mean of the probabilities; not the mean of the log-probabilities
    (a geometric mean)."""
    models = two_models()
    src, prefix = padded_sources(), torch.tensor([[BOS, 5, 6], [BOS, 7, 8], [BOS, 9, 3]])
    with torch.no_grad():
        got = Ensemble(models).start(src, use_cache=False).logits(prefix)
        probs = [model(src, prefix)[:, -1].softmax(-1) for model in models]
    expected = ((probs[0] + probs[1]) / 2).log()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got.exp().sum(-1).tolist() == pytest.approx([1.0] * 3, abs=1e-12)
    geometric = (probs[0].log() + probs[1].log()) / 2
    assert not torch.allclose(got, geometric, atol=1e-3)
    assert not torch.allclose(got, probs[0].log(), atol=1e-3)  # both models count


def test_teacher_forcing_scores_the_mixture_at_every_position():
    models = two_models()
    src, tgt_in = padded_sources(), torch.randint(3, 40, (3, 5))
    with torch.no_grad():
        got = Ensemble(models)(src, tgt_in)
        probs = [model(src, tgt_in).softmax(-1) for model in models]
    torch.testing.assert_close(got, ((probs[0] + probs[1]) / 2).log(), rtol=1e-12, atol=1e-12)
    assert torch.equal(mean_log_probs([got]), got)


# ---------------------------------------------------------------- caches


@pytest.mark.parametrize("beam_size", [1, 3])
def test_cached_ensemble_decoding_equals_recomputing_the_prefix(beam_size):
    ensemble = Ensemble(two_models())
    src = padded_sources()
    cached = ensemble.generate(src, **LIMITS, beam_size=beam_size)
    assert ensemble.generate(src, **LIMITS, beam_size=beam_size, use_cache=False) == cached
    assert any(len(row) > 3 for row in cached)
    sampling = Sampling(temperature=1.5, seed=1)
    assert ensemble.generate(src, **LIMITS, sampling=sampling) == ensemble.generate(
        src, **LIMITS, sampling=sampling, use_cache=False
    )


@dataclass
class FromScratch:
    """A reference state: each row's source, every model run whole (encoder and decoder) on the
    whole prefix at every step, nothing kept between steps."""

    models: list
    src: Tensor

    @property
    def src_pad(self) -> Tensor:
        return self.src.eq(PAD)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64

    def logits(self, tokens: Tensor) -> Tensor:
        probs = [model(self.src, tokens)[:, -1].softmax(-1) for model in self.models]
        return (sum(probs) / len(probs)).log()

    def select(self, rows: Tensor) -> None:
        self.src = self.src[rows]


@dataclass
class Reference:
    models: list
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS
    position_limit: int | None = None

    def start(self, src: Tensor, use_cache: bool) -> FromScratch:
        return FromScratch(self.models, src)


@pytest.mark.parametrize("lenpen", [0.6, 1.0])
def test_ensemble_beam_search_equals_recomputing_every_model_from_scratch(lenpen):
    """Every model's cache follows the surviving hypotheses (re-ordered, finished sentences
    dropped): the hypotheses and scores are those of a search that keeps no cache at all."""
    models = [*two_models(), tiny_model("t5", seed=3).double().eval()]
    src = padded_sources()
    found = beam_search(Ensemble(models), src, 4, lenpen, **LIMITS)
    expected = beam_search(Reference(models), src, 4, lenpen, **LIMITS)
    assert [[h.tokens for h in hs] for hs in found] == [[h.tokens for h in hs] for hs in expected]
    scores = [h.score for hs in found for h in hs]
    assert scores == pytest.approx([h.score for hs in expected for h in hs], rel=1e-9)
    assert (
        len({tuple(h.tokens) for h in found[0]}) == 4 and max(len(h.tokens) for h in found[0]) > 1
    )


# ---------------------------------------------------------------- refusals


def test_models_with_other_vocabularies_are_refused_in_one_line():
    with pytest.raises(ValueError, match="model 2 does not share model 1's vocabulary") as error:
        Ensemble([tiny_model("rope", vocab=40), tiny_model("alibi", vocab=48)])
    assert "48 tokens" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])


# ---------------------------------------------------------------- the commands

TRAIN = (*SMOKE, "eval.splits=[test]")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two trained runs with other encodings and one tokenizer (trained on the same data)."""
    root = tmp_path_factory.mktemp("ensemble")
    for name in ("rope", "alibi"):
        run(compose(*TRAIN, f"pe={name}"), root / f"pe={name}")
    return root / "pe=rope", root / "pe=alibi"


def sources(run_dir) -> list[str]:
    data = OmegaConf.load(run_dir / "config.yaml").data
    return load_corpora(typed.data_config(data), with_train=False)["test"].src[:6]


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_with_two_runs_decodes_their_ensemble(runs, tmp_path, beam):
    first, second = runs
    lines = sources(first)
    source_file, output = tmp_path / "in.fr", tmp_path / "out.en"
    source_file.write_text("\n".join([*lines[:2], "", *lines[2:]]) + "\n")
    args = [f"run_dir={first}", f"run_dir={second}", f"input={source_file}", f"output={output}"]
    translate_main([*args, f"eval.beam_size={beam}"])
    cfg = compose_run_config(first, [f"eval.beam_size={beam}"])
    configs = [Settings.of(OmegaConf.load(d / "config.yaml")) for d in runs]
    loaded = [load_run_model(d, c, "best", CPU) for d, c in zip(runs, configs, strict=True)]
    tokenizer, ensemble = loaded[0][0], Ensemble([one[1] for one in loaded])
    ids, _ = decode_sources(
        ensemble,
        tokenizer,
        tokenizer.encode_batch(lines),
        DecodeSettings.of(Settings.of(cfg).eval),
        CPU,
    )
    expected = tokenizer.decode_batch(ids)
    assert output.read_text().splitlines() == [*expected[:2], "", *expected[2:]]
    assert sum(bool(line) for line in expected) >= 4


def test_evaluation_of_an_ensemble_goes_under_the_first_run_and_replaces_nothing(runs, caplog):
    first, second = runs
    own = (first / "metrics.json").read_text()
    evaluate_main([f"run_dir={first}", f"run_dir={second}", "eval.beam_size=2"])
    evaluate_main([f"run_dir={first}", "eval.beam_size=2"])
    names = sorted(p.name for p in (first / "evals").iterdir() if not p.name.startswith("."))
    ensemble_dir = next(n for n in names if n.startswith("ensemble="))
    assert re.fullmatch(r"ensemble=pe=alibi_[0-9a-f]{8},eval\.beam_size=2,step=30", ensemble_dir)
    assert "eval.beam_size=2,step=30" in names
    metrics = json.loads((first / "evals" / ensemble_dir / "metrics.json").read_text())
    assert metrics["pe"] == "rope+alibi"
    assert [(m["pe"], m["step"]) for m in metrics["ensemble"]] == [("rope", 30), ("alibi", 30)]
    assert math.isfinite(metrics["splits"]["test"]["loss"])
    single = json.loads((first / "evals" / "eval.beam_size=2,step=30" / "metrics.json").read_text())
    assert metrics["splits"]["test"]["loss"] != single["splits"]["test"]["loss"]
    assert (first / "metrics.json").read_text() == own and not (second / "evals").exists()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="posenc.evaluation"):
        evaluate_main([f"run_dir={first}", f"run_dir={second}", "eval.beam_size=2"])
    assert "holds this evaluation already" in caplog.text
    assert len(list((first / "evals").glob("ensemble=*"))) == 1


def other_tokenizer(run_dir, target):
    """A copy of ``run_dir`` whose tokenizer gives two of its tokens each other's ids."""
    shutil.copytree(run_dir, target)
    path = target / "tokenizer" / "tokenizer.json"
    saved = json.loads(path.read_text())
    vocab = saved["model"]["vocab"]
    a, b = list(vocab)[-2:]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(saved))
    assert load_tokenizer(target / "tokenizer").vocab_size == len(vocab)
    return target


REFUSALS = {
    "tokenizer": "ValueError: .*other has another tokenizer.json than .*pe=rope: an ensemble "
    "decodes with one vocabulary; ensemble runs trained with the same tokenizer",
    "checkpoint": "other has no checkpoint \\(checkpoints/(best|last).pt\\); train it first",
    "twice": "run_dir=.*pe=rope is given twice; give each run of an ensemble once",
    "variants": "eval.pe_variants rebuilds one model .* not an ensemble",
}


@pytest.mark.parametrize(
    ("command", "change"),
    [
        *((translate_main, c) for c in ("tokenizer", "checkpoint", "twice")),
        *((evaluate_main, c) for c in REFUSALS),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__module__.split(".")[1],
)
def test_an_ensemble_it_cannot_decode_is_refused_in_one_line(runs, tmp_path, command, change):
    first, second = runs
    other = tmp_path / "other"
    if change == "tokenizer":
        other_tokenizer(second, other)
    else:
        shutil.copytree(second, other)
    if change == "checkpoint":
        for checkpoint in (other / "checkpoints").glob("*.pt"):
            checkpoint.unlink()
    args = [f"run_dir={first}", f"run_dir={first if change == 'twice' else other}"]
    if command is translate_main:
        (tmp_path / "in.fr").write_text("Bonjour.\n")
        args.append(f"input={tmp_path / 'in.fr'}")
    if change == "variants":
        args.append("eval.pe_variants={x: {}}")
    with pytest.raises(SystemExit) as exit_info:
        command(args)
    message = str(exit_info.value.code)
    assert "\n" not in message and re.search(REFUSALS[change], message), message
