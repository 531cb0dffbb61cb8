"""The standalone evaluation command, ``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``:
the run's saved config with the overrides applied (typos and wrong types refused), scored into
``RUN/evals/<overrides>,step=N/`` so it never replaces what training wrote; re-running the same
evaluation reads the one already there."""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from posenc.config import EvalConfig
from posenc.evaluation.evaluate import average_last, evaluate
from posenc.model.factory import checkpoint_path, load_run_model
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.device import resolve_device
from posenc.runtime.files import read_json

log = logging.getLogger("posenc.evaluation")

USAGE = "usage: python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]"


def compose_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The run's saved ``config.yaml`` with ``overrides`` applied by Hydra in struct mode (an
    unknown key is refused), then the schema's type and range checks.

    Raises:
        SystemExit: with one line naming the bad override or value.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from posenc.config import check_types

    # eval.pe_variants is a free-form mapping (variant name -> pe settings): replaced whole; an
    # eval setting with a default may be missing from a run saved before it existed: added.
    added = (
        "eval.pe_variants",
        *(f"eval.{f.name}" for f in fields(EvalConfig) if f.default is not MISSING),
    )
    overrides = [f"++{o}" if o.split("=", 1)[0] in added else o for o in overrides]
    try:
        with initialize_config_dir(str(run_dir.resolve()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        check_types(OmegaConf.to_container(cfg, resolve=True))
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = lines[0] if lines else type(err).__name__
        cause = str(err.__cause__ or "").splitlines()
        if cause and "not in struct" in cause[0]:
            unknown = cause[0].replace("is not in struct", "is not in the run's config")
            message = f"{message.rstrip('.')}: {unknown}"
        raise SystemExit(f"posenc.evaluation.evaluate: {message}") from None
    return cfg


#: overrides that change how an evaluation runs, never what it scores: left out of its name, so
#: the same evaluation with a progress bar or on another device reads the one already there
NOT_IN_NAME = frozenset({"trainer.progress", "device", "threads"})


def evaluation_dir(run_dir: Path, overrides: list[str], step: int) -> Path:
    """``RUN/evals/<overrides>,step=N``: one directory per distinct standalone evaluation
    (:data:`NOT_IN_NAME` left out)."""
    scored = [o for o in overrides if o.partition("=")[0].lstrip("+~") not in NOT_IN_NAME]
    items = sorted([*scored, f"step={step}"])
    name = re.sub(r"[^\w.=,+\-{}:\[\]]", "_", ",".join(items))
    return run_dir / "evals" / name


def check_run_dir(run_dir: Path) -> None:
    """SystemExit (one line) unless ``run_dir`` is a posenc run that did not fail."""
    if not (run_dir / "config.yaml").exists():
        raise SystemExit(f"{run_dir / 'config.yaml'} not found: is {run_dir} a posenc run?")
    failed = read_json(run_dir / "failed.json")
    if failed is not None:
        raise SystemExit(
            f"{run_dir} failed ({failed.get('error')}: {failed.get('message')}); fix the cause "
            "and run its training command again"
        )


def existing_checkpoint(run_dir: Path, which: str) -> Path:
    """The checkpoint ``eval.checkpoint`` names; SystemExit (one line) when there is none."""
    path = checkpoint_path(run_dir, which)
    if not path.exists():
        raise SystemExit(
            f"{run_dir} has no checkpoint ({path.relative_to(run_dir)}); train it first"
        )
    return path


def load_checked(run_dir: Path, cfg: DictConfig) -> tuple:
    """:func:`load_run_model` at the checkpoint ``eval.checkpoint`` names, or averaged over the
    last ``eval.average_last`` step checkpoints; SystemExit (one line) when they are missing
    or unreadable."""
    averaged_count = average_last(cfg)
    if averaged_count == 1:
        existing_checkpoint(run_dir, cfg.eval.checkpoint)
    device = resolve_device(cfg.device)
    try:
        return load_run_model(run_dir, cfg, cfg.eval.checkpoint, device, averaged_count)
    except CheckpointError as err:
        raise SystemExit(str(err)) from None


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``: overrides apply to the run's
    saved config (e.g. ``eval.use_cache=false``, ``eval.splits=[test,long]``); the results go
    to ``RUN/evals/<overrides>,step=N/``."""
    args = list(sys.argv[1:] if argv is None else argv)
    run_args = [a for a in args if a.startswith("run_dir=")]
    if len(run_args) != 1:
        raise SystemExit(USAGE)
    run_dir = Path(run_args[0].split("=", 1)[1]).expanduser()
    overrides = [a for a in args if not a.startswith("run_dir=")]
    check_run_dir(run_dir)
    cfg = compose_run_config(run_dir, overrides)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    loaded = load_checked(run_dir, cfg)
    out_dir = evaluation_dir(run_dir, overrides, loaded[2])
    metrics = read_json(out_dir / "metrics.json")
    if metrics is not None:
        log.info("%s holds this evaluation already; delete it to evaluate again", out_dir)
    else:
        metrics = evaluate(cfg, run_dir, out_dir, loaded)
        OmegaConf.save(cfg, out_dir / "eval_config.yaml")
        log.info("results in %s", out_dir)
    print(
        json.dumps(
            {
                s: {k: v for k, v in m.items() if k != "buckets"}
                for s, m in metrics["splits"].items()
            },
            indent=2,
        )
    )
