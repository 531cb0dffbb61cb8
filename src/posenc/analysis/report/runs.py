"""A sweep's run directories read and grouped into systems. Each run's config, status, metrics,
training summary and curves are read; one group per encoding and differing setting, one entry per
run and split."""

from __future__ import annotations

import csv
import glob
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from posenc.config import (
    CONFIG_DIR,
    RUN_CONTROL_KEYS,
    UNREPORTED_KEYS,
    flatten,
    reference_encoding,
)
from posenc.config.data import data_config
from posenc.config.identity import BUDGET_KEYS, EVAL_RUN_CONTROL
from posenc.config.variants import (
    encoding_config,
    known_encodings,
    settings_text,
    variant_label,
)
from posenc.data.corpus import DataError
from posenc.runtime.rundir import RunDir
from posenc.runtime.sentence_losses import losses_file
from posenc.runtime.sinks import LEGACY_TIME_PREFIX, TIME_PREFIX
from posenc.runtime.untrusted import (
    INT,
    Fields,
    UntrustedFileError,
    check,
    check_failure,
    check_metrics,
    check_summary,
    is_special,
    read_config,
    read_json,
    read_text,
)

DONE, FAILED, UNFINISHED = "done", "failed", "unfinished"
#: the TensorBoard tags of the learning curves: the validation loss against steps and against
#: training seconds, and the training loss (the objective, label smoothing included) likewise
CURVE_TAGS = {
    "steps": ("valid/loss",),
    "time": (TIME_PREFIX + "valid_loss", LEGACY_TIME_PREFIX + "valid_loss"),
    "train_steps": ("train/loss",),
    "train_time": (TIME_PREFIX + "train_loss", LEGACY_TIME_PREFIX + "train_loss"),
}
"""Each curve's tags, the first a run has is read: runs logged before the seconds curves were
renamed hold them under :data:`LEGACY_TIME_PREFIX`."""
WANTED_TAGS = {tag for tags in CURVE_TAGS.values() for tag in tags}

#: a curve: x values (steps or seconds, increasing) and the losses there
Curve = tuple[np.ndarray, np.ndarray]


class ReportError(ValueError):
    """The sweep cannot be reported (no runs, unknown split, ambiguous reference encoding); the
    message says why, in one line."""


@dataclass
class Run:
    """One run directory: its flattened config, status, metrics, training summary and curves.

    ``results`` is the directory its scores come from: the run itself, or a standalone
    evaluation ``RUN/evals/NAME``. ``label`` is the name of its group (set by :func:`group_runs`).
    """

    name: str
    path: Path
    config: dict[str, Any]
    status: str = UNFINISHED
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    label: str = ""
    results: Path | None = None

    def __post_init__(self) -> None:
        if self.results is None:
            self.results = self.path

    @property
    def pe(self) -> str:
        """The encoding's name (``pe.name``)."""
        return str(self.config.get("pe.name", "?"))

    @property
    def seed(self) -> int:
        """The training seed."""
        return int(self.config.get("seed", 0) or 0)

    @property
    def last_step(self) -> int | None:
        """Steps trained: from the summary, else the last validation step logged so far."""
        if self.train.get("steps") is not None:
            return int(self.train["steps"])
        if "steps" in self.curves:
            return int(self.curves["steps"][0][-1])
        return None


@dataclass
class Group:
    """The runs of one encoding (several seeds); ``variant`` names other differing settings
    (``key=value, ...``, empty when none)."""

    label: str
    pe: str
    variant: str
    runs: list[Run]


@dataclass
class Entry:
    """One run's scores on one split for one system (the run's encoding or a test-time variant
    from ``eval.pe_variants``), with its hypothesis and reference files."""

    system: str
    run: Run
    scores: dict[str, Any]
    hypotheses: Path
    references: Path
    losses: Path | None = None  #: its sentence losses (:mod:`posenc.runtime.sentence_losses`)


# ---------------------------------------------------------------- reading the run directories


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def read_curves(run_dir: Path) -> dict[str, Curve]:
    """The learning curves of :data:`CURVE_TAGS` (``{"steps": (x, y), "time": (x, y),
    "train_steps": ..., "train_time": ...}``, the tags that exist; the last value of a step
    wins) from the run's TensorBoard events ``RUN/tb/``, or from ``RUN/scalars.csv`` when it has
    no events (a run archived as text); ``{}`` when neither can be read."""
    files = RunDir(run_dir)
    if files.tb.is_dir():
        return _curves(_event_points(files.tb))
    if files.scalars.is_file():
        return _curves(_csv_points(files.scalars))
    return {}


#: the points of each tag: ``{tag: {step: value}}``
Points = dict[str, dict[float, float]]


def _curves(points: Points) -> dict[str, Curve]:
    """:data:`CURVE_TAGS`' curves from each tag's points, sorted by step."""
    curves: dict[str, Curve] = {}
    for name, tags in CURVE_TAGS.items():
        tag = next((t for t in tags if points.get(t)), None)
        if tag is not None:
            steps = sorted(points[tag])
            values = [points[tag][s] for s in steps]
            curves[name] = (np.array(steps, dtype=float), np.array(values, dtype=float))
    return curves


def _event_points(tb_dir: Path) -> Points:
    """The points of :data:`CURVE_TAGS` in TensorBoard events; none when they cannot be read."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if any(is_special(path) for path in tb_dir.glob("*tfevents*")):
        return {}  # a FIFO or device would block the reader: the curves come from scalars.csv
    try:
        events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
        events.Reload()
        tags = set(events.Tags().get("scalars", [])) & WANTED_TAGS
        return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in tags}
    except Exception:  # a half-written event file of a running job must not stop the report
        return {}


#: the largest ``scalars.csv`` the report reads
MAX_CSV_BYTES = 200_000_000


def _csv_points(path: Path) -> Points:
    """The points of :data:`CURVE_TAGS` in a ``scalars.csv`` (``tag,step,value,wall_time``);
    rows that are not of that form (a row cut short by a kill) are skipped; none when the file
    cannot be read."""
    try:
        text = read_text(path, MAX_CSV_BYTES)
    except UntrustedFileError:
        return {}
    wanted = WANTED_TAGS
    points: Points = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) != 4 or row[0] not in wanted:
            continue
        try:
            step, value = float(row[1]), float(row[2])
        except ValueError:
            continue
        if np.isfinite(step):
            points.setdefault(row[0], {})[step] = value
    return points


#: the settings the report turns into numbers (``pe.name``, a string, is checked by
#: :func:`read_config`)
REPORTED_SETTINGS = Fields({}, {"seed": INT})


def load_run(path: Path, sweep: Path, evaluation: str | None = None) -> Run:
    """Read one run directory; its status is failed (``failed.json``, or a file that is
    unreadable or not what posenc writes: :mod:`posenc.runtime.untrusted`), done
    (``metrics.json``) or unfinished, and ``message`` says why in one line. Scores come from the
    run's own evaluation, or from its standalone evaluation ``RUN/evals/<evaluation>/`` when one
    is named (a glob pattern may name it: :func:`evaluation_dir`). A failed run carries no
    scores and no training summary."""
    name = str(path.relative_to(sweep)) if path != sweep else path.name
    try:
        config = _settings(RunDir(path).config)
    except UntrustedFileError as err:  # a broken config is a failed run in the table, not a crash
        return Run(name, path, {}, FAILED, str(err))
    run = Run(name, path, config, curves=read_curves(path), results=path)
    try:
        results = run.results = evaluation_dir(path, evaluation) if evaluation else path
        if evaluation:  # the run's settings as the evaluation changed them, none stale left over
            run.config = _evaluation_settings(results) or config
        _read_status(run, evaluation)
    except UntrustedFileError as err:
        run.status, run.message, run.metrics, run.train = FAILED, str(err), {}, {}
    return run


def evaluation_dir(run: Path, name: str) -> Path:
    """``RUN/evals/<name>``. ``name`` may be a glob pattern: a standalone evaluation's folder
    ends in a digest of its run's settings, so ``'eval.pe_variants=*'`` names the same
    evaluation of every seed.

    Raises:
        UntrustedFileError: the pattern matches several folders of ``run``.
    """
    if not glob.has_magic(name):
        return RunDir(run).evals / name
    found = sorted(p for p in RunDir(run).evals.glob(name) if p.is_dir() and not p.is_symlink())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:2])
        raise UntrustedFileError(
            RunDir(run).evals, f"{name!r} matches {len(found)} evaluations ({names})", "name one"
        )
    return found[0] if found else RunDir(run).evals / name


def _settings(config_file: Path) -> dict[str, Any]:
    """The flattened settings of a ``config.yaml`` or ``eval_config.yaml``.

    Raises:
        UntrustedFileError: the file is unreadable, not posenc's, or a setting the report reads
            is of the wrong type.
    """
    settings = flatten(OmegaConf.to_container(read_config(config_file)))
    return check(settings, REPORTED_SETTINGS, config_file)


def _read_json(path: Path, checked: Callable[[Any, Path], dict]) -> dict[str, Any] | None:
    """``path``'s JSON passed through ``checked`` (a ``check_*`` function), None when missing."""
    return checked(read_json(path), path) if path.exists() else None


def _read_status(run: Run, evaluation: str | None) -> None:
    """Set ``run``'s training summary, status, message and metrics from its files.

    Raises:
        UntrustedFileError: one of them is unreadable or not what posenc writes.
    """
    run.train = _read_json(RunDir(run.path).summary_file, check_summary) or {}
    failure = _read_json(RunDir(run.path).failure_file, check_failure)
    if failure is not None:
        run.status, run.message = FAILED, f"{failure['error']}: {failure['message']}"
        return
    metrics = _read_json(RunDir(run.results).metrics_file, check_metrics)
    if metrics is not None:
        run.status, run.metrics = DONE, metrics
        run.train = metrics.get("train") or run.train
    elif run.train:
        run.message = (
            f"trained, no evaluation {evaluation}" if evaluation else "trained, not evaluated"
        )
        checkpoints = RunDir(run.path)
        if not (checkpoints.best.is_file() or checkpoints.last.is_file()):
            run.message += " (no checkpoint to evaluate)"
    elif run.last_step is not None:
        run.message = f"running or interrupted; last validation at step {run.last_step}"
    else:
        run.message = "running or interrupted; nothing logged yet"


def _evaluation_settings(results: Path) -> dict[str, Any]:
    """The flattened settings a standalone evaluation in ``results`` ran under
    (``eval_config.yaml``: the run's config with the evaluation's overrides), so the report
    states the decoding it scored (``eval.beam_size=5``), not the training run's; empty when
    the file is missing (the run's own settings stand).

    Raises:
        UntrustedFileError: the file is there but unreadable or not posenc's.
    """
    config_file = RunDir(results).eval_config
    return _settings(config_file) if config_file.exists() else {}


def reference_of(runs: Sequence[Run], override: str | None = None) -> str:
    """The encoding cost ratios are measured against: ``override`` when given, else the
    ``reference_pe`` the runs' configs share, else (runs older than that key) the repository's
    default, :func:`posenc.config.reference_encoding`.

    Raises:
        ReportError: the runs' configs name different reference encodings.
    """
    if override:
        return override
    named = sorted({str(r.config["reference_pe"]) for r in runs if "reference_pe" in r.config})
    if len(named) > 1:
        raise ReportError(
            f"the runs disagree on reference_pe ({', '.join(named)}); "
            "choose one with --reference NAME"
        )
    return named[0] if named else reference_encoding()


# ---------------------------------------------------------------- grouping


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """Config keys, sorted, whose value is not the same in every run; a null setting counts
    as absent (as in run identity: a setting added later with a null default changes nothing),
    and a ``data.*`` setting a run's config lacks reads as the value it was made with
    (:func:`setting_as_made`)."""
    keys = sorted({k for r in runs for k in r.config})
    return [k for k in keys if len({_value_key(setting_as_made(r, k)) for r in runs}) > 1]


def _shown(value: Any) -> Any:
    """A setting as a group's label shows it: ``?`` where the run has none."""
    return "?" if value is None else value


def setting_as_made(run: Run, key: str) -> Any:
    """``run``'s value of ``key``; a ``data.*`` key its config lacks is the typed data config's
    default for its kind (:mod:`posenc.config.data`: the value of runs made before the key
    existed, e.g. ``data.holdout_drops`` shared sources only), so a newer run that sets that
    value explicitly trained on the same rule and joins the older runs' group."""
    if key in run.config or not key.startswith("data."):
        return run.config.get(key)
    try:
        typed = data_config({"kind": run.config.get("data.kind")})
    except (DataError, TypeError, ValueError):
        return None
    value = getattr(typed, key.removeprefix("data."), None)
    return list(value) if isinstance(value, tuple) else value


def pe_defaults(pe: str, config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """The flattened ``pe.*`` settings of ``configs/pe/PE.yaml`` (empty for a name that is no
    YAML there: a run directory's encoding name is never a path)."""
    if pe not in known_encodings(config_dir):
        return {}
    return flatten({"pe": OmegaConf.to_container(encoding_config(pe, config_dir))})


def _is_variant_key(key: str) -> bool:
    """Whether ``key`` may set a system apart: not run control, not where a machine keeps its
    files, not an evaluation setting that changes no score (``eval.comet.batch_size``)."""
    return key not in RUN_CONTROL_KEYS | UNREPORTED_KEYS | EVAL_RUN_CONTROL and not key.startswith(
        ("pe.", "eval.pe_variants")
    )


def budget_bound(run: Run, key: str) -> bool:
    """Whether the budget ``key`` (:data:`BUDGET_KEYS`) may have ended ``run``'s training: False
    only when the run finished training short of it (fewer seconds than ``trainer.max_time``,
    fewer steps than ``trainer.max_steps``, not stopped early under ``trainer.patience``), as its
    training summary says; a run without one counts as bound."""
    limit, train = run.config.get(key), run.train
    if limit is None or train.get("steps") is None:
        return limit is not None
    if key == "trainer.max_time":
        return float(train.get("train_seconds") or 0.0) >= float(limit)
    if key == "trainer.max_steps":
        return int(train["steps"]) >= int(limit)
    return bool(train.get("stopped_early"))


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group runs by encoding; settings other than run control (``RUN_CONTROL_KEYS``: the seed,
    the device, ...) and where a machine keeps its files (``UNREPORTED_KEYS``) that differ
    between the healthy runs (a model size, say) make separate groups, labelled ``pe
    (key=value, ...)``, and so do ``pe.*`` settings that differ between runs of the same
    encoding (an encoder form, say), named where a run leaves the encoding's ``configs/pe``
    default (so the default form is labelled by its name alone). Decoding settings (``eval.*``)
    separate only runs that were scored: a run still without the evaluation the report reads
    (``--eval``) stays in its encoding's group, listed as unfinished. A budget that ended no
    run's training (:func:`budget_bound`: every run stopped short of it) separates nothing: the
    runs trained alike. Sets each run's ``label``; the groups come in the order of their first
    run, each group's runs by seed."""
    healthy = [r for r in runs if r.status != FAILED]
    scored_differences = set(differing_keys([r for r in runs if r.status == DONE]))
    variant_keys = [
        k
        for k in differing_keys(healthy)
        if _is_variant_key(k)
        and (not k.startswith("eval.") or k in scored_differences)
        and (k not in BUDGET_KEYS or any(budget_bound(r, k) for r in healthy))
    ]
    pe_keys = {
        pe: [
            k
            for k in differing_keys([r for r in healthy if r.pe == pe])
            if k.startswith("pe.") and k != "pe.name"
        ]
        for pe in {r.pe for r in runs}
    }
    defaults = {pe: pe_defaults(pe) for pe in pe_keys}
    groups: dict[str, Group] = {}
    for run in runs:
        own = [  # the encoding's settings where this run leaves its YAML's default
            k for k in pe_keys.get(run.pe, []) if run.config.get(k) != defaults[run.pe].get(k)
        ]
        settings = {k: _shown(setting_as_made(run, k)) for k in own + variant_keys}
        variant = settings_text(settings)
        run.label = variant_label(run.pe, settings)
        groups.setdefault(run.label, Group(run.label, run.pe, variant, [])).runs.append(run)
    for group in groups.values():
        group.runs.sort(key=lambda r: (r.seed, r.name))
    return list(groups.values())


def split_names(runs: Sequence[Run], focus: str) -> list[str]:
    """The splits in the metrics of the finished runs, ``focus`` first (empty when no run is
    finished).

    Raises:
        ReportError: runs are finished but none has the ``focus`` split.
    """
    found = list(dict.fromkeys(s for r in runs for s in r.metrics.get("splits", {})))
    if found and focus not in found:
        raise ReportError(f"split {focus!r} is in no metrics.json; found: {', '.join(found)}")
    return sorted(found, key=lambda s: s != focus)


def split_entries(groups: Sequence[Group], split: str) -> dict[str, list[Entry]]:
    """Per system, the finished runs' scores on ``split``: the encoding itself (system = the
    group's label) and each test-time variant (system ``label [variant]``)."""
    systems: dict[str, list[Entry]] = {}
    for group in groups:
        for run in group.runs:
            scores = run.metrics.get("splits", {}).get(split)
            if scores is not None:
                systems.setdefault(group.label, []).append(
                    Entry(
                        group.label,
                        run,
                        scores,
                        RunDir(run.results).hypotheses(split),
                        RunDir(run.results).references(split),
                        losses_file(run.results, split),
                    )
                )
            for name, variant in (run.metrics.get("variants") or {}).items():
                v_scores = variant.get("splits", {}).get(split)
                if v_scores is not None:
                    system = f"{group.label} [{name}]"
                    systems.setdefault(system, []).append(
                        Entry(
                            system,
                            run,
                            v_scores,
                            RunDir(run.results).hypotheses(f"{split}.{name}"),
                            RunDir(run.results).references(split),
                            losses_file(run.results, f"{split}.{name}"),
                        )
                    )
    return systems
