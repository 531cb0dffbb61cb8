"""Each metric is declared once (:mod:`posenc.config.metrics`) and every part reads it: chrF++
(sacreBLEU's chrF with word bigrams, which WMT reports beside chrF) is one entry there, and an
evaluated run has it in metrics.json, in TensorBoard's HParams and in the report."""

from __future__ import annotations

import json

import pytest
import sacrebleu
import torch
from conftest import SMOKE, compose

from posenc.analysis.report.build import build_report
from posenc.config.metrics import METRICS, SACREBLEU_METRICS, VALIDATION_METRICS, metric
from posenc.config.settings import Settings
from posenc.job import run
from posenc.runtime.hparams import read_sessions
from posenc.runtime.untrusted import UntrustedFileError, check_metrics


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("metrics")
    run(compose(*SMOKE, "pe=rope", "trainer.valid_bleu=4"), sweep / "pe=rope")
    return sweep


def test_every_metric_is_declared_once_with_a_range_and_a_label():
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(m.low < m.high and m.label for m in METRICS)
    assert metric("chrf_pp").label == "chrF++"
    with pytest.raises(KeyError, match="no metric 'ter'; there are bleu, chrf"):
        metric("ter")


def test_an_evaluated_run_holds_chrf_plus_plus_as_sacrebleu_scores_it(evaluated):
    folder = evaluated / "pe=rope"
    scores = json.loads((folder / "metrics.json").read_text())["splits"]["test"]
    hypotheses = (folder / "hypotheses.test.txt").read_text().splitlines()
    references = (folder / "references.test.txt").read_text().splitlines()
    expected = sacrebleu.CHRF(word_order=2).corpus_score(hypotheses, [references]).score
    assert scores["chrf_pp"] == pytest.approx(expected, abs=1e-4)
    assert "nw:2" in scores["chrf_pp_signature"] and "nw:0" in scores["chrf_signature"]


def test_tensorboard_and_validation_read_the_table(evaluated):
    (session,) = read_sessions(evaluated)
    assert {f"hparam/test_{name}" for name in SACREBLEU_METRICS} <= set(session.metrics)
    summary = json.loads((evaluated / "pe=rope" / "train_summary.json").read_text())
    assert summary["best_valid_bleu"] is not None
    assert VALIDATION_METRICS == ("bleu", "chrf")  # chrF++ is not worth each validation's time


def test_the_report_shows_chrf_plus_plus_where_runs_have_it(evaluated, tmp_path):
    markdown = build_report(evaluated, out=tmp_path / "new", samples=10).path.read_text()
    assert "| chrF++ |" in markdown and "sacreBLEU chrF++ signature" in markdown
    metrics_file = evaluated / "pe=rope" / "metrics.json"
    saved = metrics_file.read_text()
    older = json.loads(saved)  # scored before chrF++ existed
    for scores in older["splits"].values():
        del scores["chrf_pp"], scores["chrf_pp_signature"]
    metrics_file.write_text(json.dumps(older))
    try:
        markdown = build_report(evaluated, out=tmp_path / "old", samples=10).path.read_text()
    finally:
        metrics_file.write_text(saved)
    assert "| chrF++ |" not in markdown and "sacreBLEU chrF++ signature" not in markdown
    assert "| chrF |" in markdown


def test_a_metric_out_of_its_range_is_refused_naming_it(evaluated):
    data = json.loads((evaluated / "pe=rope" / "metrics.json").read_text())
    data["splits"]["test"]["chrf_pp"] = 150.0
    with pytest.raises(UntrustedFileError, match=r"splits\.test\.chrf_pp is 150\.0, not"):
        check_metrics(data, evaluated / "metrics.json")
    del data["splits"]["test"]["chrf_pp"]
    assert check_metrics(data, evaluated / "metrics.json")  # optional: older runs lack it


class CountingScorer:
    """A metric computed by a "model": the share of hypotheses as long as their reference."""

    def __init__(self, settings) -> None:
        self.settings = settings

    @classmethod
    def of(cls, settings, device):
        return cls(settings)

    def score(self, sources, hypotheses, references) -> dict:
        same = sum(len(h) == len(r) for h, r in zip(hypotheses, references, strict=True))
        return {"counting": same / len(references), "counting_batch": self.settings.batch_size}


def test_a_metric_computed_by_a_model_is_its_entry_its_scorer_and_its_settings(
    tmp_path, monkeypatch
):
    """BERTScore and COMET are built from their entries (``scorer``, ``settings``), not by
    hand: a new entry alone reaches every split's scores."""
    import posenc.evaluation.evaluate as evaluate_module
    from posenc.config.metrics import MODEL_METRICS, Metric

    assert [m.name for m in MODEL_METRICS] == ["bertscore_f1", "comet"]
    counting = Metric(
        "counting", "Counting", 0.0, 1.0, scorer=f"{__name__}:CountingScorer", settings="comet"
    )
    monkeypatch.setattr(evaluate_module, "MODEL_METRICS", (*MODEL_METRICS, counting))
    cfg = compose(*SMOKE, "pe=nonepe", "trainer.max_steps=2", "eval.comet.batch_size=3")
    built = evaluate_module.model_scorers(Settings.of(cfg).eval, torch.device("cpu"))
    assert [m.name for m, _ in built] == ["bertscore_f1", "comet", "counting"]
    assert built[2][1].settings.batch_size == 3  # the settings group its entry names, typed
    run(compose(*SMOKE, "pe=nonepe", "trainer.max_steps=2", "eval.enabled=false"), tmp_path)
    scores = evaluate_module.evaluate(Settings.of(cfg), tmp_path)["splits"]["test"]
    assert scores["counting_batch"] == 3 and 0.0 <= scores["counting"] <= 1.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+eval.bertscore.modell=x",
            "eval.bertscore.modell is not among the eval.bertscore settings; did you mean "
            "eval.bertscore.model?",
        ),
        ("eval.comet.batch_size=0", "eval.comet.batch_size=0 must be an integer >= 1 or null"),
    ],
)
def test_a_model_metrics_settings_are_typed_by_its_entry_and_refused_in_one_line(override, message):
    """Each entry's settings class reads its ``eval`` group: defaults filled, typos named."""
    typed = Settings.of(compose(*SMOKE)).eval
    assert (typed.bertscore.batch_size, typed.comet.model) == (64, None)
    with pytest.raises(ValueError) as refused:
        Settings.of(compose(*SMOKE, override))
    assert str(refused.value) == message
