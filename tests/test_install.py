"""posenc installed as a wheel, not from the checkout: its configs travel inside the package, so
a toy training and its report work from any folder, and a run records no commit (an installed
copy is no checkout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.slow
def test_a_wheel_trains_and_reports_from_another_folder(tmp_path):
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    source = tmp_path / "source"  # a copy: building writes build/ and egg-info/ beside the code
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", source / "src", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("posenc-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)],
        check=True,
    )  # fmt: skip
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}

    def posenc(*code: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", "\n".join(code)], cwd=work, env=env, capture_output=True,
            text=True, check=False,
        )  # fmt: skip

    where = posenc("import posenc; print(posenc.__file__)")
    assert where.stdout.startswith(str(site)), where.stderr
    trained = posenc(
        "import sys; from posenc.cli import train",
        "sys.argv = ['posenc-train', '-m', 'experiment=smoke', 'pe=rope,nonepe',"
        " 'eval.max_sentences=8', 'trainer.progress=false', 'hydra.sweep.dir=sweep']",
        "train()",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    runs = sorted((work / "sweep").glob("pe=*/train_summary.json"))
    assert len(runs) == 2
    assert json.loads(runs[0].read_text())["code"]["commit"] is None
    reported = posenc(
        "import sys; from posenc.cli import report",
        "sys.argv = ['posenc-report', 'sweep']",
        "report()",
    )
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert (work / "sweep" / "report" / "report.md").is_file()
