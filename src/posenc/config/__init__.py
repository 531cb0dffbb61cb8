"""One run's configuration: what each setting accepts, what identifies a run, and how a
message spells an override for the user to paste.

Checks. Types and ranges of the top-level, ``model``, ``trainer`` and ``eval`` settings are
checked when a run starts, before any data is read: ``trainer.max_steps=abc`` or
``model.d_model=1.5`` stop with one line naming the key, the value and what it must be. Unknown
keys never get this far: Hydra composes configs in struct mode and refuses
``trainer.max_stepz=5`` itself. Keys absent from the config are not checked here (a group
without them fails where they are used), and the encodings check their own ``pe`` settings.

Identity (:mod:`posenc.config.identity`). Resuming continues training *the same model*: a
checkpoint written with other ``pe``, ``model`` or ``tokenizer`` settings would otherwise go on
training and label its results with the new settings. Paths (a vocabulary file's location) are
not part of that identity, so a moved run directory still resumes. A run *directory* holds one
training identity (every setting but budgets, run control and the evaluation's, paths as the
real paths they name) and its evaluation one evaluation identity (the ``eval`` settings): a
result is never returned for settings it was not made with.

Overrides to paste. Run directories are named by their overrides (``pe=rope,seed=1``), and
Hydra's override parser rejects ``=`` and ``,`` in an unquoted value, so a path is printed
quoted twice: in single quotes for Hydra and the whole override in double quotes for the shell.
"""

from __future__ import annotations

import difflib
import math
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Self

from posenc.config.resolved import flatten, plain
from posenc.config.roles import Role, keys_with

#: the Hydra configs, shipped inside the package (``src/posenc/configs``, which the checkout's
#: ``configs/`` links to), so that an installed wheel finds them too
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

#: settings that change how or where a run executes, never what it computes: runs that differ only
#: in these are the same system (the report groups them as seeds of one encoding)
RUN_CONTROL_KEYS = keys_with(Role.RUN_CONTROL)
#: settings no result depends on, left out of reports: where this machine keeps the data, the
#: vocabulary file and the tokenizer cache (the files themselves are named by other settings)
UNREPORTED_KEYS = keys_with(Role.UNREPORTED)
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

    The schema of the settings and of the files a run writes (:mod:`posenc.runtime.untrusted`
    checks those with the same class).

    Attributes:
        kind: ``int``, ``number`` (int or float), ``bool``, ``str``, ``pair`` (two numbers),
            ``list``, ``mapping`` or ``any`` (every value).
        low, high: inclusive bounds for numbers (``None`` = unbounded); ``low_open`` excludes
            ``low`` and ``high_open`` excludes ``high``; for a list, ``low`` is its fewest items.
        optional: whether ``null`` is accepted.
        choices: the accepted strings, for ``str`` settings with a fixed set of values.
        finite: whether a number must be finite (a loss in a run's summary may be inf or NaN).
    """

    kind: str
    low: float | None = None
    high: float | None = None
    high_open: bool = False
    optional: bool = False
    low_open: bool = False
    choices: tuple[str, ...] = ()
    finite: bool = True

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
        elif self.kind == "any":
            text = "anything"
        elif self.kind == "pair":
            text = f"a list of two numbers in [{self.low}, {self.high})"
        else:
            text = "an integer" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                text += f" in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                text += ")" if self.high_open else "]"
            elif self.low is not None:
                text += f" {'>' if self.low_open else '>='} {_num(self.low)}"
        return text + (" or null" if self.optional else "")

    def check(self, key: str, value: Any) -> None:
        """Raise ``ValueError`` (one line: key, value, what it must be) unless ``value`` fits."""
        if not self.accepts(value):
            raise ValueError(f"{key}={value!r} must be {self.describe()}")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a plain Python value) fits."""
        if value is None:
            return self.optional or self.kind == "any"
        if self.kind == "any":
            return True
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
            return not self.finite and self.low is None and self.high is None
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is None:
            return True
        return value < self.high if self.high_open else value <= self.high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


POSITIVE = {"kind": "int", "low": 1}
#: the widest beam (fairseq's widest common setting is 50; a beam of 100,000 took 36 s and
#: 2.1 GB for one four-token line)
MAX_BEAM = 256
#: the most output tokens per source token and in addition (``eval.max_len_a``/``max_len_b``):
#: far beyond any translation, small enough that decoding ends
MAX_LEN_A = 16
MAX_LEN_B = 1024
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
    def settings_names(cls) -> set[str]:
        """The group's keys."""
        return {f.name for f in fields(cls)}

    @classmethod
    def unknown(cls, name: str) -> str:
        """One line for ``name``, no setting of the group: the closest setting, or all of them."""
        known = sorted(cls.settings_names())
        close = difflib.get_close_matches(name, known, n=1)
        hint = (
            f"did you mean {cls.prefix()}{close[0]}?"
            if close
            else (f"the settings are {', '.join(known)}")
        )
        return f"{cls.prefix()}{name} is not among the {cls.GROUP} settings; {hint}"

    @classmethod
    def of(cls, node: Mapping) -> Self:
        """The group as a checked, typed object from its config node (a DictConfig or a dict).

        Raises:
            ValueError: one line naming an unknown key, a missing key or a value that does not
                fit (with what it must be).
        """
        values = plain(node)
        known = cls.settings_names()
        prefix = cls.prefix()
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(cls.unknown(unknown[0]))
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
    # null (absent): d_model^-1/2; a run saved before it existed keeps its identity
    embed_init_std: float | None = setting(
        "number", low=0, low_open=True, optional=True, default=None
    )


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
    batch_pool: int | None = setting("int", low=1, optional=True)
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
    valid_bleu: int | None = setting("int", low=1, optional=True, default=None)
    best_metric: str | None = setting("str", optional=True, choices=("loss", "bleu"), default=None)
    # an EMA of the weights (posenc.training.ema); null = off, so earlier runs keep their identity
    ema_decay: float | None = setting(
        "number", low=0, high=1, low_open=True, high_open=True, optional=True, default=None
    )
    ema_start: int | None = setting("int", low=0, optional=True, default=None)

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
    # bounds: a translation at most MAX_LEN_A source lengths plus MAX_LEN_B tokens long
    max_len_a: float = setting("number", low=0, high=MAX_LEN_A)
    max_len_b: int = setting("int", low=0, high=MAX_LEN_B)
    use_cache: bool = setting("bool")
    max_sentences: int | None = setting("int", low=1, optional=True)
    length_buckets: list[int] = setting("list")
    # typed by their metric's entry (config.metrics: BertScoreSettings, CometSettings)
    bertscore: Any = setting("mapping")
    pe_variants: dict[str, Any] = setting("mapping")
    # with defaults: a run saved before these settings existed decodes greedily from one
    # checkpoint, and standalone evaluation may still set them
    beam_size: int = setting("int", low=1, high=MAX_BEAM, default=1)
    lenpen: float = setting("number", default=1.0)
    average_last: int = setting(**POSITIVE, default=1)
    # sampling instead of greedy decoding; null (off) by default, so that the evaluation identity
    # of every evaluation made before these settings existed stays as it was
    sampling: bool | None = setting("bool", optional=True, default=None)
    top_k: int | None = setting("int", low=1, optional=True, default=None)
    top_p: float | None = setting(
        "number", low=0, high=1, low_open=True, optional=True, default=None
    )
    temperature: float | None = setting("number", low=0, low_open=True, optional=True, default=None)
    seed: int | None = setting("int", low=0, optional=True, default=None)
    # the weights scored: the trained ones (raw; null, so earlier evaluations keep their
    # identity) or their EMA (ema, from a run trained with trainer.ema_decay)
    weights: str | None = setting("str", optional=True, choices=("raw", "ema"), default=None)
    # COMET's model and batch size (a model null: off, as before the setting existed)
    comet: Any = setting("mapping", optional=True, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_decoding(vars(self))
        from posenc.config.metrics import MODEL_METRICS  # the table types the metrics' groups

        for metric in MODEL_METRICS:
            given = getattr(self, metric.settings)  # type: ignore[arg-type]
            if not isinstance(given, ConfigGroup):
                typed = metric.settings_class.of(given or {})  # type: ignore[union-attr]
                object.__setattr__(self, metric.settings, typed)  # type: ignore[arg-type]


#: the ``eval`` settings that only sampling reads
SAMPLING_KEYS = ("top_k", "top_p", "temperature", "seed")


def check_decoding(values: Mapping[str, Any]) -> None:
    """Refuse ``eval`` settings (a plain mapping; absent keys take their defaults) that do not
    go together, in one line: sampling with a beam (``eval.sampling=true`` draws one
    translation per sentence), or a sampling setting without ``eval.sampling=true``."""
    beam = values.get("beam_size", 1)
    if values.get("sampling"):
        if beam != 1:
            raise ValueError(
                f"eval.sampling=true draws one translation per sentence, not a beam: it needs "
                f"eval.beam_size=1 (not {beam})"
            )
        return
    given = [key for key in SAMPLING_KEYS if values.get(key) is not None]
    if given:
        raise ValueError(
            f"eval.{given[0]}={values[given[0]]} is a sampling setting: set eval.sampling=true "
            f"too, or leave eval.{given[0]} null"
        )


@dataclass(frozen=True, kw_only=True)
class LoggerConfig(ConfigGroup):
    """``logger.*`` in ``configs/train.yaml``: where scalars go besides TensorBoard (see
    :mod:`posenc.runtime.sinks`)."""

    GROUP: ClassVar[str] = "logger"
    csv: bool = setting("bool", default=False)
    mlflow: bool = setting("bool", default=False)
    mlflow_uri: str = setting("str", default="mlruns")
    wandb: bool = setting("bool", default=False)
    wandb_mode: str = setting("str", default="offline", choices=("offline", "online"))
    wandb_project: str | None = setting("str", default=None, optional=True)


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


#: the typed config groups; ``data`` and ``tokenizer`` are typed by their kind
#: (:mod:`posenc.config.data`), ``pe`` by its encoding (:mod:`posenc.model.encodings`)
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


def unknown_setting(key: str) -> str | None:
    """One line when the dotted ``key`` of an override (Hydra's ``+``/``~`` prefixes removed)
    names no setting of a typed group (model, trainer, eval, logger), with the closest one; None
    for a known setting or an untyped group (data, pe, tokenizer:
    :func:`posenc.config.options.unknown_key`)."""
    group, _, rest = key.lstrip("+~").partition(".")
    for cls in (ModelConfig, TrainerConfig, EvalConfig, LoggerConfig):
        if group == cls.GROUP and rest and rest.split(".")[0] not in cls.settings_names():
            return cls.unknown(rest.split(".")[0])
    return None


def check_types(cfg: Mapping) -> None:
    """Raise ``ValueError`` (one line) for the first setting of :data:`SETTINGS` in ``cfg`` (a
    plain, resolved dict) whose value does not fit, or for ``eval`` settings that do not go
    together (:func:`check_decoding`)."""
    for key, setting in SETTINGS.items():
        present, value = _lookup(cfg, key)
        if present:
            setting.check(key, value)
    if isinstance(cfg.get("eval"), Mapping):
        check_decoding(cfg["eval"])


# ---------------------------------------------------------------- overrides to paste

_SHELL_SPECIAL = set('"$`\\!')


def paste(key: str, value: str | Path) -> str:
    """``key=value`` as one shell word that Hydra reads back as the string ``value``."""
    text = str(value)
    if "'" not in text and not _SHELL_SPECIAL & set(text):
        return f"\"{key}='{text}'\""
    return shlex.quote(f"{key}={hydra_quoted(text)}")


def hydra_quoted(text: str) -> str:
    """``text`` as a quoted Hydra override value that Hydra reads back as the string itself."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
