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
the new settings. Paths (a vocabulary file's location) are not part of the identity, so a moved
run directory still resumes.

Overrides to paste. Run directories are named by their overrides (``pe=rope,seed=1``), and
Hydra's override parser rejects ``=`` and ``,`` in an unquoted value, so a path is printed
quoted twice: in single quotes for Hydra and the whole override in double quotes for the shell.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        "eval.splits",
    }
)
#: settings no result depends on, left out of reports (where this machine caches tokenizers)
UNREPORTED_KEYS = frozenset({"cache_dir"})
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
        kind: ``int``, ``number`` (int or float), ``bool``, ``str`` or ``pair`` (two numbers).
        low, high: inclusive bounds for numbers (``None`` = unbounded); ``high_open`` excludes
            ``high``.
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
        elif self.kind == "pair":
            text = f"a list of two numbers in [{self.low}, {self.high})"
        else:
            text = "an integer" if self.kind == "int" else "a number"
            if self.low is not None and self.high is not None:
                text += f" in [{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
            elif self.low is not None:
                text += f" >= {_num(self.low)}"
        return text + (" or null" if self.optional else "")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (a plain Python value) fits."""
        if value is None:
            return self.optional
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str) and (not self.choices or value in self.choices)
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


POSITIVE = Setting("int", low=1)
PROBABILITY = Setting("number", low=0, high=1, high_open=True)
FLAG = Setting("bool")

SETTINGS: dict[str, Setting] = {
    "seed": Setting("int", low=0),
    "threads": Setting("int", low=1, optional=True),
    "device": Setting("str"),
    "objective": Setting("str", optional=True, choices=("valid_loss",)),
    "name": Setting("str"),
    "reference_pe": Setting("str"),
    "model.d_model": POSITIVE,
    "model.n_heads": POSITIVE,
    "model.d_ff": POSITIVE,
    "model.encoder_layers": POSITIVE,
    "model.decoder_layers": POSITIVE,
    "model.dropout": PROBABILITY,
    "model.attn_dropout": PROBABILITY,
    "model.activation": Setting("str"),
    "model.norm_first": FLAG,
    "model.share_embeddings": FLAG,
    "model.tie_output": FLAG,
    "model.scale_embedding": FLAG,
    "trainer.max_steps": Setting("int", low=1, optional=True),
    "trainer.max_time": Setting("number", low=0, optional=True),
    "trainer.max_tokens": POSITIVE,
    "trainer.accumulate": POSITIVE,
    "trainer.max_positions": Setting("int", low=1, optional=True),
    "trainer.max_source_tokens": Setting("int", low=1, optional=True),
    "trainer.lr": Setting("number", low=0),
    "trainer.betas": Setting("pair", low=0, high=1),
    "trainer.weight_decay": Setting("number", low=0),
    "trainer.schedule": Setting("str"),
    "trainer.warmup_steps": Setting("int", low=0),
    "trainer.min_lr_ratio": Setting("number", low=0, high=1),
    "trainer.label_smoothing": PROBABILITY,
    "trainer.clip_norm": Setting("number", low=0, optional=True),
    "trainer.valid_every": POSITIVE,
    "trainer.log_every": POSITIVE,
    "trainer.precision": Setting("str", choices=("auto", "fp32", "bf16")),
    "trainer.nan_policy": Setting("str", choices=("stop", "skip")),
    "trainer.resume": Setting("str", optional=True),
    "trainer.init_from": Setting("str", optional=True),
    "trainer.progress": FLAG,
    "eval.enabled": FLAG,
    "eval.checkpoint": Setting("str", choices=("best", "last")),
    "eval.batch_tokens": POSITIVE,
    "eval.max_len_a": Setting("number", low=0),
    "eval.max_len_b": Setting("int", low=0),
    "eval.use_cache": FLAG,
    "eval.max_sentences": Setting("int", low=1, optional=True),
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
        if present and not setting.accepts(value):
            raise ValueError(f"{key}={value!r} must be {setting.describe()}")


# ---------------------------------------------------------------- identity

IDENTITY_GROUPS = ("pe", "model", "tokenizer")
PATH_KEYS = frozenset({"tokenizer.vocab_file"})


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened ``pe.*``, ``model.*`` and ``tokenizer.*`` settings of a plain config."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)
        elif prefix not in PATH_KEYS:
            flat[prefix] = node

    for group in IDENTITY_GROUPS:
        walk(group, config.get(group, {}))
    return flat


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``key=saved (now current)`` for every identity setting that differs, names first."""
    old, new = identity(saved), identity(current)
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
