"""Sampling (``eval.sampling=true`` with ``eval.top_k``, ``eval.top_p``, ``eval.temperature``,
``eval.seed``): its filters keep what a slow, obvious reference keeps; its draws follow the
filtered distribution and never pick a token it left out; at its greedy limits (top-k 1, a
nucleus of one token, a temperature towards 0) it is greedy decoding; the same seed gives the
same translations, with or without the key/value cache and whatever the batches; and settings
that make no sense are refused in one line."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import PE_NAMES, ROOT, tiny_model
from omegaconf import OmegaConf
from torch import Tensor, nn

from posenc.config import SAMPLING_KEYS, EvalConfig, check_types
from posenc.config.identity import evaluation_identity
from posenc.evaluation.decode import DecodeSettings, decode_sources
from posenc.model.sampling import Sampling, filter_logits, inverse_cdf

PAD, BOS, EOS = 0, 1, 2
SPECIALS = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
CPU = torch.device("cpu")


class NoSpecials(nn.Module):
    """An output head whose padding and BOS logits are ``-inf``: greedy decoding then chooses
    among the tokens sampling draws from (it never draws padding or BOS)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: Tensor) -> Tensor:
        return self.head(hidden).index_fill(-1, torch.tensor([PAD, BOS]), -math.inf)


def model_without_specials(name: str = "rope"):
    model = tiny_model(name).double().eval()
    model.output = NoSpecials(model.output)
    return model


def padded_sources(vocab: int = 40) -> Tensor:
    """``(3, 9)`` random sources of 9, 6 and 3 tokens, right-padded."""
    src = torch.randint(3, vocab, (3, 9))
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    return src


# ---------------------------------------------------------------- the filters


def reference_filter(
    logits: list[float], top_k: int | None, top_p: float | None, temperature: float
) -> list[float]:
    """The slow, obvious reference: the probabilities sampling draws from. Divide by the
    temperature, keep the ``top_k`` largest, renormalise; sort what is left by probability and
    keep tokens while the probability of those before is below ``top_p``; renormalise."""
    scaled = [x / temperature for x in logits]
    ranked = sorted(range(len(scaled)), key=lambda i: (-scaled[i], i))
    kept = ranked[:top_k] if top_k is not None else ranked
    top = max(scaled[i] for i in kept)
    weight = {i: math.exp(scaled[i] - top) for i in kept}
    probs = {i: w / sum(weight.values()) for i, w in weight.items()}
    if top_p is not None and top_p < 1:
        nucleus, mass = [], 0.0
        for i in kept:
            if mass >= top_p:
                break
            nucleus.append(i)
            mass += probs[i]
        probs = {i: probs[i] / sum(probs[j] for j in nucleus) for i in nucleus}
    return [probs.get(i, 0.0) for i in range(len(logits))]


FIXED = [2.0, -1.0, 0.5, 3.0, 0.0, 1.5, -3.0, 0.7]  # probabilities 0.26 .. 0.001, no ties


@pytest.mark.parametrize("top_k", [None, 1, 2, 5, 8, 20])
@pytest.mark.parametrize("top_p", [None, 1e-6, 0.3, 0.5, 0.8, 0.95, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_the_filters_keep_what_the_reference_keeps(top_k, top_p, temperature):
    logits = torch.tensor([FIXED, FIXED[::-1]], dtype=torch.float64)
    probs = filter_logits(logits, top_k, top_p, temperature).softmax(-1)
    for row, values in zip(probs.tolist(), [FIXED, FIXED[::-1]], strict=True):
        assert row == pytest.approx(reference_filter(values, top_k, top_p, temperature), abs=1e-12)


def test_a_nucleus_ends_with_the_token_that_reaches_top_p():
    """Probabilities 0.5, 0.3, 0.2: top_p 0.4 keeps the most probable (it reaches 0.4 alone),
    0.6 and 0.79 the two most probable, 0.81 all three."""
    logits = torch.tensor([[math.log(0.2), math.log(0.5), math.log(0.3)]], dtype=torch.float64)
    for top_p, kept in [(0.4, [1]), (0.6, [1, 2]), (0.79, [1, 2]), (0.81, [0, 1, 2])]:
        left = filter_logits(logits, top_p=top_p).isfinite()[0]
        assert left.nonzero().flatten().tolist() == kept, top_p


def test_draws_follow_the_distribution_and_never_pick_a_token_left_out():
    """Inverting the cumulative distribution at N evenly spaced numbers gives each token its
    probability's share of them (to one draw); the extremes of [0, 1) pick a kept token."""
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.45, 0.25, 0.2, 0.0]], dtype=torch.float64)
    n = 1000
    uniforms = torch.arange(n, dtype=torch.float64) / n
    drawn = inverse_cdf(probs.expand(n, -1), uniforms)
    counts = torch.bincount(drawn, minlength=probs.shape[1])
    assert (counts - probs[0] * n).abs().max() <= 1
    edges = torch.tensor([0.0, 1 - 2**-53], dtype=torch.float64)
    assert inverse_cdf(probs.expand(2, -1), edges).tolist() == [1, 5]
    single = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float32)
    assert inverse_cdf(single.expand(2, -1), edges).tolist() == [2, 2]


# ---------------------------------------------------------------- sampling at its greedy limits


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(top_k=1, seed=1),
        Sampling(top_p=1e-9, seed=2),
        Sampling(temperature=1e-9, seed=3),
        Sampling(top_k=1, top_p=0.9, temperature=5.0, seed=4),
    ],
    ids=["top_k=1", "top_p=1e-9", "temperature=1e-9", "top_k=1,T=5"],
)
def test_sampling_at_its_greedy_limits_is_greedy_decoding(sampling):
    model = model_without_specials()
    src = padded_sources()
    greedy = model.generate(src, max_len_a=2.0, max_len_b=5)
    assert any(len(row) > 3 for row in greedy)
    assert model.generate(src, max_len_a=2.0, max_len_b=5, sampling=sampling) == greedy


def test_sampling_draws_other_tokens_than_greedy_decoding():
    model = model_without_specials()
    src = padded_sources()
    greedy = model.generate(src, max_len_a=2.0, max_len_b=5)
    sampled = model.generate(src, max_len_a=2.0, max_len_b=5, sampling=Sampling(temperature=2.0))
    assert sampled != greedy


def test_sampling_never_draws_padding_or_bos():
    """The plain head gives padding and BOS a probability, which greedy decoding of this
    untrained model even chooses; sampling leaves them out, as beam search does."""
    model = tiny_model("rope").double().eval()
    src = padded_sources()
    for seed in range(5):
        rows = model.generate(src, 2.0, 5, sampling=Sampling(temperature=3.0, seed=seed))
        assert not {PAD, BOS} & {token for row in rows for token in row}


# ---------------------------------------------------------------- reproducibility


def test_the_same_seed_gives_the_same_translations_and_another_seed_others():
    model = model_without_specials()
    src = padded_sources()
    first = model.generate(src, 2.0, 5, sampling=Sampling(top_p=0.9, seed=7))
    torch.manual_seed(123)  # the global RNG plays no part
    again = model.generate(src, 2.0, 5, sampling=Sampling(top_p=0.9, seed=7))
    other = model.generate(src, 2.0, 5, sampling=Sampling(top_p=0.9, seed=8))
    assert first == again
    assert first != other


def test_sampling_leaves_the_global_random_state_alone():
    model, src = model_without_specials(), padded_sources()
    state = torch.get_rng_state()
    model.generate(src, 2.0, 5, sampling=Sampling(seed=3))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("name", PE_NAMES)
def test_cached_sampling_equals_full_recomputation(name):
    model = tiny_model(name).double().eval()
    src = padded_sources()
    sampling = Sampling(top_k=20, top_p=0.95, temperature=1.5, seed=11)
    cached = model.generate(src, 2.0, 5, use_cache=True, sampling=sampling)
    full = model.generate(src, 2.0, 5, use_cache=False, sampling=sampling)
    assert cached == full
    assert any(len(row) > 3 for row in cached)


def test_a_sentence_draws_the_same_tokens_in_any_batch():
    """Sentence ``i`` draws from its own generator: decoded with others, alone, or in batches
    of another token budget, it gets the same translation."""
    model = model_without_specials()
    src = padded_sources()
    sampling = Sampling(temperature=1.5, seed=5)
    together = model.generate(src, 1.0, 4, sampling=sampling)
    alone = [
        model.generate(src[row : row + 1, :length], 1.0, 4, sampling=sampling, sentence_ids=[row])
        for row, length in enumerate([9, 6, 3])
    ]
    assert together == [rows[0] for rows in alone]
    sources = [torch.randint(3, 40, (n,)).tolist() for n in (7, 2, 9, 4, 1, 6)]
    settings = DecodeSettings(batch_tokens=12, max_len_a=1.0, max_len_b=4, sampling=sampling)
    batched, _ = decode_sources(model, SPECIALS, sources, settings, CPU)
    one_batch, _ = decode_sources(
        model, SPECIALS, sources, replace(settings, batch_tokens=999), CPU
    )
    assert batched == one_batch
    shifted, _ = decode_sources(
        model, SPECIALS, sources[1:], settings, CPU, sentence_ids=range(1, 6)
    )
    assert shifted == batched[1:]


# ---------------------------------------------------------------- refusals


def eval_settings(**changes) -> dict:
    """``configs/eval/default.yaml`` as a dict, with ``changes``."""
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "eval" / "default.yaml"))
    return {**node, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sampling": True, "top_p": 0}, "eval.top_p=0 must be a number in (0, 1] or null"),
        ({"sampling": True, "top_p": 1.5}, "eval.top_p=1.5 must be a number in (0, 1] or null"),
        ({"sampling": True, "top_k": 0}, "eval.top_k=0 must be an integer >= 1 or null"),
        (
            {"sampling": True, "temperature": 0},
            "eval.temperature=0 must be a number > 0 or null",
        ),
        (
            {"sampling": True, "temperature": -1.0},
            "eval.temperature=-1.0 must be a number > 0 or null",
        ),
        ({"sampling": True, "seed": -1}, "eval.seed=-1 must be an integer >= 0 or null"),
        (
            {"sampling": True, "beam_size": 4},
            "eval.sampling=true draws one translation per sentence, not a beam: it needs "
            "eval.beam_size=1 (not 4)",
        ),
        (
            {"top_p": 0.9},
            "eval.top_p=0.9 is a sampling setting: set eval.sampling=true too, or leave "
            "eval.top_p null",
        ),
        ({"sampling": False, "seed": 3}, "eval.seed=3 is a sampling setting"),
    ],
)
def test_settings_that_make_no_sense_are_refused_in_one_line(changes, message):
    """Refused where a run starts (``check_types``) and where decoding reads them."""
    settings = eval_settings(**changes)
    with pytest.raises(ValueError, match="^" + re.escape(message)) as at_start:
        check_types({"eval": settings})
    with pytest.raises(ValueError, match="^" + re.escape(message)) as when_read:
        EvalConfig.of(settings)
    assert "\n" not in str(at_start.value) + str(when_read.value)


def test_the_defaults_are_off_and_leave_evaluations_as_they_were():
    """Every sampling setting defaults to null, which evaluation identities leave out: an
    evaluation made before they existed keeps its identity, and decodes greedily."""
    settings = eval_settings()
    assert all(settings[key] is None for key in ("sampling", *SAMPLING_KEYS))
    older = {k: v for k, v in settings.items() if k not in ("sampling", *SAMPLING_KEYS)}
    assert evaluation_identity({"eval": settings}) == evaluation_identity({"eval": older})
    assert decode_settings(settings).sampling is None
    sampled = decode_settings({**settings, "sampling": True, "top_p": 0.9}).sampling
    assert sampled == Sampling(top_k=None, top_p=0.9, temperature=1.0, seed=0)


def decode_settings(settings: dict) -> DecodeSettings:
    return DecodeSettings.of(EvalConfig.of(settings))
