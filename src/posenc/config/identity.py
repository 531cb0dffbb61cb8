"""Run identity: the settings that make two runs train the same model (their directory's digest,
a checkpoint's check on resume) and two evaluations report the same thing. A setting that is
null or an empty mapping counts as absent, so one added later with such a default changes no
earlier run's identity."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from posenc.config import RUN_CONTROL_KEYS, flatten, plain
from posenc.config.roles import Role, keys_with

IDENTITY_GROUPS = ("pe", "model", "tokenizer")
#: settings of those groups left out of the model's identity (:mod:`posenc.config.roles`)
PATH_KEYS = keys_with(Role.NOT_MODEL)
#: settings that bound how long a run trains, not what it computes: raising one continues the
#: same run in the same directory
BUDGET_KEYS = keys_with(Role.BUDGET)
#: settings that name a file or directory: part of a run's identity as the real path they name
FILE_SETTINGS = keys_with(Role.FILE)
#: evaluation settings that change nothing an evaluation reports
EVAL_RUN_CONTROL = keys_with(Role.EVAL_CONTROL)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened ``pe.*``, ``model.*`` and ``tokenizer.*`` settings of a plain config; one
    that is null or an empty mapping is left out, as if absent (see :func:`training_identity`),
    so a checkpoint from before a setting with such a default still loads."""
    flat = flatten({group: config.get(group, {}) for group in IDENTITY_GROUPS})
    return {key: value for key, value in _present(flat).items() if key not in PATH_KEYS}


def _real_path(value: Any) -> Any:
    return os.path.realpath(os.path.expanduser(value)) if isinstance(value, str) else value


def training_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every flattened setting of a plain config that changes what training computes: all but
    run control (:data:`RUN_CONTROL_KEYS`, the seed excepted), budgets (:data:`BUDGET_KEYS`),
    the evaluation (``eval.*``, see :func:`evaluation_identity`), the loggers and Hydra's own;
    a path as the real path it names. Two runs with the same training identity train the same
    model, so they share a run directory. A setting that is null or an empty mapping is left
    out, as if absent: a setting added later with such a default (off) leaves the identity of
    earlier runs, and their directory names, as they were."""
    skipped = (RUN_CONTROL_KEYS - {"seed"}) | BUDGET_KEYS
    return {
        key: _real_path(value) if key in FILE_SETTINGS else value
        for key, value in _present(flatten(plain(config))).items()
        if key not in skipped and not key.startswith(("eval.", "logger.", "hydra."))
    }


def _present(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without those that are null or an empty mapping (what a setting added
    later defaults to when it is off)."""
    return {
        k: v
        for k, v in settings.items()
        if v is not None and not (isinstance(v, Mapping) and not v)
    }


def evaluation_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened ``eval.*`` settings of a plain config that change what an evaluation
    reports (all but :data:`EVAL_RUN_CONTROL`; null and empty ones left out as in
    :func:`training_identity`)."""
    return {
        key: value
        for key, value in _present(flatten({"eval": plain(config).get("eval", {})})).items()
        if key not in EVAL_RUN_CONTROL
    }


def digest(settings: Mapping[str, Any]) -> str:
    """Eight hex digits that change with any of ``settings`` (a flat mapping)."""
    text = json.dumps(dict(settings), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def differences(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    of: Callable[[Mapping[str, Any]], dict[str, Any]] = identity,
) -> list[str]:
    """``key=saved (now current)`` for every setting of ``of`` (default :func:`identity`) that
    differs, names first."""
    old, new = of(saved), of(current)
    keys = sorted(set(old) | set(new), key=lambda k: (not k.endswith(".name"), k))
    return [
        f"{key}={old.get(key, '<unset>')} (now {new.get(key, '<unset>')})"
        for key in keys
        if old.get(key, "<unset>") != new.get(key, "<unset>")
    ]
