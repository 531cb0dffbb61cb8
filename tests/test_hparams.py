"""TensorBoard's HParams tab compares a sweep: each run writes only its session, the sweep's root
one experiment summary with every value seen. Checked through TensorBoard's own hparams plugin
reading the directory back, as the HParams tab does."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, compose
from google.protobuf import struct_pb2
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf
from tensorboard import context as tb_context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import (
    api_pb2,
    backend_context,
    get_experiment,
    list_session_groups,
    metadata,
)

from posenc.config.settings import Settings
from posenc.job import _log_hparams
from posenc.runtime.hparams import (
    EXPERIMENT_DIR,
    experiment,
    hydra_sweep_root,
    read_sessions,
    sweeps_parent,
    write_all_sweeps_experiment,
    write_sweep_experiment,
)
from posenc.runtime.rundir import RunDir
from posenc.runtime.tblog import RunLogger

#: three fake runs of a sweep: directory -> (settings, final metrics)
RUNS = {
    "pe=nonepe": ({"pe.name": "nonepe", "seed": 0, "trainer.lr": 1e-3}, 6.0, 1.5),
    "pe=rope": ({"pe.name": "rope", "seed": 0, "trainer.lr": 1e-3}, 5.5, 2.5),
    "pe=rope,seed=1": ({"pe.name": "rope", "seed": 1, "trainer.lr": 1e-3}, 5.7, 2.0),
}


def log_run(root: Path, name: str, params: dict, loss: float, bleu: float) -> None:
    """One evaluated run as ``posenc.job`` logs it: a curve, then its HParams session."""
    logger = RunLogger(root / name / "tb")
    logger.scalars(4, {"valid/loss": loss})
    logger.hparams(
        {**params, "model.tied": True, "pe.extra": "None"},
        {"hparam/valid_loss": loss, "hparam/test_bleu": bleu},
        4,
    )
    logger.close()


@pytest.fixture
def sweep(tmp_path) -> Path:
    for name, (params, loss, bleu) in RUNS.items():
        log_run(tmp_path, name, params, loss, bleu)
    return tmp_path


class TensorBoardView:
    """The HParams plugin's backend over a log directory, as ``tensorboard --logdir`` serves
    it (``/data/plugin/hparams/experiment`` and ``/session_groups``)."""

    def __init__(self, logdir: Path) -> None:
        multiplexer = plugin_event_multiplexer.EventMultiplexer()
        multiplexer.AddRunsFromDirectory(str(logdir))
        multiplexer.Reload()
        provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
        self.context = backend_context.Context(
            base_plugin.TBContext(logdir=str(logdir), data_provider=provider)
        )
        self.request = tb_context.RequestContext()

    def experiment(self) -> api_pb2.Experiment:
        request = api_pb2.GetExperimentRequest()
        return get_experiment.Handler(self.request, self.context, "", request).run()

    def session_groups(self, exp: api_pb2.Experiment) -> list[api_pb2.SessionGroup]:
        """The sessions the tab lists with every value of every domain ticked (its default)."""
        columns = [
            api_pb2.ColParams(hparam=info.name, filter_discrete=info.domain_discrete)
            for info in exp.hparam_infos
        ] + [api_pb2.ColParams(metric=info.name) for info in exp.metric_infos]
        request = api_pb2.ListSessionGroupsRequest(
            experiment_name="",
            allowed_statuses=[api_pb2.STATUS_SUCCESS, api_pb2.STATUS_UNKNOWN],
            col_params=columns,
            start_index=0,
            slice_size=100,
        )
        handler = list_session_groups.Handler(self.request, self.context, "", request)
        return list(handler.run().session_groups)


def python(value: struct_pb2.Value):
    return getattr(value, value.WhichOneof("kind"))


def test_the_sweep_summary_shows_the_encoding_as_differing_with_every_value(sweep):
    written = write_sweep_experiment(sweep)
    assert written is not None and EXPERIMENT_DIR.fullmatch(written.name)
    exp = TensorBoardView(sweep).experiment()
    infos = {info.name: info for info in exp.hparam_infos}
    assert infos["pe.name"].differs and infos["seed"].differs
    assert [python(v) for v in infos["pe.name"].domain_discrete.values] == ["nonepe", "rope"]
    assert [python(v) for v in infos["seed"].domain_discrete.values] == [0.0, 1.0]
    assert "trainer.lr" not in infos and "model.tied" not in infos  # constant: left out
    assert infos["seed"].type == api_pb2.DATA_TYPE_FLOAT64
    assert sorted(m.name.tag for m in exp.metric_infos) == ["hparam/test_bleu", "hparam/valid_loss"]


def default_columns(exp: api_pb2.Experiment) -> list[str]:
    """The settings TensorBoard's HParams tab shows before the user picks (its frontend's rule
    on the experiment its backend serves: a stable sort putting differing settings first, then
    the first five)."""
    infos = sorted(exp.hparam_infos, key=lambda info: not info.differs)
    return [info.name for info in infos[:5]]


def test_the_tab_shows_the_settings_that_differ_and_no_constant_one(tmp_path):
    constants = {
        "pe._target_": "posenc.model.encodings.rope.build",
        "data.clean.max_words": 250,
        "data.dir": "data",
        "eval.beam_size": 1,
        "model.d_model": 64,
        "model.encoder_layers": 1,
        "trainer.lr": 1e-3,
        "trainer.max_steps": 2000,
    }
    for name, (params, loss, bleu) in RUNS.items():
        log_run(tmp_path, name, {**params, **constants}, loss, bleu)
    write_sweep_experiment(tmp_path)
    shown = default_columns(TensorBoardView(tmp_path).experiment())
    assert shown == ["pe.name", "seed"]  # what differs, not the encoding's class it implies
    differing = {**constants, "data.clean.max_words": 100}  # a setting that comes to differ
    log_run(tmp_path, "pe=rope,short", {**RUNS["pe=rope"][0], **differing}, 5.0, 3.0)
    write_sweep_experiment(tmp_path)
    assert "data.clean.max_words" in default_columns(TensorBoardView(tmp_path).experiment())


def test_every_run_is_listed_with_its_metrics_under_the_domains(sweep):
    write_sweep_experiment(sweep)
    view = TensorBoardView(sweep)
    groups = view.session_groups(view.experiment())
    assert sorted(g.name for g in groups) == sorted(f"{name}/tb" for name in RUNS)
    for group in groups:
        name = group.name.removesuffix("/tb")
        metrics = {m.name.tag: m.value for m in group.metric_values}
        expected = {"hparam/valid_loss": RUNS[name][1], "hparam/test_bleu": RUNS[name][2]}
        assert metrics == pytest.approx(expected)  # float32 scalars
        assert python(group.hparams["pe.name"]) == RUNS[name][0]["pe.name"]


def test_runs_write_no_experiment_summary_so_a_single_run_shows_its_own(tmp_path):
    log_run(tmp_path, "pe=rope", *RUNS["pe=rope"])
    view = TensorBoardView(tmp_path / "pe=rope")
    tags = view.context.hparams_metadata(view.request, "")
    assert all(metadata.EXPERIMENT_TAG not in t for t in tags.values())
    infos = {info.name: info for info in view.experiment().hparam_infos}  # built from its session
    assert [python(v) for v in infos["pe.name"].domain_discrete.values] == ["rope"]


def test_a_new_run_replaces_the_summary_and_an_unchanged_one_is_kept(sweep):
    first = write_sweep_experiment(sweep)
    assert write_sweep_experiment(sweep) == first  # same sessions: the same directory
    log_run(sweep, "pe=alibi", {"pe.name": "alibi", "seed": 0, "trainer.lr": 2e-3}, 6.1, 1.0)
    second = write_sweep_experiment(sweep)
    assert second != first and not first.exists()
    assert [p.name for p in sweep.iterdir() if EXPERIMENT_DIR.fullmatch(p.name)] == [second.name]
    infos = {info.name: info for info in TensorBoardView(sweep).experiment().hparam_infos}
    assert [python(v) for v in infos["pe.name"].domain_discrete.values] == [
        "alibi",
        "nonepe",
        "rope",
    ]
    assert infos["trainer.lr"].differs


def test_mixed_kinds_keep_each_value_as_the_sessions_hold_it(tmp_path):
    log_run(tmp_path, "a", {"pe.name": "x", "trainer.max_steps": 4}, 1.0, 1.0)
    log_run(tmp_path, "b", {"pe.name": "x", "trainer.max_steps": "None"}, 1.0, 1.0)
    sessions = read_sessions(tmp_path)
    assert [s.run for s in sessions] == ["a/tb", "b/tb"]
    info = {i.name: i for i in experiment(sessions).hparam_infos}["trainer.max_steps"]
    assert info.type == api_pb2.DATA_TYPE_STRING and info.differs
    assert [python(v) for v in info.domain_discrete.values] == [4.0, "None"]


def test_no_session_no_summary(tmp_path):
    (tmp_path / "hparams-0123456789ab").mkdir()  # a stale one goes
    (tmp_path / ".hparams-x.tmp").mkdir()  # and what a killed write left
    RunLogger(tmp_path / "run" / "tb").close()
    assert write_sweep_experiment(tmp_path) is None
    assert not (tmp_path / "hparams-0123456789ab").exists()
    assert not (tmp_path / ".hparams-x.tmp").exists()


def test_the_sweep_root_is_hydras_sweep_dir_in_a_multirun_only(tmp_path):
    run_path = tmp_path / "sweeps" / "x" / "pe=rope"
    assert hydra_sweep_root(run_path) is None  # outside Hydra
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = hydra_compose(
            "train", overrides=["hydra.sweep.dir=sweeps/x"], return_hydra_config=True
        )
    cfg.hydra.runtime.cwd = str(tmp_path)

    def as_job(mode: RunMode) -> None:
        cfg.hydra.mode = mode
        HydraConfig.instance().set_config(cfg)
        OmegaConf.set_readonly(cfg.hydra, False)

    try:
        as_job(RunMode.MULTIRUN)
        assert hydra_sweep_root(run_path) == (tmp_path / "sweeps" / "x").resolve()
        assert hydra_sweep_root(tmp_path / "elsewhere") is None
        as_job(RunMode.RUN)
        assert hydra_sweep_root(run_path) is None
    finally:
        HydraConfig.instance().cfg = None


def test_a_multirun_job_rewrites_the_sweep_summary_when_it_logs_its_session(tmp_path, monkeypatch):
    """What ``posenc.job`` does at the end of an evaluated run, jobs finishing one by one."""
    monkeypatch.setattr("posenc.runtime.hparams.hydra_sweep_root", lambda path: tmp_path)
    for pe, bleu, seed in (("nonepe", 1.0, 0), ("rope", 2.0, 1)):
        run_dir = RunDir(tmp_path / f"pe={pe}")
        metrics = {
            "step": 4,
            "train": {"best_valid_loss": 5.0},
            "splits": {"test": {"bleu": bleu, "chrf": 9.0}},
        }
        _log_hparams(Settings.of(compose(*SMOKE, f"pe={pe}", f"seed={seed}")), run_dir, metrics)
        run_dir.close()
    infos = {info.name: info for info in TensorBoardView(tmp_path).experiment().hparam_infos}
    assert infos["pe.name"].differs
    assert [python(v) for v in infos["pe.name"].domain_discrete.values] == ["nonepe", "rope"]
    assert "cache_dir" not in infos and "seed" in infos  # posenc.config.RUN_CONTROL_KEYS


def test_tensorboard_on_the_folder_of_several_sweeps_shows_every_sweeps_settings(tmp_path):
    """Each sweep keeps its own summary (right for TensorBoard on that sweep); Hydra's
    ``outputs/sweeps`` gets one of every sweep, which TensorBoard on it takes: its filters list
    the values of both sweeps and its metrics both sweeps' scores."""
    sweeps = tmp_path / "outputs" / "sweeps"
    for name, (params, loss, bleu) in RUNS.items():
        log_run(sweeps / "demo", name, {**params, "data.name": "local"}, loss, bleu)
    toy = RunLogger(sweeps / "demo_toy" / "pe=alibi" / "tb")
    toy.hparams({"pe.name": "alibi", "seed": 0, "data.name": "toy"}, {"hparam/toy_bleu": 90.0}, 4)
    toy.close()
    for sweep in ("demo", "demo_toy"):
        write_sweep_experiment(sweeps / sweep)
    assert sweeps_parent(sweeps / "demo") == sweeps.resolve() and sweeps_parent(tmp_path) is None
    written = write_all_sweeps_experiment(sweeps)
    assert written is not None and written.parent == sweeps
    exp = TensorBoardView(sweeps).experiment()
    infos = {info.name: info for info in exp.hparam_infos}
    assert {python(v) for v in infos["data.name"].domain_discrete.values} == {"local", "toy"}
    metrics = {info.name.tag for info in exp.metric_infos}
    assert {"hparam/test_bleu", "hparam/toy_bleu"} <= metrics
    one = TensorBoardView(sweeps / "demo").experiment()  # a sweep on its own: its summary,
    assert "data.name" not in {i.name for i in one.hparam_infos}  # where data.name is constant
    assert len(read_sessions(sweeps)) == 4  # the summary file is no session
    again = write_all_sweeps_experiment(sweeps)
    assert sorted(p.name for p in sweeps.glob("*tfevents*")) == [again.name]
