"""COMET (``eval.comet.model``): off by default; a local model folder, checkpoint or hub name is
loaded through ``unbabel-comet``'s own ``download_model`` and ``load_from_checkpoint`` and scores
(source, hypothesis, reference) triples; a missing package or model gives a null score and the
reason, never a failed run.

``unbabel-comet`` 2.2.7 requires transformers < 5 and numpy < 2, which the suite's environment
does not have, so its real code cannot run here: a stand-in module with the same three
functions records what posenc asks of it."""

from __future__ import annotations

import json
import sys
import types

import pytest
from conftest import SMOKE, compose

from posenc.analysis.report.build import main as report_main
from posenc.evaluation.comet import NOT_INSTALLED, Comet
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run


class StandIn(types.ModuleType):
    """``comet`` as posenc calls it: ``download_model(name) -> checkpoint path``,
    ``load_from_checkpoint(path) -> model``, ``model.predict(samples, ...) -> output`` with a
    ``system_score``."""

    def __init__(self, fail_load: bool = False) -> None:
        super().__init__("comet")
        self.downloaded: list[str] = []
        self.loaded: list[str] = []
        self.predicted: list[tuple[list[dict], dict]] = []
        self.fail_load = fail_load

    def download_model(self, name: str) -> str:
        self.downloaded.append(name)
        return f"/hub/{name}/checkpoints/model.ckpt"

    def load_from_checkpoint(self, path: str):
        if self.fail_load:
            raise RuntimeError("checkpoint is not a COMET model\nsecond line")
        self.loaded.append(path)
        module = self

        class Model:
            def predict(self, samples, **options):
                module.predicted.append((samples, options))
                return types.SimpleNamespace(system_score=0.4321234, scores=[0.4] * len(samples))

        return Model()


@pytest.fixture
def stand_in(monkeypatch):
    module = StandIn()
    monkeypatch.setitem(sys.modules, "comet", module)
    return module


def model_folder(tmp_path):
    folder = tmp_path / "wmt22-comet-da"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.ckpt").write_bytes(b"weights")
    return folder


def test_off_writes_nothing():
    assert Comet(None)(["a"], ["b"], ["c"]) == {}


def test_without_the_package_the_score_is_null_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "comet", None)  # import comet raises ImportError
    scores = Comet("Unbabel/wmt22-comet-da")(["a"], ["b"], ["c"])
    assert scores == {
        "comet": None,
        "comet_model": "Unbabel/wmt22-comet-da",
        "comet_reason": NOT_INSTALLED,
    }
    assert "transformers<5" in NOT_INSTALLED and "numpy<2" in NOT_INSTALLED


def test_a_local_folder_loads_its_checkpoint_and_scores_source_hypothesis_reference(
    stand_in, tmp_path
):
    folder = model_folder(tmp_path)
    comet = Comet(str(folder), batch_size=8)
    scores = comet(["le chat", "un chien"], ["the cat", "a dog"], ["the cat", "one dog"])
    assert scores == {"comet": 0.432123, "comet_model": str(folder), "comet_reason": None}
    assert stand_in.loaded == [str(folder / "checkpoints" / "model.ckpt")]
    assert not stand_in.downloaded
    samples, options = stand_in.predicted[0]
    assert samples == [
        {"src": "le chat", "mt": "the cat", "ref": "the cat"},
        {"src": "un chien", "mt": "a dog", "ref": "one dog"},
    ]
    assert options == {"batch_size": 8, "gpus": 0, "progress_bar": False}
    comet(["x"], ["y"], ["z"])  # a second split reuses the loaded model
    assert len(stand_in.loaded) == 1


def test_a_hub_name_is_fetched_by_comets_own_download(stand_in):
    Comet("Unbabel/wmt22-comet-da")(["a"], ["b"], ["c"])
    assert stand_in.downloaded == ["Unbabel/wmt22-comet-da"]
    assert stand_in.loaded == ["/hub/Unbabel/wmt22-comet-da/checkpoints/model.ckpt"]


def test_a_model_that_cannot_be_loaded_gives_a_null_score_and_its_first_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "comet", StandIn(fail_load=True))
    scores = Comet(str(model_folder(tmp_path)))(["a"], ["b"], ["c"])
    assert scores["comet"] is None
    assert scores["comet_reason"].endswith("could not be loaded: checkpoint is not a COMET model")
    empty = tmp_path / "empty"
    empty.mkdir()
    reason = Comet(str(empty))(["a"], ["b"], ["c"])["comet_reason"]
    assert "has no checkpoints/model.ckpt" in reason


def test_an_evaluation_scores_every_split_and_the_report_names_the_model(stand_in, tmp_path):
    run_dir = tmp_path / "sweep" / "pe=rope"
    run(compose(*SMOKE, "pe=rope", "trainer.max_steps=2", "trainer.valid_every=2"), run_dir)
    assert "comet" not in json.loads((run_dir / "metrics.json").read_text())["splits"]["test"]
    folder = model_folder(tmp_path)
    evaluate_main([f"run_dir={run_dir}", f"eval.comet.model={folder}"])
    (out,) = (run_dir / "evals").glob("*comet*")
    splits = json.loads((out / "metrics.json").read_text())["splits"]
    assert {split["comet"] for split in splits.values()} == {0.432123}
    report_dir = tmp_path / "report"
    report_main([str(run_dir.parent), "--out", str(report_dir), "--eval", out.name])
    report = (report_dir / "report.md").read_text()
    assert f"- COMET: `{folder}`" in report
