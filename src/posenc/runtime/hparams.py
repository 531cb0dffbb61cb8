"""TensorBoard's HParams tab for a run and for a sweep.

TensorBoard shows one experiment summary (``_hparams_/experiment``: every hyper-parameter with
its domain, and the metrics) for its whole log directory, the first it finds. A summary written
by one run knows only that run's values, so every setting, the encoding included, shows as "not
differing". Hence:

- each run writes only its own *session* into ``RUN/tb`` (:func:`session_summaries`, through
  :meth:`posenc.runtime.tblog.RunLogger.hparams`): its settings (session start), its status
  (session end) and its final metrics as ``hparam/*`` scalars;
- a sweep's root directory (the one TensorBoard is pointed at, Hydra's ``outputs/sweeps/NAME``)
  holds one experiment summary, in ``SWEEP/hparams-HASH/`` (:func:`write_sweep_experiment`):
  every setting whose value differs between the sessions under the root, with its discrete
  domain (every value seen), and every ``hparam/*`` metric (constant settings are left out:
  the tab would fill its default columns with them; the report lists them). Each job of a
  multirun rewrites it when it finishes (after its own session is written, under a lock, so the
  last job to finish sees every session) and so does ``scripts/report.py``;
- a single run (``outputs/runs/NAME/...``) writes no experiment summary: TensorBoard builds the
  tab from its session (and compares the runs correctly when pointed at several);
- Hydra's ``outputs/sweeps`` itself holds one summary of every sweep in it
  (:func:`write_all_sweeps_experiment`), so TensorBoard pointed there compares them all.

The summary's directory is named by a hash of its content and the previous one is removed: a
TensorBoard that is already running keeps the first summary it read of a run directory, but it
drops runs whose directory is gone and reads new ones, so it follows the sweep as it grows.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import struct_pb2
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from posenc.runtime.files import open_append, temporary_folder
from posenc.runtime.untrusted import is_special

#: the prefix of the metrics' scalar tags (``hparam/valid_loss``, ``hparam/test_bleu``, ...)
METRIC_PREFIX = "hparam/"
#: the directory of a sweep's experiment summary: ``hparams-`` and 12 hex digits of its hash
EXPERIMENT_DIR = re.compile(r"hparams-[0-9a-f]{12}")
LOCK_FILE = ".hparams.lock"
_KINDS = {
    "bool_value": api_pb2.DATA_TYPE_BOOL,
    "number_value": api_pb2.DATA_TYPE_FLOAT64,
    "string_value": api_pb2.DATA_TYPE_STRING,
}

#: settings a sweep's experiment never lists: implied by another (the encoding's class by its name)
IMPLIED = ("pe._target_",)
#: a setting's value as the HParams tab holds it
HParam = bool | int | float | str


@dataclass
class Session:
    """One run's session as TensorBoard reads it: its directory (relative to the sweep root),
    its settings, the ``hparam/*`` tags it logged and when it started."""

    run: str
    hparams: dict[str, struct_pb2.Value]
    metrics: set[str] = field(default_factory=set)
    start: float = 0.0


# ---------------------------------------------------------------- one run


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> summary_pb2.Summary:
    """A summary holding HParams plugin data under ``tag``, as TensorBoard's own writer makes
    it (the data in the metadata, an empty tensor as the value)."""
    value = summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR
    )
    return summary_pb2.Summary(value=[value])


def _value(value: HParam) -> struct_pb2.Value:
    """A setting as a protobuf ``Value`` (booleans as booleans, numbers as numbers)."""
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, int | float):
        return struct_pb2.Value(number_value=float(value))
    return struct_pb2.Value(string_value=str(value))


def session_summaries(
    params: Mapping[str, HParam], start_time: float | None = None
) -> list[summary_pb2.Summary]:
    """A run's session start (its settings ``params``) and end (status: success), the two
    summaries a run writes into its own events; never an experiment summary."""
    start = plugin_data_pb2.SessionStartInfo(
        start_time_secs=time.time() if start_time is None else start_time
    )
    for key, value in params.items():
        start.hparams[key].CopyFrom(_value(value))
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return [
        _summary(
            metadata.SESSION_START_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_start_info=start),
        ),
        _summary(
            metadata.SESSION_END_INFO_TAG,
            plugin_data_pb2.HParamsPluginData(session_end_info=end),
        ),
    ]


# ---------------------------------------------------------------- reading the sessions


def _event_files(root: Path) -> Iterator[Path]:
    """The event files under ``root``, in name order per directory, except those of experiment
    summaries, of hidden directories (temporary ones, Hydra's) and FIFOs or devices."""
    for path in sorted(root.rglob("*tfevents*")):
        if is_special(path):  # a FIFO or device would block the reader
            continue
        parts = path.relative_to(root).parts[:-1]
        summary = path.name.endswith(ALL_SWEEPS_SUFFIX)
        if not summary and not any(p.startswith(".") or EXPERIMENT_DIR.fullmatch(p) for p in parts):
            yield path


def read_sessions(root: Path) -> list[Session]:
    """Every run's session under ``root`` (the first session start of a directory, as
    TensorBoard keeps it), with the ``hparam/*`` tags the directory holds, ordered by run."""
    sessions: dict[str, Session] = {}
    tags: dict[str, set[str]] = {}
    for path in _event_files(root):
        run = str(path.parent.relative_to(root))
        for raw in RawEventFileLoader(str(path)).Load():
            has_session = metadata.SESSION_START_INFO_TAG.encode() in raw
            if not has_session and METRIC_PREFIX.encode() not in raw:
                continue
            for value in event_pb2.Event.FromString(raw).summary.value:
                if value.tag.startswith(METRIC_PREFIX):
                    tags.setdefault(run, set()).add(value.tag)
                elif value.tag == metadata.SESSION_START_INFO_TAG and run not in sessions:
                    content = value.metadata.plugin_data.content
                    info = metadata.parse_session_start_info_plugin_data(content)
                    sessions[run] = Session(run, dict(info.hparams), start=info.start_time_secs)
    for run, session in sessions.items():
        session.metrics = tags.get(run, set())
    return [sessions[run] for run in sorted(sessions)]


# ---------------------------------------------------------------- the sweep's summary


def _python(value: struct_pb2.Value) -> HParam:
    return getattr(value, value.WhichOneof("kind"))


def hparam_info(name: str, values: Sequence[struct_pb2.Value]) -> api_pb2.HParamInfo:
    """A setting's entry in the experiment: its type (the kind all its values share, text when
    they mix), its discrete domain (every distinct value, sorted) and whether they differ."""
    distinct: dict[tuple[str, HParam], struct_pb2.Value] = {}
    for value in values:
        kind = value.WhichOneof("kind")
        if kind in _KINDS:
            distinct.setdefault((kind, _python(value)), value)
    kinds = {kind for kind, _ in distinct}
    info = api_pb2.HParamInfo(
        name=name,
        type=_KINDS[next(iter(kinds))] if len(kinds) == 1 else api_pb2.DATA_TYPE_STRING,
        differs=len(distinct) > 1,
    )
    info.domain_discrete.values.extend(distinct[key] for key in sorted(distinct))
    return info


def experiment(sessions: Sequence[Session], description: str = "") -> api_pb2.Experiment:
    """The experiment of ``sessions``: every setting whose value differs between them
    (:func:`hparam_info`; not :data:`IMPLIED` ones) and every ``hparam/*`` metric, by name;
    created when the last session started. TensorBoard's HParams tab shows five settings by
    default, the differing ones first and then constant ones by name, which told nothing;
    constant settings are in the report's shared setup instead."""
    names = sorted({name for s in sessions for name in s.hparams})
    tags = sorted({tag for s in sessions for tag in s.metrics})
    infos = [
        hparam_info(name, [s.hparams[name] for s in sessions if name in s.hparams])
        for name in names
    ]
    return api_pb2.Experiment(
        description=description,
        time_created_secs=max((s.start for s in sessions), default=0.0),
        hparam_infos=[info for info in infos if info.differs and info.name not in IMPLIED],
        metric_infos=[
            api_pb2.MetricInfo(
                name=api_pb2.MetricName(tag=tag), display_name=tag.removeprefix(METRIC_PREFIX)
            )
            for tag in tags
        ],
    )


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``root/.hparams.lock`` (one writer of the summary at a time)."""
    with open_append(root / LOCK_FILE) as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_event(
    directory: Path, summary: summary_pb2.Summary, wall_time: float, suffix: str = ".sweep"
) -> None:
    """One event file in ``directory`` (its name ending in ``suffix``) holding ``summary`` at
    step 0."""
    writer = EventFileWriter(str(directory), filename_suffix=suffix)
    writer.add_event(event_pb2.Event(wall_time=wall_time, step=0, summary=summary))
    writer.close()


def _experiment_summary(
    sessions: Sequence[Session], where: str
) -> tuple[summary_pb2.Summary, float]:
    """The experiment summary of ``sessions`` (runs under the folder ``where``) and its time."""
    exp = experiment(sessions, f"{len(sessions)} runs under {where}")
    data = plugin_data_pb2.HParamsPluginData(experiment=exp)
    return _summary(metadata.EXPERIMENT_TAG, data), exp.time_created_secs


def _remove_stale(root: Path, keep: Path | None, summaries: bool = True) -> None:
    """Remove what a killed write left in ``root`` and, with ``summaries``, its
    experiment-summary folders but ``keep``."""
    for old in root.iterdir():
        stale = old.name.startswith(".hparams-") and old.name.endswith(".tmp")  # a kill's
        summary = summaries and EXPERIMENT_DIR.fullmatch(old.name)
        if old != keep and old.is_dir() and (stale or summary):
            shutil.rmtree(old, ignore_errors=True)


def write_sweep_experiment(root: Path) -> Path | None:
    """Write the experiment summary of every session under ``root`` into
    ``root/hparams-HASH/`` and remove any earlier one (and what a killed write left); returns
    its directory, or None (removing the old ones) when no run under ``root`` has a session
    yet. Nothing is rewritten when the summary is unchanged."""
    root = Path(root)
    with _locked(root):
        sessions = read_sessions(root)
        kept = None
        if sessions:
            summary, wall_time = _experiment_summary(sessions, root.name)
            digest = hashlib.sha1(summary.SerializeToString()).hexdigest()[:12]
            kept = root / f"hparams-{digest}"
            if not kept.is_dir():
                tmp = temporary_folder(root, ".hparams-", ".tmp")
                try:
                    _write_event(tmp, summary, wall_time)
                    tmp.rename(kept)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        _remove_stale(root, kept)
    return kept


#: the file name ending of the summary of every sweep, in Hydra's ``outputs/sweeps`` itself
ALL_SWEEPS_SUFFIX = ".sweeps"


def sweeps_parent(sweep: Path) -> Path | None:
    """The folder that holds ``sweep`` beside other sweeps when it is Hydra's ``.../sweeps``
    (``hydra.sweep.dir`` is ``outputs/sweeps/NAME``); None for a sweep anywhere else."""
    parent = Path(sweep).resolve().parent
    return parent if parent.name == "sweeps" else None


def write_all_sweeps_experiment(parent: Path) -> Path | None:
    """One experiment summary of every session under ``parent`` (every sweep), written as an
    event file in ``parent`` itself, the previous one replaced; returns it (None, removing the
    old one, when no run has a session).

    TensorBoard shows one experiment summary for a whole log directory: pointed at ``parent``
    it takes this one (the top directory's own run comes first), so the HParams tab lists every
    sweep's settings and metrics; pointed at one sweep it never sees it and takes that sweep's.
    A TensorBoard already running keeps the summary it read first: restart it for new sweeps.
    """
    parent = Path(parent)
    with _locked(parent):
        old = sorted(parent.glob(f"*tfevents*{ALL_SWEEPS_SUFFIX}"))
        sessions = read_sessions(parent)
        written = None
        if sessions:
            summary, wall_time = _experiment_summary(sessions, parent.name)
            tmp = temporary_folder(parent, ".hparams-", ".tmp")
            try:
                _write_event(tmp, summary, wall_time, ALL_SWEEPS_SUFFIX)
                (made,) = tmp.iterdir()  # the one file written into a fresh folder
                written = parent / made.name
                made.rename(written)  # whole, in one step: a reader sees it or the old one
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        for path in old:
            if path != written:
                path.unlink(missing_ok=True)
        _remove_stale(parent, None, summaries=False)  # its sweeps' own are theirs
    return written


def hydra_sweep_root(run_path: Path) -> Path | None:
    """The sweep directory of the current Hydra multirun job when ``run_path`` lies inside
    it; None for a single run, outside Hydra, or when the run is elsewhere."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from hydra.utils import to_absolute_path

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    root = Path(to_absolute_path(hydra_cfg.sweep.dir)).resolve()
    return root if root in Path(run_path).resolve().parents else None
