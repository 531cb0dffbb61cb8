"""The console commands: posenc-train, -evaluate, -translate and -report.

Each is the same as its ``python`` form (``[project.scripts]`` in pyproject.toml), with the same
arguments:

* ``posenc-train [OVERRIDES]`` = ``python train.py [OVERRIDES]`` (``-m`` for a sweep);
* ``posenc-evaluate run_dir=RUN [KEY=VALUE ...]`` = ``python -m posenc.evaluation ...``;
* ``posenc-translate run_dir=RUN [input=FILE] ...`` = ``python -m posenc.translate ...``;
* ``posenc-report SWEEP [--split ...]`` = ``python scripts/report.py ...``.

They read ``configs/`` of the checkout posenc is installed from (``pip install -e .``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from posenc.config import CONFIG_DIR, unknown_setting
from posenc.job import hydra_job, objective, run


def train() -> None:
    """``posenc-train`` and ``python train.py``: an override of no setting of a typed group ends
    it in one line naming the closest setting, before Hydra makes a run directory; then
    :func:`train_job` under Hydra."""
    for arg in sys.argv[1:]:
        key, equals, _ = arg.partition("=")
        problem = equals and not key.startswith("hydra") and unknown_setting(key)
        if problem:
            raise SystemExit(f"train: {problem}")
    train_job()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
def train_job(cfg: DictConfig) -> float | None:
    """Train and evaluate one run (a sweep's job under ``-m``); returns the sweep objective."""
    run_dir, multirun = hydra_job()
    run(cfg, run_dir, multirun)
    return objective(cfg, run_dir)


def evaluate() -> None:
    """``posenc-evaluate``: :func:`posenc.evaluation.standalone.main` (imported when called, so
    that training starts without the evaluation's and the report's imports)."""
    from posenc.evaluation.standalone import main

    main()


def translate() -> None:
    """``posenc-translate``: :func:`posenc.translate.main`."""
    from posenc.translate import main

    main()


def report() -> None:
    """``posenc-report``: :func:`posenc.analysis.report.build.main`."""
    from posenc.analysis.report.build import main

    main()
