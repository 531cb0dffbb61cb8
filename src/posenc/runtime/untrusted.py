"""Reading files of a run directory that anyone may have written.

Run directories live on shared filesystems: a file in one may be crafted, truncated or simply of
another program, and a reader must neither hang, nor run out of memory, nor crash with a
traceback, nor let a wrong value through. Every reader here opens regular files only (a FIFO or
device named ``config.yaml`` is refused, not waited on), reads at most ``max_bytes``, decodes
UTF-8, parses, and checks the types of the keys posenc writes (unknown extra keys are fine);
anything wrong raises :class:`UntrustedFileError`, one line naming the file, what is wrong and
the fix.

The checks are tables (:data:`METRICS`, :data:`SUMMARY`, :data:`FAILURE`) of
:class:`~posenc.config.Setting` leaves (the settings' own schema), :class:`Fields`,
:class:`MapOf` and :class:`ListOf` nodes, walked by :func:`check`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posenc.config import Setting
from posenc.config import metrics as metric_table

#: how to repair each file of a run directory, by name
FIXES = {
    "config.yaml": "restore it from the run's owner or train the run again",
    "eval_config.yaml": "restore it from the run's owner or run the evaluation again",
    "metrics.json": "delete it and evaluate the run again",
    "train_summary.json": "delete it and run the run's training command again",
    "failed.json": "delete it and run the run's training command again",
}
DEFAULT_FIX = "restore it from the run's owner or rerun what wrote it"
#: the deepest nesting of mappings and lists a config may have (posenc's go 3 deep)
MAX_YAML_DEPTH = 32
#: the most keys, values and lists a config may have (posenc's have about 200; OmegaConf builds
#: some 5,000 nodes a second)
MAX_YAML_NODES = 5_000
#: top-level config keys posenc never writes and Hydra would act on
HYDRA_KEYS = ("defaults", "hydra")
_PLAIN_KEY = re.compile(r"[\w.=+-]+")


class UntrustedFileError(ValueError):
    """A file of a run directory is missing, unreadable, too large or not what posenc writes.

    ``str(err)`` is one line: ``PATH: PROBLEM; FIX``; the parts are the attributes ``path``,
    ``problem`` and ``fix`` (a caller with a better fix builds its own line from them)."""

    def __init__(self, path: Path, problem: str, fix: str | None = None) -> None:
        self.path, self.problem = Path(path), problem
        self.fix = fix or FIXES.get(self.path.name, DEFAULT_FIX)
        super().__init__(f"{self.path}: {problem}; {self.fix}")

    def __reduce__(self) -> tuple:  # so that it survives pickling (a launcher's subprocess)
        return type(self), (self.path, self.problem, self.fix)


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(parent: str, key: Any) -> str:
    """The dotted key path of ``key`` under ``parent`` (odd keys quoted, so it stays one line)."""
    name = key if isinstance(key, str) and _PLAIN_KEY.fullmatch(key) else _short(key)
    return f"{parent}.{name}" if parent else str(name)


# ---------------------------------------------------------------- bytes, text, JSON


def read_text(path: Path, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``, of at most ``max_bytes`` bytes.

    Raises:
        UntrustedFileError: missing, not a regular file, unreadable, larger, or not UTF-8.
    """
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UntrustedFileError(Path(path), f"it is not UTF-8 text (byte {err.start})") from None


def is_special(path: Path) -> bool:
    """Whether ``path`` exists (links followed) as something other than a regular file or a
    folder: a FIFO, socket or device, which opening could block on or read without end. Asked
    before a library opens a file of a run directory by name (``os.stat`` opens nothing)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def read_bytes(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them.

    Raises:
        UntrustedFileError: missing, not a regular file, unreadable or larger.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block
    except FileNotFoundError:
        raise UntrustedFileError(path, "it is missing") from None
    except OSError as err:
        raise UntrustedFileError(path, f"it cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        raise UntrustedFileError(path, "it is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as err:
            raise UntrustedFileError(path, f"it cannot be read ({err.strerror})") from None
    if len(data) > max_bytes:
        raise UntrustedFileError(path, f"it is larger than {max_bytes:,} bytes")
    return data


def read_json(path: Path, max_bytes: int = 10_000_000) -> Any:
    """The JSON value in ``path`` (of at most ``max_bytes``). ``NaN`` and ``Infinity`` are
    accepted, as posenc writes ``inf`` for a best validation loss never measured; the checks
    (:func:`check`) say where a finite number is needed.

    Raises:
        UntrustedFileError: as :func:`read_text`, or the text is not JSON (or nested too deep).
    """
    text = read_text(path, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        problem = f"it is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        raise UntrustedFileError(path, problem) from None
    except (ValueError, RecursionError) as err:  # e.g. an integer of 5000 digits, [[[[...]]]]
        raise UntrustedFileError(path, f"it is not valid JSON ({type(err).__name__})") from None


# ---------------------------------------------------------------- YAML configs


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line of a YAML error: its problem and line."""
    problem = getattr(err, "problem", None) or (str(err).splitlines() or ["error"])[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def _scan_yaml(path: Path, text: str) -> None:
    """Refuse invalid YAML, a document that is not a mapping, anchors, aliases (an alias bomb
    expands exponentially), nesting deeper than :data:`MAX_YAML_DEPTH` and more than
    :data:`MAX_YAML_NODES` nodes, from the parser's events alone: nothing is built."""
    depth = count = 0
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                line = event.start_mark.line + 1
                raise UntrustedFileError(path, f"it has YAML anchors or aliases (line {line})")
            root = depth == 0 and isinstance(event, yaml.NodeEvent)
            if root and not isinstance(event, yaml.MappingStartEvent):
                raise UntrustedFileError(path, "it is not a YAML mapping")
            depth += isinstance(event, yaml.CollectionStartEvent)
            depth -= isinstance(event, yaml.CollectionEndEvent)
            count += isinstance(event, yaml.NodeEvent)
            if depth > MAX_YAML_DEPTH:
                raise UntrustedFileError(path, f"it nests deeper than {MAX_YAML_DEPTH} levels")
            if count > MAX_YAML_NODES:
                raise UntrustedFileError(path, f"it has over {MAX_YAML_NODES:,} values")
    except yaml.YAMLError as err:
        raise UntrustedFileError(path, f"it is not valid YAML ({_yaml_problem(err)})") from None


def _refuse_interpolations(path: Path, node: Any, where: str = "") -> None:
    """Refuse OmegaConf interpolations (``${...}``: posenc saves configs resolved, and nested
    ones can grow exponentially when resolved) and missing values (``???``), in keys and
    values at any depth."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        here = _where(where, key) if isinstance(node, dict) else f"{where}[{key}]"
        for text in (key, value):
            if isinstance(text, str) and ("${" in text or text == "???"):
                problem = f"{here} is {_short(text)}, an interpolation or missing value"
                raise UntrustedFileError(path, problem + " (posenc saves configs resolved)")
        if isinstance(value, (dict, list)):
            _refuse_interpolations(path, value, here)


def _check_config_keys(path: Path, data: dict) -> None:
    """Refuse Hydra's keys and a missing ``pe`` node or ``pe.name`` string."""
    for key in HYDRA_KEYS:
        if key in data:
            problem = f"it has a top-level {key!r} key, which Hydra would act on"
            raise UntrustedFileError(path, problem)
    check(data, Fields({"pe": Fields({"name": STR})}), path)


def read_config(path: Path, max_bytes: int = 1_000_000) -> DictConfig:
    """A run's saved ``config.yaml`` (or a standalone evaluation's ``eval_config.yaml``): a
    YAML mapping without anchors, aliases, interpolations, missing values (``???``) or Hydra
    keys (``defaults``, ``hydra``), with a ``pe`` mapping whose ``name`` is a string. Nothing is
    expanded or resolved before these checks pass.

    Raises:
        UntrustedFileError: as :func:`read_text`, or the file breaks one of these rules.
    """
    text = read_text(path, max_bytes)
    _scan_yaml(path, text)
    try:
        cfg = OmegaConf.create(text)
    except (yaml.YAMLError, OmegaConfBaseException, ValueError, TypeError) as err:
        problem = _yaml_problem(err) if isinstance(err, yaml.YAMLError) else type(err).__name__
        raise UntrustedFileError(path, f"it is not a posenc config ({problem})") from None
    if not isinstance(cfg, DictConfig):
        raise UntrustedFileError(path, "it is not a YAML mapping")
    data = OmegaConf.to_container(cfg, resolve=False)
    _refuse_interpolations(path, data)
    _check_config_keys(path, data)
    return cfg


# ---------------------------------------------------------------- type checks


@dataclass(frozen=True)
class Fields:
    """A mapping with these ``required`` and ``optional`` keys; the values of other keys are
    checked against ``others``, or not at all when it is None."""

    required: Mapping[str, Schema]
    optional: Mapping[str, Schema] = field(default_factory=dict)
    others: Schema | None = None


@dataclass(frozen=True)
class MapOf:
    """A mapping of string keys to values of ``value``."""

    value: Schema


@dataclass(frozen=True)
class ListOf:
    """A list of ``item`` values."""

    item: Schema


Schema = Setting | Fields | MapOf | ListOf


def nullable(leaf: Setting) -> Setting:
    """``leaf`` or null."""
    return replace(leaf, optional=True)


def one_of(*values: str) -> Setting:
    """One of these strings."""
    return Setting("str", choices=values)


STR = Setting("str")
BOOL = Setting("bool")
INT = Setting("int")
NUMBER = Setting("number", finite=False)  #: inf and NaN too
FINITE = Setting("number")


def within(low: float, high: float) -> Setting:
    """A finite number in ``[low, high]``."""
    return Setting("number", low, high)


PERCENT = within(0.0, 100.0)  #: BLEU of a length bucket
LOSS = Setting("number", low=0.0)  #: a loss in nats: never negative
ANY_MAPPING = MapOf(Setting("any"))


class _Wrong(Exception):
    """What is wrong where, before the file's name is known."""


def _check(value: Any, schema: Schema, where: str) -> None:
    """Raise :class:`_Wrong` at the first value in ``value`` that ``schema`` does not allow."""
    label = where or "the top level"
    if isinstance(schema, Setting):
        if not schema.accepts(value):
            raise _Wrong(f"{label} is {_short(value)}, not {schema.describe()}")
    elif isinstance(schema, ListOf):
        if not isinstance(value, list):
            raise _Wrong(f"{label} is {_short(value)}, not a list")
        for i, item in enumerate(value):
            _check(item, schema.item, f"{where}[{i}]")
    elif not isinstance(value, dict):
        raise _Wrong(f"{label} is {_short(value)}, not a mapping")
    elif isinstance(schema, MapOf):
        for key, item in value.items():
            _check(item, schema.value, _where(where, key))
    else:
        named = {**schema.optional, **schema.required}
        for key in schema.required:
            if key not in value:
                raise _Wrong(f"{_where(where, key)} is missing")
        for key, item in value.items():
            sub = named.get(key, schema.others)
            if sub is not None:
                _check(item, sub, _where(where, key))


def check(data: Any, schema: Schema, path: Path) -> Any:
    """``data`` (read from ``path``) when ``schema`` allows it.

    Raises:
        UntrustedFileError: naming ``path`` and the key path of the first wrong value
            (``metrics.json: splits.test.bleu is 'high', not a number in [0, 100]``).
    """
    try:
        _check(data, schema, "")
    except _Wrong as wrong:
        raise UntrustedFileError(path, str(wrong)) from None
    return data


#: ``train_summary.json`` (``posenc.training.loop.finish``); losses may be inf or NaN
SUMMARY = Fields(
    required={"steps": INT, "train_seconds": NUMBER, "best_valid_loss": NUMBER},
    optional={
        "epochs": NUMBER,
        "train_tokens": INT,
        "train_tokens_per_s": NUMBER,
        "final_valid_loss": nullable(NUMBER),
        "best_valid_bleu": nullable(NUMBER),
        "skipped_batches": INT,
        "stopped_early": BOOL,
        "validations_since_best": INT,
        "parameters": INT,
        "peak_memory_mb": NUMBER,
        "own_memory_mb": NUMBER,
        "device": STR,
        "processes": INT,
        "train_pairs": INT,
        "code": Fields(
            {},
            {
                "commit": nullable(STR),
                "dirty": nullable(BOOL),
                "posenc": nullable(STR),
                "torch": STR,
            },
        ),
        "machine": Fields(
            {},
            {"cpu": STR, "cpu_capability": nullable(STR), "gpu": nullable(STR)},
        ),
    },
)
#: one length bucket of a split's scores (``posenc.evaluation.metrics.length_buckets``)
BUCKET = Fields(
    required={"min": INT, "max": INT, "sentences": INT},
    optional={"bleu": nullable(PERCENT), "loss": nullable(LOSS)},
)


#: one split's scores (``posenc.evaluation.evaluate.evaluate_split``)
def _metric_fields() -> tuple[dict[str, Schema], dict[str, Schema]]:
    """The required and optional fields of a split's scores that the metrics of
    :mod:`posenc.config.metrics` declare: each metric in its range (an optional one nullable),
    a sacreBLEU metric's signature, the other keys each declares."""
    required: dict[str, Schema] = {}
    optional: dict[str, Schema] = {}
    for metric in metric_table.METRICS:
        value = within(metric.low, metric.high)
        if metric.required:
            required[metric.name] = value
        else:
            optional[metric.name] = nullable(value)
        if metric.sacrebleu is not None:
            optional[f"{metric.name}_signature"] = STR
        kinds = {"text": STR, "count": INT, "number": NUMBER, "score": value}
        optional.update({key: nullable(kinds[kind]) for key, kind in metric.keys.items()})
    return required, optional


_REQUIRED_METRICS, _OPTIONAL_METRICS = _metric_fields()
SCORES = Fields(
    required={**_REQUIRED_METRICS, "loss": LOSS, "sentences": INT},
    optional={
        **_OPTIONAL_METRICS,
        "decode_seconds": NUMBER,
        "decode_tokens_per_s": NUMBER,
        "decode_sentences_per_s": NUMBER,
        "use_cache": BOOL,
        "beam_size": INT,
        "lenpen": NUMBER,
        "max_len_a": NUMBER,
        "max_len_b": NUMBER,
        "empty_hypotheses": INT,
        "buckets": ListOf(BUCKET),
    },
)
#: ``metrics.json`` (``posenc.evaluation.evaluate.evaluate``)
METRICS = Fields(
    required={"pe": STR, "step": INT, "splits": MapOf(SCORES)},
    optional={
        "checkpoint": STR,
        "averaged": ListOf(STR),
        "weights": STR,
        "variants": MapOf(Fields({"pe": ANY_MAPPING, "splits": MapOf(SCORES)})),
        "train": SUMMARY,
    },
)
#: ``failed.json`` (``posenc.runtime.rundir.RunDir.record_failure``)
FAILURE = Fields({"error": STR, "message": STR}, {"traceback": STR})


def check_metrics(data: Any, path: Path) -> dict[str, Any]:
    """``metrics.json``'s ``data`` when its types are posenc's (see :data:`METRICS`)."""
    return check(data, METRICS, path)


def check_summary(data: Any, path: Path) -> dict[str, Any]:
    """``train_summary.json``'s ``data`` when its types are posenc's (see :data:`SUMMARY`)."""
    return check(data, SUMMARY, path)


def check_failure(data: Any, path: Path) -> dict[str, Any]:
    """``failed.json``'s ``data`` when its types are posenc's (see :data:`FAILURE`)."""
    return check(data, FAILURE, path)
