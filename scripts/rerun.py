"""Retrain a run from its own saved settings, whatever posenc's defaults have become since:
``python scripts/rerun.py RUN_DIR NEW_DIR [KEY=VALUE ...]``.

The run's ``config.yaml`` is read as untrusted input and composed as standalone evaluation
composes it (:func:`posenc.evaluation.standalone.compose_run_config`: ``KEY=VALUE`` overrides
of its own keys only, such as ``threads=1`` or ``data.dir=FOLDER`` on another machine), then
trained and evaluated in ``NEW_DIR`` as ``train.py`` would (:func:`posenc.job.run`). A key a
later posenc added reads as it did before the key existed, so the new run trains what the old
one trained; its logged training losses show it (``scalars.csv`` with ``logger.csv=true``, or
``train.log``, which the rerun writes as ``train.py`` does). ``NEW_DIR`` must be new, or a
rerun of the same settings to resume.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from posenc.evaluation.standalone import check_run_dir, compose_run_config
from posenc.job import run
from posenc.runtime.files import RunLogHandler


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0].startswith("-"):
        sys.exit("usage: python scripts/rerun.py RUN_DIR NEW_DIR [KEY=VALUE ...]")
    run_dir, new_dir = Path(argv[0]), Path(argv[1])
    if new_dir.resolve() == run_dir.resolve():
        sys.exit(f"rerun: NEW_DIR is {run_dir} itself; give a new folder")
    check_run_dir(run_dir)
    cfg = compose_run_config(run_dir, argv[2:])
    new_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(  # as train.py logs: the console and the run's train.log
        level=logging.INFO,
        format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s",
        handlers=[logging.StreamHandler(), RunLogHandler(str(new_dir / "train.log"))],
    )
    run(cfg, new_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
