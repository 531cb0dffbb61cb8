"""The standalone evaluation command, ``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``:
the run's saved config with the overrides applied (typos, wrong types and changes to the trained
model refused), scored into ``RUN/evals/<overrides>,step=N/`` so it never replaces what training
wrote; re-running the same evaluation reads the one already there.

The run directory is untrusted input: its config.yaml is read with limits before Hydra sees it,
an evaluation is written into a temporary directory renamed into place when complete (Ctrl-C, a
full disk or an error leave nothing half-written), one evaluation of a run at a time
(``RUN/evals/.lock``), and an evaluation directory made under other settings than this one's is
never returned as its answer (this one goes to ``<overrides>,step=N@DIGEST``).

``run_dir=A run_dir=B ...`` scores an ensemble (:mod:`posenc.model.ensemble`) of the runs, each
at the checkpoint its own config names (the overrides applied to each), decoded as A's config
says, into ``A/evals/ensemble=B..._DIGEST,<overrides>,step=N/``: the digest covers the other
runs' paths, checkpoints and steps, so it never replaces a single-model evaluation nor one of
another ensemble."""

from __future__ import annotations

import logging
import re
import shutil
import sys
import traceback
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from posenc.config import EvalConfig
from posenc.config.identity import (
    EVAL_RUN_CONTROL,
    differences,
    digest,
    evaluation_identity,
    identity,
    training_identity,
)
from posenc.config.settings import Settings
from posenc.data.tokenizer import load_tokenizer
from posenc.evaluation.evaluate import evaluate, use_ema
from posenc.model.ensemble import Ensemble, check_same_vocabulary
from posenc.model.factory import checkpoint_path, load_run_model
from posenc.runtime import untrusted
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.cli import Command, one_line_errors
from posenc.runtime.device import resolve_device
from posenc.runtime.files import LinkRefused, refuse_links_leaving, temporary_folder
from posenc.runtime.lock import RunLockedError, run_lock
from posenc.runtime.rundir import RunDir, cut_name
from posenc.runtime.untrusted import UntrustedFileError, read_config

log = logging.getLogger("posenc.evaluation")

#: what ``run_dir=`` is, for both commands over trained runs
RUN_DIR_HELP = (
    "the trained run (a directory with config.yaml and checkpoints/); given again "
    "(run_dir=A run_dir=B ...), an ensemble of the runs, their probabilities averaged at each "
    "step, decoded as the first run's config says"
)

COMMAND = Command(
    "posenc.evaluation",
    {"run_dir": RUN_DIR_HELP},
    ("run_dir",),
    "Evaluate a trained run again under other evaluation settings; the results go to "
    "RUN/evals/<overrides>,step=N/ and replace nothing.",
    "python -m posenc.evaluation run_dir=outputs/runs/default/pe=rope@1a2b3c4d eval.beam_size=5",
    repeatable=("run_dir",),
)


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
        saved = read_config(RunDir(run_dir).config)  # limits first: Hydra reads it next
        with initialize_config_dir(str(run_dir.resolve()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        check_types(OmegaConf.to_container(cfg, resolve=True))
    except UntrustedFileError as err:
        raise SystemExit(f"posenc.evaluation.evaluate: {err}") from None
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = lines[0] if lines else type(err).__name__
        cause = str(err.__cause__ or "").splitlines()
        if cause and "not in struct" in cause[0]:
            unknown = cause[0].replace("is not in struct", "is not in the run's config")
            message = f"{message.rstrip('.')}: {unknown}"
        raise SystemExit(f"posenc.evaluation.evaluate: {message}") from None
    changed = differences(saved, cfg) + differences(saved, cfg, of=_data)
    if changed:
        raise SystemExit(
            f"posenc.evaluation.evaluate: {changed[0]} is not how {run_dir} was trained: a "
            "trained model is scored with its own pe, model, tokenizer and data settings (a "
            "test-time change of pe goes in eval.pe_variants)"
        )
    return cfg


def _data(config: DictConfig) -> dict[str, Any]:
    """The ``data.*`` settings of :func:`training_identity` (what the model was trained on)."""
    return {k: v for k, v in training_identity(config).items() if k.startswith("data.")}


def evaluation_dir(
    run_dir: Path, overrides: list[str], step: int, cfg: DictConfig, members: Sequence[dict] = ()
) -> Path:
    """``RUN/evals/<overrides>,step=N``: one directory per distinct standalone evaluation
    (overrides that change how it runs, never what it scores, left out:
    :data:`~posenc.config.identity.EVAL_RUN_CONTROL`; cut to fit a file name); for an ensemble
    (``members``, as :func:`load_runs` gives them), ``ensemble=...`` among them
    (:func:`ensemble_item`). When that directory holds an evaluation under other settings than
    ``cfg``'s (the run's config changed since), this one is ``<overrides>,step=N@DIGEST``
    instead, the digest of its settings."""
    scored = [o for o in overrides if o.partition("=")[0].lstrip("+~") not in EVAL_RUN_CONTROL]
    ensemble = [ensemble_item(members)] if len(members) > 1 else []
    items = sorted([*scored, *ensemble, f"step={step}"])
    name = re.sub(r"[^\w.=,+\-{}:\[\]]", "_", ",".join(items))
    settings = {**identity(cfg), **evaluation_identity(cfg)}
    readable = RunDir(run_dir).evals / cut_name(name, "")
    if _made_with(readable, cfg) in (None, True):
        return readable
    return RunDir(run_dir).evals / cut_name(name, "@" + digest(settings))


def ensemble_item(members: Sequence[dict]) -> str:
    """``ensemble=B+C@DIGEST``: the directory names of the runs after the first and the digest
    of where they are and the checkpoints and steps they decode with."""
    others = members[1:]
    where = {
        str(i): f"{Path(m['run']).resolve()}:{m['checkpoint']}:{m['step']}"
        for i, m in enumerate(others)
    }
    return "ensemble=" + "+".join(Path(m["run"]).name for m in others) + "@" + digest(where)


def _made_with(directory: Path, cfg: DictConfig) -> bool | None:
    """Whether the evaluation in ``directory`` was made with ``cfg``'s settings (its
    ``eval_config.yaml``); None when it holds no finished evaluation."""
    if not RunDir(directory).metrics_file.is_file():
        return None
    try:
        made = read_config(RunDir(directory).eval_config)
    except UntrustedFileError:
        return False
    return not (differences(made, cfg) or differences(made, cfg, of=evaluation_identity))


def check_run_dir(run_dir: Path) -> None:
    """SystemExit (one line) unless ``run_dir`` is a posenc run that did not fail and holds no
    symbolic link leading out of it."""
    if not RunDir(run_dir).config.exists():
        raise SystemExit(f"{RunDir(run_dir).config} not found: is {run_dir} a posenc run?")
    try:
        refuse_links_leaving(run_dir)
    except LinkRefused as err:
        raise SystemExit(str(err)) from None
    if RunDir(run_dir).failure_file.exists():
        try:
            failed = _checked(RunDir(run_dir).failure_file, untrusted.check_failure)
        except UntrustedFileError as err:
            raise SystemExit(str(err)) from None
        raise SystemExit(
            f"{run_dir} failed ({failed['error']}: {failed['message']}); fix the cause "
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
    last ``eval.average_last`` step checkpoints, their EMA weights with ``eval.weights=ema``;
    SystemExit (one line) when they are missing or unreadable, or hold no EMA."""
    settings = Settings.of(cfg)
    wanted = settings.eval
    if wanted.average_last == 1:
        existing_checkpoint(run_dir, wanted.checkpoint)
    device = resolve_device(settings.run.device)
    try:
        return load_run_model(
            run_dir, settings, wanted.checkpoint, device, wanted.average_last, use_ema(wanted)
        )
    except CheckpointError as err:
        raise SystemExit(str(err)) from None


def run_configs(run_dirs: list[Path], overrides: list[str]) -> list[DictConfig]:
    """Each run's config with ``overrides`` applied (:func:`compose_run_config`), every run on
    the first's ``device``; SystemExit (one line) for a run given twice or not a run."""
    given = [run_dir.resolve() for run_dir in run_dirs]
    twice = next((d for i, d in enumerate(run_dirs) if given[i] in given[:i]), None)
    if twice is not None:
        raise SystemExit(f"run_dir={twice} is given twice; give each run of an ensemble once")
    for run_dir in run_dirs:
        check_run_dir(run_dir)
    configs = [compose_run_config(run_dir, overrides) for run_dir in run_dirs]
    for cfg in configs[1:]:
        cfg.device = configs[0].device
    return configs


def load_runs(run_dirs: list[Path], configs: list[DictConfig]) -> tuple[tuple, list[dict]]:
    """:func:`load_checked`'s answer for ``run_dirs`` under their ``configs``: with one run, its
    own; with several, an :class:`Ensemble` of their models with the first's tokenizer, step and
    checkpoint. And each run's ``run``, ``pe``, ``checkpoint`` and ``step``. ValueError (one
    line) for runs whose tokenizers differ; SystemExit (one line) for a missing checkpoint."""
    if len(run_dirs) > 1:
        tokenizers = [load_tokenizer(RunDir(run_dir).tokenizer) for run_dir in run_dirs]
        check_same_vocabulary(tokenizers, [str(run_dir) for run_dir in run_dirs])
    loaded = [load_checked(run_dir, cfg) for run_dir, cfg in zip(run_dirs, configs, strict=True)]
    members = [
        {"run": str(run_dir), "pe": cfg.pe.name, "checkpoint": one[3].name, "step": one[2]}
        for run_dir, cfg, one in zip(run_dirs, configs, loaded, strict=True)
    ]
    if len(run_dirs) == 1:
        return loaded[0], members
    tokenizer, _, step, path = loaded[0]
    return (tokenizer, Ensemble([one[1] for one in loaded]).eval(), step, path), members


def _checked(path: Path, check) -> dict[str, Any]:
    """The JSON object in ``path`` once ``check`` has found its keys and types right."""
    return check(untrusted.read_json(path), path)


def evaluate_into(
    cfg: DictConfig, run_dir: Path, out_dir: Path, loaded: tuple, about: dict | None = None
) -> dict:
    """Evaluate into a temporary directory beside ``out_dir`` and rename it to ``out_dir`` when
    complete; on any error or Ctrl-C the temporary directory is removed (an unforeseen error
    leaves ``out_dir/failed.json`` with its traceback, then propagates). Returns the metrics,
    with ``about`` among them."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = temporary_folder(out_dir.parent, f".{out_dir.name[:100]}.")
    try:
        metrics = evaluate(Settings.of(cfg), run_dir, work, loaded, about)
        OmegaConf.save(cfg, RunDir(work).eval_config)
        if out_dir.exists():  # an earlier attempt's failed.json, nothing else
            shutil.rmtree(out_dir)
        work.rename(out_dir)
        return metrics
    except (SystemExit, KeyboardInterrupt, OSError, ValueError, CheckpointError):
        raise
    except Exception as err:
        message = (str(err).splitlines() or [""])[0]
        RunDir(out_dir).record_failure(type(err).__name__, message, traceback.format_exc())
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.evaluation run_dir=PATH [KEY=VALUE ...]``: overrides apply to the run's
    saved config (e.g. ``eval.use_cache=false``, ``eval.splits=[test,long]``); the results go
    to ``RUN/evals/<overrides>,step=N/``. Every error ends it with one line."""
    with one_line_errors("posenc.evaluation", (ValueError, CheckpointError, RunLockedError)):
        _main(list(sys.argv[1:] if argv is None else argv))


def _main(args: list[str]) -> None:
    paths, overrides = COMMAND.read(args)
    run_dirs = paths["run_dir"]
    configs = run_configs(run_dirs, overrides)
    run_dir, cfg = run_dirs[0], configs[0]
    if len(run_dirs) > 1 and cfg.eval.get("pe_variants"):
        raise SystemExit(
            "eval.pe_variants rebuilds one model with other pe settings, not an ensemble: "
            "evaluate the variants of each run alone"
        )
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    loaded, members = load_runs(run_dirs, configs)
    about = None
    if len(members) > 1:
        about = {"pe": "+".join(m["pe"] for m in members), "ensemble": members}
    RunDir(run_dir).evals.mkdir(exist_ok=True)
    with run_lock(RunDir(run_dir).evals, "evaluation"):
        out_dir = evaluation_dir(run_dir, overrides, loaded[2], cfg, members)
        if _made_with(out_dir, cfg):
            log.info("%s holds this evaluation already; delete it to evaluate again", out_dir)
            metrics = _checked(RunDir(out_dir).metrics_file, untrusted.check_metrics)
        else:
            metrics = evaluate_into(cfg, run_dir, out_dir, loaded, about)
            log.info("results in %s", out_dir)
    for split, scores in metrics["splits"].items():  # one line a split; the rest in the file
        bertscore = scores.get("bertscore_f1")
        print(
            f"{split}: BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}"
            + ("" if bertscore is None else f"  BERTScore-F1 {100 * bertscore:.2f}")
            + f"  ({scores.get('sentences', '?')} sentences)"
        )
    print(f"metrics: {out_dir / 'metrics.json'}")
