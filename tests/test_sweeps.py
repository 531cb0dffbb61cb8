"""Sweeps beyond one process: the launcher presets (``hydra/launcher=parallel`` for joblib on
this machine, ``hydra/launcher=slurm`` for a cluster), and re-running a sweep after some of its
jobs failed: finished runs return at once, failed and unfinished ones run again."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, compose
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig, OmegaConf

import posenc.job as cli
from posenc.runtime.rundir import run_dir_name


def launcher(name: str):
    """The ``hydra.launcher`` node of ``train.yaml`` composed with ``hydra/launcher=name``."""
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = hydra_compose("train", overrides=[f"hydra/launcher={name}"], return_hydra_config=True)
    return cfg.hydra.launcher


def test_the_parallel_preset_is_joblib_with_two_jobs():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    node = launcher("parallel")
    assert node._target_.endswith("joblib_launcher.JoblibLauncher")
    assert node.n_jobs == 2 and node.prefer == "processes"


def test_the_slurm_preset_composes_with_the_submitit_schema():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    node = launcher("slurm")
    assert node._target_.endswith("submitit_launcher.SlurmLauncher")
    assert node.timeout_min == 240 and node.gpus_per_node == 1 and node.tasks_per_node == 1
    assert node.max_num_timeout == 3  # re-queued runs resume from their last checkpoint
    assert node.submitit_folder == "outputs/sweeps/default/.submitit/%j"  # in the sweep dir


def plant_corrupt_checkpoint(run_dir: Path, cfg: DictConfig) -> Path:
    """The run of ``cfg`` in ``run_dir`` as a kill during a save that damaged ``last.pt`` left
    it."""
    path = run_dir / "checkpoints" / "last.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return path


def test_rerunning_a_sweep_runs_only_the_failed_and_missing_jobs(tmp_path, monkeypatch):
    overrides = (*SMOKE, "trainer.max_steps=4", "trainer.valid_every=2")
    jobs = {pe: tmp_path / f"pe={pe}" for pe in ("nonepe", "rope")}
    corrupt = plant_corrupt_checkpoint(jobs["rope"], compose(*overrides, "pe=rope"))
    first = {pe: cli.run(compose(*overrides, f"pe={pe}"), d, True) for pe, d in jobs.items()}
    assert first["nonepe"]["step"] == 4 and first["rope"] is None
    failed = json.loads((jobs["rope"] / "failed.json").read_text())
    assert failed["error"] == "CheckpointError" and str(corrupt) in failed["message"]

    corrupt.unlink()  # what the message says to do
    trained = []

    def recording_train(cfg, run_dir, start=None, **kwargs):
        trained.append(run_dir.path)
        return real_train(cfg, run_dir, start, **kwargs)

    real_train = cli.train
    monkeypatch.setattr(cli, "train", recording_train)
    second = {pe: cli.run(compose(*overrides, f"pe={pe}"), d, True) for pe, d in jobs.items()}
    assert trained == [jobs["rope"]]  # the finished run was not trained again
    assert second["nonepe"] == first["nonepe"]
    assert second["rope"]["step"] == 4 and not (jobs["rope"] / "failed.json").exists()


@pytest.mark.slow
def test_a_parallel_sweep_rerun_retries_only_the_failed_job(tmp_path):
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *SMOKE,
        "pe=nonepe,rope",
        "trainer.max_steps=4",
        "trainer.valid_every=2",
        "hydra/launcher=parallel",
        f"hydra.sweep.dir={sweep}",
    ]
    suffix = ",trainer.valid_every=2"  # budgets are left out of run directory names
    jobs = {}
    for pe in ("nonepe", "rope"):
        cfg = compose(*SMOKE, f"pe={pe}", "trainer.max_steps=4", "trainer.valid_every=2")
        name = run_dir_name(f"pe={pe}{suffix}", OmegaConf.to_container(cfg, resolve=True))
        jobs[pe] = (sweep / name, cfg)
    (nonepe, _), (rope, rope_cfg) = jobs["nonepe"], jobs["rope"]
    corrupt = plant_corrupt_checkpoint(rope, rope_cfg)

    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]  # the sweep goes on past a failure
    assert (nonepe / "metrics.json").exists() and not (rope / "metrics.json").exists()
    assert "CheckpointError" in (rope / "failed.json").read_text()
    finished_at = (nonepe / "metrics.json").stat().st_mtime_ns

    corrupt.unlink()
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (rope / "metrics.json").exists() and not (rope / "failed.json").exists()
    assert (nonepe / "metrics.json").stat().st_mtime_ns == finished_at
    assert "already trained and evaluated; nothing to do" in (nonepe / "train.log").read_text()


def test_the_lr_search_preset_runs_optuna_trials_and_minimises_the_validation_loss(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")  # two trials at a time
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "experiment=lr_search",
        "data=toy",
        "model=tiny",
        "threads=1",
        "tokenizer.vocab_size=1024",
        "tokenizer.min_frequency=1",
        "pe=rope",
        "trainer.max_time=null",
        "trainer.max_steps=4",
        "trainer.valid_every=2",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.n_startup_trials=2",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "outputs" / "sweeps" / "lr_search" / "pe=rope"  # one folder per encoding
    trials = sorted(sweep.glob("*,trainer.lr=*"))
    assert len(trials) == 2
    losses = {
        float(re.split("[,@]", d.name.split("trainer.lr=")[1])[0]): json.loads(
            (d / "train_summary.json").read_text()
        )["best_valid_loss"]
        for d in trials
    }
    assert all(3e-4 <= lr <= 1e-2 for lr in losses)
    best = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {min(losses.values())}" in best
    assert not list(sweep.glob("*/metrics.json"))  # a search trains only
