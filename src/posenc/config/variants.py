"""Encodings with options, read from a sweep's overrides and named as the report names them.

``pe=alibi pe.dape=true`` is ``alibi (pe.dape=True)`` to the report and to the benchmark, so a
benchmark's measurement of a variant finds the report's rows of it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from posenc.config import CONFIG_DIR


def known_encodings(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The names of every ``configs/pe/*.yaml``, sorted."""
    return sorted(path.stem for path in (config_dir / "pe").glob("*.yaml"))


def settings_text(settings: Mapping[str, Any]) -> str:
    """``key=value, ...`` of ``settings`` in their order (empty for none)."""
    return ", ".join(f"{key}={value}" for key, value in settings.items())


def variant_label(pe: str, settings: Mapping[str, Any]) -> str:
    """How the report and the benchmark name encoding ``pe`` run with ``settings`` (``{key:
    value}``, in their order) that set it apart: ``pe (key=value, ...)``, or ``pe`` alone."""
    return f"{pe} ({settings_text(settings)})" if settings else pe


def split_labels(text: str) -> list[str]:
    """Comma-separated labels as :func:`variant_label` writes them, a comma inside a label's
    parentheses kept: ``"rope,nonepe (a=1, b=2)"`` -> ``["rope", "nonepe (a=1, b=2)"]``;
    empty items are dropped."""
    labels, current, depth = [], [], 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            labels.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    labels.append("".join(current).strip())
    return [label for label in labels if label]


def parse_variant(text: str, config_dir: Path = CONFIG_DIR) -> tuple[str, dict[str, Any]]:
    """An encoding and its options from a sweep's overrides, read as Hydra reads them:
    ``"pe=alibi pe.dape=true"`` (or ``"alibi pe.dape=true"``) -> ``("alibi", {"pe.dape":
    True})``, keys sorted (the report's order).

    Raises:
        ValueError: no such encoding, an item that is not ``pe.KEY=VALUE``, or a key that
            ``configs/pe/PE.yaml`` does not have.
    """
    items = text.split()
    if items and "=" not in items[0]:
        items[0] = f"pe={items[0]}"
    try:
        overrides = OverridesParser.create().parse_overrides(items)
    except HydraException as err:
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"variant {text!r}: {first_line} (Hydra's override syntax)") from None
    if not overrides or overrides[0].key_or_group != "pe":
        raise ValueError(f"variant {text!r}: begin with the encoding, e.g. 'alibi pe.dape=true'")
    pe = overrides[0].value()
    known = known_encodings(config_dir)
    if pe not in known:
        raise ValueError(f"variant {text!r}: unknown encoding {pe!r}; configs/pe has {known}")
    defaults = encoding_config(pe, config_dir)
    options = {}
    for override in overrides[1:]:
        key = override.key_or_group
        if not key.startswith("pe.") or key == "pe.name" or override.is_sweep_override():
            raise ValueError(f"variant {text!r}: {override.input_line!r} is not pe.KEY=VALUE")
        if key.removeprefix("pe.") not in defaults:
            raise ValueError(
                f"variant {text!r}: neither configs/pe/{pe}.yaml nor the settings every encoding "
                f"accepts (configs/train.yaml's pe) have {key}"
            )
        options[key] = override.value()
    return pe, dict(sorted(options.items()))


def encoding_config(pe: str, config_dir: Path = CONFIG_DIR) -> DictConfig:
    """``configs/pe/PE.yaml`` over the settings every encoding accepts (``configs/train.yaml``'s
    ``pe``), as a run composes them."""
    shared = OmegaConf.load(config_dir / "train.yaml").get("pe") or {}
    return OmegaConf.merge(shared, OmegaConf.load(config_dir / "pe" / f"{pe}.yaml"))
