"""The console commands: posenc-train, -evaluate, -translate, -report and -data.

Each is the same as its ``python`` form (``[project.scripts]`` in pyproject.toml), with the same
arguments:

* ``posenc-train [OVERRIDES]`` = ``python train.py [OVERRIDES]`` (``-m`` for a sweep);
* ``posenc-evaluate run_dir=RUN [KEY=VALUE ...]`` = ``python -m posenc.evaluation ...``;
* ``posenc-translate run_dir=RUN [input=FILE] ...`` = ``python -m posenc.translate ...``;
* ``posenc-report SWEEP [--split ...]`` = ``python scripts/report.py ...``;
* ``posenc-data fetch [--to DIR] [--mirror URL]`` = ``python -m posenc.data.fetch ...``.

They read ``configs/`` of the checkout posenc is installed from (``pip install -e .``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from posenc.config import CONFIG_DIR, unknown_setting
from posenc.config.options import quoted_path, unknown_key, unknown_option
from posenc.job import hydra_job, objective, run


def train() -> None:
    """``posenc-train`` and ``python train.py``: an override naming no option of a config group
    (``experiment=smok``) or no setting (``pe.bas=1``) ends it in one line naming the closest,
    before Hydra makes a run directory (a path pasted as it is, a run directory's name with its
    ``=`` and ``,``, is quoted for Hydra first); then :func:`train_job` under Hydra."""
    sys.argv[1:] = [quoted_path(arg) for arg in sys.argv[1:]]
    for arg in sys.argv[1:]:
        key, equals, value = arg.partition("=")
        if not equals or key.startswith("hydra"):
            continue
        problem = unknown_option(key, value) or unknown_setting(key) or unknown_key(key)
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


def data() -> None:
    """``posenc-data``: :func:`posenc.data.fetch.main`."""
    from posenc.data.fetch import main

    sys.exit(main())
