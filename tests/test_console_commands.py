"""The console commands of pyproject.toml are posenc's ``python`` forms under other names
(:mod:`posenc.cli`), so fairseq and Hugging Face users find ``posenc-train`` and its kin."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT, SMOKE, pythonpath

from posenc import cli


def console_scripts() -> dict[str, object]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    found = {}
    for name, target in scripts.items():
        module, _, attribute = target.partition(":")
        found[name] = getattr(importlib.import_module(module), attribute)
    return found


@pytest.mark.parametrize(
    "command, module",
    [
        ("posenc-evaluate", "posenc.evaluation.standalone"),  # python -m posenc.evaluation
        ("posenc-translate", "posenc.translate"),  # python -m posenc.translate
        ("posenc-report", "posenc.analysis.report.build"),  # python scripts/report.py
        ("posenc-data", "posenc.data.fetch"),  # python -m posenc.data.fetch
    ],
)
def test_each_console_command_runs_the_python_form_it_names(monkeypatch, command, module):
    called = []
    monkeypatch.setattr(importlib.import_module(module), "main", lambda: called.append(module))
    with contextlib.suppress(SystemExit):  # posenc-data exits with its main's status
        console_scripts()[command]()
    assert called == [module]


def test_posenc_train_is_train_py():
    assert console_scripts()["posenc-train"] is cli.train
    assert "from posenc.cli import train" in (ROOT / "train.py").read_text()


def test_posenc_train_trains_a_run_as_train_py_does(tmp_path: Path):
    """The entry point's function, started from another directory, finds configs/ and names
    its log train.log."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from posenc.cli import train; train()",
            *SMOKE,
            "trainer.max_steps=2",
            "eval.enabled=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "train.log").is_file() and (run_dir / "train_summary.json").is_file()
