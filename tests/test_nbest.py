"""N-best lists (``python -m posenc.translate ... eval.beam_size=5 nbest=3``, as fairseq's
``--nbest``): beam search's N best hypotheses of each sentence, sorted by score, the first the
translation beam search gives, each score the model's length-normalised log-probability of it
recomputed by teacher forcing; the translate command writes them as
``sentence_index<TAB>rank<TAB>score<TAB>log_prob<TAB>translation`` and refuses, in one line,
an n-best list it cannot make. Sampling goes through the command and the evaluation too."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import PE_NAMES, SMOKE, compose, tiny_model
from omegaconf import OmegaConf
from torch import Tensor

from posenc.config import SAMPLING_KEYS
from posenc.config import data as typed
from posenc.data.splits import load_corpora
from posenc.evaluation.decode import DecodeSettings, decode_nbest, decode_sources
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.search import beam_search
from posenc.translate import main as translate_main
from posenc.translate import one_line

PAD, BOS, EOS = 0, 1, 2
SPECIALS = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
CPU = torch.device("cpu")


def padded_sources(vocab: int = 40) -> Tensor:
    """``(3, 9)`` random sources of 9, 6 and 3 tokens, right-padded."""
    src = torch.randint(3, vocab, (3, 9))
    src[1, 6:] = PAD
    src[2, 3:] = PAD
    return src


def teacher_forced_log_prob(model, src: Tensor, tokens: list[int]) -> float:
    """The model's summed log-probability of ``tokens`` and EOS as a translation of ``src
    (1, Ls)``, by one teacher-forced pass."""
    with torch.no_grad():
        log_probs = model(src, torch.tensor([[BOS, *tokens]])).log_softmax(-1)[0]
    return sum(log_probs[i, t].item() for i, t in enumerate([*tokens, EOS]))


# ---------------------------------------------------------------- the lists


@pytest.mark.parametrize("name", ["rope", "t5", "alibi", "learned"])
@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.0])
def test_an_nbest_list_is_sorted_its_first_is_the_translation_and_its_scores_the_models(
    name, lenpen
):
    model = tiny_model(name).double().eval()
    src = padded_sources()
    found = model.nbest(src, 3, 5, lenpen, max_len_a=1.0, max_len_b=4)
    best = model.generate(src, 1.0, 4, beam_size=5, lenpen=lenpen)
    assert [hypotheses[0].tokens for hypotheses in found] == best
    for row, length in enumerate([9, 6, 3]):
        hypotheses = found[row]
        assert len(hypotheses) == 3
        assert len({tuple(h.tokens) for h in hypotheses}) == 3
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        for h in hypotheses:
            log_prob = teacher_forced_log_prob(model, src[row : row + 1, :length], h.tokens)
            assert h.log_prob == pytest.approx(log_prob, rel=1e-9)
            assert h.score == pytest.approx(log_prob / (len(h.tokens) + 1) ** lenpen, rel=1e-9)


@pytest.mark.parametrize("name", PE_NAMES)
def test_an_nbest_list_is_the_head_of_the_beams_hypotheses_with_or_without_the_cache(name):
    model = tiny_model(name).double().eval()
    src = padded_sources()
    full = beam_search(model, src, 4, 0.6, max_len_a=1.0, max_len_b=4, use_cache=False)
    for n in (1, 2, 4):
        found = model.nbest(src, n, 4, 0.6, max_len_a=1.0, max_len_b=4)
        for listed, everything in zip(found, full, strict=True):
            assert [h.tokens for h in listed] == [h.tokens for h in everything[:n]]
            assert [h.score for h in listed] == pytest.approx([h.score for h in everything[:n]])


def test_a_list_is_shorter_where_the_search_finished_fewer_hypotheses():
    """Vocabulary: 1 real token and EOS; a source of 1 token may produce at most 2 tokens
    (EOS included): the translations are "" and "3", so a beam of 4 lists two."""
    model = tiny_model("rope", vocab=4).double().eval()
    (found,) = model.nbest(torch.tensor([[3]]), 4, 4, max_len_a=1.0, max_len_b=1)
    assert sorted(h.tokens for h in found) == [[], [3]]


def test_nbest_lists_come_back_in_input_order_whatever_the_batches():
    model = tiny_model("rope").double().eval()
    sources = [torch.randint(3, 40, (n,)).tolist() for n in (7, 2, 9, 4, 1, 6)]
    settings = DecodeSettings(batch_tokens=12, max_len_a=1.0, max_len_b=4, beam_size=3)
    batched, _ = decode_nbest(model, SPECIALS, sources, settings, CPU, 2)
    one_batch, _ = decode_nbest(
        model, SPECIALS, sources, DecodeSettings(999, 1.0, 4, beam_size=3), CPU, 2
    )
    best, _ = decode_sources(model, SPECIALS, sources, settings, CPU)
    assert [[h.tokens for h in hs] for hs in batched] == [
        [h.tokens for h in hs] for hs in one_batch
    ]
    assert [hypotheses[0].tokens for hypotheses in batched] == best


@pytest.mark.parametrize(
    ("nbest", "beam", "message"),
    [
        (3, 2, "nbest=3 needs a beam at least as wide: eval.beam_size=2"),
        (2, 1, "nbest=2 needs a beam at least as wide: eval.beam_size=1"),
        (0, 3, "nbest=0 needs a beam at least as wide"),
    ],
)
def test_an_nbest_list_longer_than_the_beam_is_refused(nbest, beam, message):
    model = tiny_model("rope").eval()
    settings = DecodeSettings(batch_tokens=12, max_len_a=1.0, max_len_b=4, beam_size=beam)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        decode_nbest(model, SPECIALS, [[3, 4]], settings, CPU, nbest)
    with pytest.raises(ValueError, match=rf"^nbest={nbest} must be in \[1, beam_size={beam}\]"):
        model.nbest(torch.tensor([[3, 4, EOS]]), nbest, beam)


# ---------------------------------------------------------------- the translate command

TRAIN = (*SMOKE, "pe=rope")  # 30 steps: the model translates (into something)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("nbest") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def sources(trained) -> list[str]:
    data = OmegaConf.load(trained / "config.yaml").data
    return load_corpora(typed.data_config(data), with_train=False)["test"].src[:4]


def translated(args: list[str], lines: list[str], monkeypatch, capsys) -> list[str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    translate_main(args)
    return capsys.readouterr().out.splitlines()


def test_nbest_1_writes_exactly_the_translations(trained, sources, monkeypatch, capsys):
    beam = [f"run_dir={trained}", "eval.beam_size=3"]
    plain = translated(beam, sources, monkeypatch, capsys)
    assert translated([*beam, "nbest=1"], sources, monkeypatch, capsys) == plain
    assert len(plain) == 4 and "\t" not in "".join(plain)


def test_nbest_writes_each_sentences_hypotheses_best_first_tab_separated(
    trained, sources, monkeypatch, capsys
):
    """Input: four sentences with a blank line after the second (it has no hypotheses, and
    counts as a line). Output: ``index, rank, score, log_prob, translation``, sentences in
    input order, ranks 1..3 best first; rank 1 is the line ``nbest=1`` writes; the score is
    the log-probability over the length (EOS included) ** lenpen."""
    lines = [*sources[:2], "", *sources[2:]]
    args = [f"run_dir={trained}", "eval.beam_size=4", "eval.lenpen=0.6"]
    best = translated(args, lines, monkeypatch, capsys)
    listed = translated([*args, "nbest=3"], lines, monkeypatch, capsys)
    fields = [line.split("\t") for line in listed]
    assert all(len(f) == 5 for f in fields)
    rows = [
        (int(i), int(rank), float(score), float(lp), text) for i, rank, score, lp, text in fields
    ]
    assert [(i, rank) for i, rank, *_ in rows] == [(i, r) for i in (0, 1, 3, 4) for r in (1, 2, 3)]
    for i in (0, 1, 3, 4):
        mine = [row for row in rows if row[0] == i]
        assert [score for _, _, score, _, _ in mine] == sorted(
            [score for _, _, score, _, _ in mine], reverse=True
        )
        assert mine[0][4] == best[i]
        assert all(lp <= score <= 0 for _, _, score, lp, _ in mine)


def test_sampling_through_the_command_is_reproducible(trained, sources, monkeypatch, capsys):
    """Same seed, same lines (one per input line, whatever characters were drawn); another
    seed, others; a blank line stays blank; top-k 1 is greedy decoding."""
    args = [f"run_dir={trained}", "eval.sampling=true", "eval.top_p=0.9", "eval.temperature=2"]
    first = translated([*args, "eval.seed=1"], sources, monkeypatch, capsys)
    again = translated([*args, "eval.seed=1"], sources, monkeypatch, capsys)
    other = translated([*args, "eval.seed=2"], sources, monkeypatch, capsys)
    with_blank = translated([*args, "eval.seed=1"], ["", *sources], monkeypatch, capsys)
    assert first == again != other
    assert len(first) == 4 and len(with_blank) == 5 and with_blank[0] == ""
    greedy = translated([f"run_dir={trained}"], sources, monkeypatch, capsys)
    top1 = translated(
        [f"run_dir={trained}", "eval.sampling=true", "eval.top_k=1"], sources, monkeypatch, capsys
    )
    assert top1 == greedy


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["nbest=3", "eval.beam_size=2"],
            "nbest=3 needs a beam search at least that wide "
            r"\(eval.beam_size=2\): add eval.beam_size=3 or more",
        ),
        (["nbest=2"], r"nbest=2 needs a beam search at least that wide \(eval.beam_size=1\)"),
        (["nbest=0"], "nbest=0 must be an integer >= 1"),
        (["nbest=two"], "nbest=two must be an integer >= 1"),
        (["nbest=2", "nbest=3", "eval.beam_size=3"], "nbest= must be given once"),
        (["nbst=2"], "unknown argument nbst=; did you mean nbest=\\?"),
        (
            ["nbest=2", "eval.sampling=true"],
            "nbest=2 lists beam search's hypotheses, and eval.sampling=true draws one",
        ),
        (["eval.sampling=true", "eval.beam_size=5"], "eval.sampling=true draws one translation"),
        (["eval.sampling=true", "eval.top_p=0"], r"eval.top_p=0 must be a number in \(0, 1\]"),
        (["eval.sampling=true", "eval.top_k=0"], "eval.top_k=0 must be an integer >= 1"),
        (["eval.sampling=true", "eval.temperature=0"], "eval.temperature=0 must be a number > 0"),
        (["eval.top_k=5"], "eval.top_k=5 is a sampling setting: set eval.sampling=true too"),
    ],
)
def test_what_cannot_be_done_is_refused_in_one_line(trained, args, expected):
    with pytest.raises(SystemExit) as exit_info:
        translate_main([f"run_dir={trained}", *args])
    message = str(exit_info.value.code)
    assert "\n" not in message
    assert re.search(expected, message), message


def test_a_sampled_evaluation_records_its_settings_and_translates_as_the_command_does(
    trained, monkeypatch, capsys
):
    """Sentence ``i`` of a split draws as line ``i`` of the command's input does."""
    settings = ["eval.sampling=true", "eval.top_p=0.9", "eval.temperature=1.5", "eval.seed=1"]
    evaluate_main([f"run_dir={trained}", *settings])
    capsys.readouterr()
    name = "eval.sampling=true,eval.seed=1,eval.temperature=1.5,eval.top_p=0.9,step=30"
    out = trained / "evals" / name
    scores = json.loads((out / "metrics.json").read_text())["splits"]["test"]
    assert scores["sampling"] == {"top_k": None, "top_p": 0.9, "temperature": 1.5, "seed": 1}
    own = json.loads((trained / "metrics.json").read_text())["splits"]["test"]
    assert "sampling" not in own
    data = OmegaConf.load(trained / "config.yaml").data
    sources = load_corpora(typed.data_config(data), with_train=False)["test"].src[:12]
    sampled = [one_line(h) for h in (out / "hypotheses.test.txt").read_text().split("\n")[:-1]]
    greedy = (trained / "hypotheses.test.txt").read_text().splitlines()
    assert len(sampled) == 12 and sampled != greedy
    assert translated([f"run_dir={trained}", *settings], sources, monkeypatch, capsys) == sampled


def test_a_run_saved_before_sampling_existed_can_sample(
    trained, sources, tmp_path, monkeypatch, capsys
):
    """A run whose config has none of the sampling settings decodes as before, and may
    sample."""
    old = tmp_path / "old"
    shutil.copytree(trained, old, ignore=shutil.ignore_patterns("evals"))
    cfg = OmegaConf.load(old / "config.yaml")
    for key in ("sampling", *SAMPLING_KEYS):
        cfg.eval.pop(key)
    OmegaConf.save(cfg, old / "config.yaml")
    args = ["eval.sampling=true", "eval.top_p=0.9", "eval.seed=3"]
    assert translated([f"run_dir={old}"], sources, monkeypatch, capsys) == translated(
        [f"run_dir={trained}"], sources, monkeypatch, capsys
    )
    assert translated([f"run_dir={old}", *args], sources, monkeypatch, capsys) == translated(
        [f"run_dir={trained}", *args], sources, monkeypatch, capsys
    )
