"""One run's configuration: what each setting accepts, what identifies a run, and how a
message spells an override for the user to paste.

Checks. Types and ranges of the top-level, ``model``, ``trainer`` and ``eval`` settings are
checked when a run starts, before any data is read: ``trainer.max_steps=abc`` or
``model.d_model=1.5`` stop with one line naming the key, the value and what it must be. Unknown
keys never get this far: Hydra composes configs in struct mode and refuses
``trainer.max_stepz=5`` itself. Keys absent from the config are not checked here (a group
without them fails where they are used), and the encodings check their own ``pe`` settings.

Identity. Resuming continues training *the same model*: a checkpoint written with other ``pe``,
``model`` or ``tokenizer`` settings would otherwise go on training and label its results with
the new settings. Paths (a vocabulary file's location) are not part of that identity, so a moved
run directory still resumes. A run *directory* holds one training identity (every setting but
budgets, run control and the evaluation's, paths as the real paths they name) and its
evaluation one evaluation identity (the ``eval`` settings): a result is never returned for
settings it was not made with.

Overrides to paste. Run directories are named by their overrides (``pe=rope,seed=1``), and
Hydra's override parser rejects ``=`` and ``,`` in an unquoted value, so a path is printed
quoted twice: in single quotes for Hydra and the whole override in double quotes for the shell.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Self

#: the repository's Hydra configs (``configs/``)
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"

#: settings that change how or where a run executes, never what it computes: runs that differ only
#: in these are the same system (the report groups them as seeds of one encoding)
RUN_CONTROL_KEYS = frozenset(
    {
        "seed",
        "name",
        "cache_dir",
        "device",
        "threads",
        "objective",
        "reference_pe",
        "trainer.resume",
        "trainer.progress",
        "trainer.log_every",
        "trainer.compile",
        "trainer.nan_policy",
        "trainer.nan_skip_limit",
        "eval.splits",
        "logger.csv",
        "logger.mlflow",
        "logger.mlflow_uri",
    }
)
#: settings no result depends on, left out of reports: where this machine keeps the data, the
#: vocabulary file and the tokenizer cache (the files themselves are named by other settings)
UNREPORTED_KEYS = frozenset({"cache_dir", "data.dir", "tokenizer.vocab_file", "logger.mlflow_uri"})
#: the training length limits a configuration can set, with the unit each counts in (the report
#: draws them on its length-bucket figure)
LENGTH_LIMITS = {
    "trainer.max_positions": "tokens incl. EOS",
    "trainer.max_source_tokens": "source tokens",
    "data.clean.max_words": "words",
    "data.max_len": "symbols",
}


def reference_encoding(config_dir: Path = CONFIG_DIR) -> str:
    """The encoding that cost ratios are measured against (``reference_pe`` in
    ``configs/train.yaml``); a report reads it from its runs' own configs instead."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(config_dir / "train.yaml").reference_pe)


@dataclass(frozen=True)
class Setting:
    """What one setting accepts.

    Attributes:
        kind: ``int``, ``number`` (int or float), ``bool``, ``str``, ``pair`` (two numbers),
            ``list`` or ``mapping``.
        low, high: inclusive bounds for numbers (``None`` = unbounded); ``high_open`` excludes
            ``high``; for a list, ``low`` is its fewest items.
        optional: whether ``null`` is accepted.
        choices: the accepted strings, for ``str`` settings with a fixed set of values.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    high_open: bool = False
    optional: bool = False
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the setting must be, e.g. ``an integer >= 1 or null``."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "bool":
            text = "true or false"
        elif self.kind == "str":
            text = "a string"
        elif self.kind == "list":
            text = "a list" if self.low is None else f"a list of at least {_num(self.low)} item(s)"
        elif self.kind == "mapping":
            text = "a mapping {key: value}"
        elif self.kind == "pair":
            text = f"a list of two numbers in [{self.low}, {self.high})"
        else:
            text = "an integer" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                text += f" in [{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            elif self.low is not None:
                text += f" >= {_num(self.low)}"
        return text + (" or null" if self.optional else "")

    def check(self, key: str, value: Any) -> None:
        """Raise ``ValueError`` (one line: key, value, what it must be) unless ``value`` fits."""
        if not self.accepts(value):
            raise ValueError(f"{key}={value!r} must be {self.describe()}")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a plain Python value) fits."""
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str) and (not self.choices or value in self.choices)
        if self.kind == "list":
            return isinstance(value, list | tuple) and len(value) >= (self.low or 0)
        if self.kind == "mapping":
            return isinstance(value, Mapping)
        if self.kind == "pair":
            return (
                isinstance(value, list | tuple)
                and len(value) == 2
                and all(Setting("number", self.low, self.high, True).accepts(v) for v in value)
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and value < self.low:
            return False
        if self.high is None:
            return True
        return value < self.high if self.high_open else value <= self.high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


POSITIVE = {"kind": "int", "low": 1}
PROBABILITY = {"kind": "number", "low": 0, "high": 1, "high_open": True}


def setting(kind: str, default: Any = MISSING, **accepts: Any) -> Any:
    """A dataclass field of a config group: what it accepts (a :class:`Setting`) and its default
    (none: the group's YAML must give it)."""
    return field(default=default, metadata={"setting": Setting(kind, **accepts)})


class ConfigGroup:
    """Base of the typed description of one config group: one dataclass field per key of its
    YAML files, each with the :class:`Setting` it accepts."""

    GROUP: ClassVar[str]

    @classmethod
    def prefix(cls) -> str:
        """``"group."``, or nothing for the top-level keys."""
        return f"{cls.GROUP}." if cls.GROUP else ""

    @classmethod
    def settings(cls) -> dict[str, Setting]:
        """``{"group.key": Setting}`` for every key of the group."""
        return {cls.prefix() + f.name: f.metadata["setting"] for f in fields(cls)}

    @classmethod
    def of(cls, node: Mapping) -> Self:
        """The group as a checked, typed object from its config node (a DictConfig or a dict).

        Raises:
            ValueError: one line naming an unknown key, a missing key or a value that does not
                fit (with what it must be).
        """
        values = plain(node)
        known = {f.name for f in fields(cls)}
        prefix = cls.prefix()
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"{prefix}{unknown[0]} is not a {cls.GROUP} setting; the settings are "
                f"{', '.join(sorted(known))}"
            )
        missing = [f.name for f in fields(cls) if f.name not in values and _required(f)]
        if missing:
            raise ValueError(f"{prefix}{missing[0]} is missing; set it in configs/{cls.GROUP}/")
        return cls(**values)

    def __post_init__(self) -> None:
        """Refuse a value that does not fit (one line: key, value, what it must be)."""
        for f in fields(self):
            f.metadata["setting"].check(self.prefix() + f.name, getattr(self, f.name))


def _required(f: Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


@dataclass(frozen=True, kw_only=True)
class ModelConfig(ConfigGroup):
    """``configs/model/*.yaml``: the network's shape and regularisation, shared by every layer.

    Defaults exist only for the switches whose conventional value every model config keeps; the
    shape must come from the YAML."""

    GROUP: ClassVar[str] = "model"
    d_model: int = setting(**POSITIVE)
    n_heads: int = setting(**POSITIVE)
    d_ff: int = setting(**POSITIVE)
    encoder_layers: int = setting(**POSITIVE)
    decoder_layers: int = setting(**POSITIVE)
    dropout: float = setting(**PROBABILITY)
    attn_dropout: float = setting(**PROBABILITY, default=0.0)
    activation: str = setting("str", choices=("relu", "gelu"), default="relu")
    norm_first: bool = setting("bool", default=True)
    share_embeddings: bool = setting("bool", default=True)
    tie_output: bool = setting("bool", default=True)
    scale_embedding: bool = setting("bool", default=True)


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(ConfigGroup):
    """``configs/trainer/*.yaml``: budget, batches, optimizer, schedule, logging and the way a
    run starts (see the YAML's comments for each key)."""

    GROUP: ClassVar[str] = "trainer"
    max_steps: int | None = setting("int", low=1, optional=True)
    max_time: float | None = setting("number", low=0, optional=True)
    max_tokens: int = setting(**POSITIVE)
    accumulate: int = setting(**POSITIVE)
    max_positions: int | None = setting("int", low=1, optional=True)
    max_source_tokens: int | None = setting("int", low=1, optional=True)
    lr: float = setting("number", low=0)
    betas: tuple[float, float] = setting("pair", low=0, high=1)
    weight_decay: float = setting("number", low=0)
    schedule: str = setting("str")
    warmup_steps: int = setting("int", low=0)
    min_lr_ratio: float = setting("number", low=0, high=1)
    label_smoothing: float = setting(**PROBABILITY)
    clip_norm: float | None = setting("number", low=0, optional=True)
    valid_every: int = setting(**POSITIVE)
    log_every: int = setting(**POSITIVE)
    precision: str = setting("str", choices=("auto", "fp32", "bf16"))
    nan_policy: str = setting("str", choices=("stop", "skip"))
    # with a default: a run saved before it existed still composes
    nan_skip_limit: int = setting(**POSITIVE, default=20)
    resume: str | None = setting("str", optional=True)
    init_from: str | None = setting("str", optional=True)
    progress: bool = setting("bool")
    compile: bool = setting("bool", default=False)
    patience: int | None = setting("int", low=1, optional=True, default=None)

    def budget_spent(self, steps: int, seconds: float) -> bool:
        """Whether ``steps`` optimizer steps and ``seconds`` of training spend the budget
        (``max_steps`` or ``max_time``, whichever comes first)."""
        return (self.max_steps is not None and steps >= self.max_steps) or (
            self.max_time is not None and seconds >= self.max_time
        )


@dataclass(frozen=True, kw_only=True)
class EvalConfig(ConfigGroup):
    """``configs/eval/*.yaml``: which splits are decoded and scored, and how."""

    GROUP: ClassVar[str] = "eval"
    enabled: bool = setting("bool")
    splits: list[str] = setting("list", low=1)
    checkpoint: str = setting("str", choices=("best", "last"))
    batch_tokens: int = setting(**POSITIVE)
    max_len_a: float = setting("number", low=0)
    max_len_b: int = setting("int", low=0)
    use_cache: bool = setting("bool")
    max_sentences: int | None = setting("int", low=1, optional=True)
    length_buckets: list[int] = setting("list")
    bertscore: dict[str, Any] = setting("mapping")
    pe_variants: dict[str, Any] = setting("mapping")
    # with defaults: a run saved before these settings existed decodes greedily from one
    # checkpoint, and standalone evaluation may still set them
    beam_size: int = setting(**POSITIVE, default=1)
    lenpen: float = setting("number", default=1.0)
    average_last: int = setting(**POSITIVE, default=1)


@dataclass(frozen=True, kw_only=True)
class LoggerConfig(ConfigGroup):
    """``logger.*`` in ``configs/train.yaml``: where scalars go besides TensorBoard (see
    :mod:`posenc.runtime.sinks`)."""

    GROUP: ClassVar[str] = "logger"
    csv: bool = setting("bool", default=False)
    mlflow: bool = setting("bool", default=False)
    mlflow_uri: str = setting("str", default="mlruns")


@dataclass(frozen=True, kw_only=True)
class RunSettings(ConfigGroup):
    """The top-level keys of ``configs/train.yaml`` (the groups aside)."""

    GROUP: ClassVar[str] = ""
    name: str = setting("str")
    seed: int = setting("int", low=0)
    device: str = setting("str")
    threads: int | None = setting("int", low=1, optional=True)
    objective: str | None = setting("str", optional=True, choices=("valid_loss",))
    reference_pe: str = setting("str")
    cache_dir: str = setting("str")


#: the typed config groups; ``data``, ``tokenizer`` and ``pe`` are checked by the code that
#: reads them (their keys depend on ``data.kind``, ``tokenizer.kind`` and the encoding)
CONFIG_GROUPS: tuple[type[ConfigGroup], ...] = (
    RunSettings,
    ModelConfig,
    TrainerConfig,
    EvalConfig,
    LoggerConfig,
)
SETTINGS: dict[str, Setting] = {
    key: accepted for group in CONFIG_GROUPS for key, accepted in group.settings().items()
}


def plain(node: Mapping) -> dict:
    """A config node as a plain, resolved dict."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node)


def reported_settings(cfg: Mapping) -> dict[str, Any]:
    """The flattened settings a run's results depend on (and its seed): what HParams and
    MLflow show; scalars stay scalars, anything else becomes its string."""
    return {
        key: value if isinstance(value, bool | int | float | str) else str(value)
        for key, value in flatten(plain(cfg)).items()
        if key == "seed" or key not in RUN_CONTROL_KEYS | UNREPORTED_KEYS
    }


def _lookup(cfg: Mapping, dotted: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_types(cfg: Mapping) -> None:
    """Raise ``ValueError`` (one line) for the first setting of :data:`SETTINGS` in ``cfg`` (a
    plain, resolved dict) whose value does not fit."""
    for key, setting in SETTINGS.items():
        present, value = _lookup(cfg, key)
        if present:
            setting.check(key, value)


# ---------------------------------------------------------------- identity

IDENTITY_GROUPS = ("pe", "model", "tokenizer")
PATH_KEYS = frozenset({"tokenizer.vocab_file"})
#: settings that bound how long a run trains, not what it computes: raising one continues the
#: same run in the same directory
BUDGET_KEYS = frozenset({"trainer.max_steps", "trainer.max_time", "trainer.patience"})
#: settings that name a file or directory: part of a run's identity as the real path they name
FILE_SETTINGS = frozenset({"data.dir", "tokenizer.vocab_file", "trainer.init_from"})
#: evaluation settings that change nothing an evaluation reports
EVAL_RUN_CONTROL = frozenset({"eval.enabled", "eval.bertscore.batch_size"})


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and empty mappings stay values."""
    if isinstance(node, Mapping) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node} if prefix else {}


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


# ---------------------------------------------------------------- overrides to paste

_SHELL_SPECIAL = set('"$`\\!')


def paste(key: str, value: str | Path) -> str:
    """``key=value`` as one shell word that Hydra reads back as the string ``value``."""
    text = str(value)
    if "'" not in text and not _SHELL_SPECIAL & set(text):
        return f"\"{key}='{text}'\""
    hydra_value = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return shlex.quote(f"{key}={hydra_value}")
