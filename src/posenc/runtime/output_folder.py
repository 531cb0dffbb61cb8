"""Hydra's output folder checked before Hydra makes it: a ``hydra.run.dir`` (or
``hydra.sweep.dir``) that cannot be made or written to ends the command in one line naming
the folder and the fix, where Hydra would show a traceback from its own ``mkdir``. A Hydra
callback (``configs/train.yaml``, ``hydra.callbacks``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def check_writable(folder: Path, key: str) -> None:
    """Make ``folder`` (and its parents) and write a file in it.

    Raises:
        SystemExit: one line naming ``key``, the folder and the fix.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise SystemExit(
            f"error: {key}={folder} cannot be made or written to ({reason}); choose a folder "
            f"you can write to: {key}=DIR"
        ) from None


class WritableOutput(Callback):
    """Checks the run folder before a single run and the sweep folder before a multirun."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_writable(Path(os.path.abspath(config.hydra.run.dir)), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_writable(Path(os.path.abspath(config.hydra.sweep.dir)), "hydra.sweep.dir")
