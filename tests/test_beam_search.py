"""Beam search (``eval.beam_size``, ``eval.lenpen``): at width 1 it is greedy decoding; as wide
as the search space it finds every hypothesis an exhaustive search finds, in the same order; its
key/value cache, the batching of sentences and its scores agree with recomputation, for every
encoding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import PE_NAMES, tiny_model
from torch import Tensor, nn

from posenc.model.search import Hypothesis, beam_search

PAD, BOS, EOS = 0, 1, 2


class NoSpecials(nn.Module):
    """An output head whose padding and BOS logits are ``-inf``: greedy decoding then chooses
    among the tokens beam search chooses among (it never picks padding or BOS)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, hidden: Tensor) -> Tensor:
        logits = self.head(hidden)
        return logits.index_fill(-1, torch.tensor([PAD, BOS]), -math.inf)


def padded_sources(vocab: int = 40) -> Tensor:
    """``(3, 9)`` random sources of 9, 6 and 3 tokens, right-padded."""
    src = torch.randint(3, vocab, (3, 9))
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    return src


def teacher_forced_score(model, src: Tensor, tokens: list[int], lenpen: float) -> float:
    """The score beam search gives ``tokens`` as a translation of ``src (1, Ls)``: the
    log-probabilities of the tokens and EOS, summed, divided by their number ** ``lenpen``."""
    with torch.no_grad():
        log_probs = model(src, torch.tensor([[BOS, *tokens]])).log_softmax(-1)[0]
    total = sum(log_probs[i, t].item() for i, t in enumerate([*tokens, EOS]))
    return total / (len(tokens) + 1) ** lenpen


def exhaustive(model, src: Tensor, limit: int, lenpen: float) -> list[Hypothesis]:
    """The slow, obvious reference: every translation of ``src (1, Ls)`` with at most ``limit``
    tokens (EOS included) made of the real tokens (not padding, BOS or EOS), scored, best
    first."""
    real = range(3, model.src_embed.num_embeddings)
    everything = [
        Hypothesis(list(tokens), teacher_forced_score(model, src, list(tokens), lenpen))
        for length in range(limit)
        for tokens in itertools.product(real, repeat=length)
    ]
    return sorted(everything, key=lambda h: -h.score)


def assert_same_hypotheses(found: list[Hypothesis], expected: list[Hypothesis]) -> None:
    assert [h.tokens for h in found] == [h.tokens for h in expected]
    assert [h.score for h in found] == pytest.approx([h.score for h in expected], rel=1e-9)


@pytest.mark.parametrize("name", PE_NAMES)
def test_a_beam_of_width_1_gives_exactly_greedy_tokens(name):
    model = tiny_model(name).double().eval()
    model.output = NoSpecials(model.output)
    src = padded_sources()
    greedy = model.generate(src, max_len_a=2.0, max_len_b=5)
    assert model.generate(src, max_len_a=2.0, max_len_b=5, beam_size=1) == greedy
    found = beam_search(model, src, 1, max_len_a=2.0, max_len_b=5)
    assert [hypotheses[0].tokens for hypotheses in found] == greedy
    assert any(len(row) > 3 for row in greedy)


@pytest.mark.parametrize("name", PE_NAMES)
def test_a_beam_as_wide_as_the_search_space_finds_what_exhaustive_search_finds(name):
    """Vocabulary: 3 real tokens and EOS. Sources of 3 and 5 tokens with ``max_len_a=0.5,
    max_len_b=2`` may produce 3 and 4 tokens: 1 + 3 + 9 = 13 and 13 + 27 = 40 translations, so
    a beam of 40 drops none and returns them all, in the exhaustive search's order."""
    model = tiny_model(name, vocab=6).double().eval()
    src = torch.tensor([[3, 4, 5, PAD, PAD], [5, 3, 4, 4, 3]])
    for lenpen in (0.0, 1.0, 2.0):
        found = beam_search(model, src, 40, lenpen, max_len_a=0.5, max_len_b=2)
        for row, (length, limit) in enumerate([(3, 3), (5, 4)]):
            expected = exhaustive(model, src[row : row + 1, :length], limit, lenpen)
            assert len(expected) == (13, 40)[row]
            assert_same_hypotheses(found[row], expected)


@pytest.mark.parametrize("name", PE_NAMES)
def test_cached_beam_search_equals_full_recomputation(name):
    model = tiny_model(name).double().eval()
    src = padded_sources()
    cached = beam_search(model, src, 4, 0.6, max_len_a=2.0, max_len_b=5, use_cache=True)
    full = beam_search(model, src, 4, 0.6, max_len_a=2.0, max_len_b=5, use_cache=False)
    for with_cache, without in zip(cached, full, strict=True):
        assert len(with_cache) == 4
        assert_same_hypotheses(with_cache, without)
    best = model.generate(src, max_len_a=2.0, max_len_b=5, beam_size=4, lenpen=0.6)
    assert best == [hypotheses[0].tokens for hypotheses in cached]


@pytest.mark.parametrize("name", PE_NAMES)
def test_sentences_decoded_together_or_one_at_a_time_get_the_same_hypotheses(name):
    """Padding and the other sentences of a batch change nothing; a sentence that finishes
    early leaves the batch without disturbing the others."""
    model = tiny_model(name).double().eval()
    src = padded_sources()
    together = beam_search(model, src, 3, max_len_a=1.0, max_len_b=4)
    for row, length in enumerate([9, 6, 3]):
        (alone,) = beam_search(model, src[row : row + 1, :length], 3, max_len_a=1.0, max_len_b=4)
        assert_same_hypotheses(together[row], alone)


@pytest.mark.parametrize("name", PE_NAMES)
def test_every_score_is_the_models_length_normalised_log_probability(name):
    """A narrow beam prunes and reorders its hypotheses (and the cache rows with them) at every
    step; each hypothesis it returns still carries exactly the model's score of its tokens."""
    model = tiny_model(name).double().eval()
    src = padded_sources()
    found = beam_search(model, src, 3, 1.5, max_len_a=1.0, max_len_b=4)
    for row, length in enumerate([9, 6, 3]):
        for hypothesis in found[row]:
            expected = teacher_forced_score(
                model, src[row : row + 1, :length], hypothesis.tokens, 1.5
            )
            assert hypothesis.score == pytest.approx(expected, rel=1e-9)
            assert len(hypothesis.tokens) < length * 1.0 + 4
