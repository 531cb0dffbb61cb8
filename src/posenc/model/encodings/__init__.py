"""Positional encodings. Each module holds one family; :func:`encoding_factory` builds one
from its ``configs/pe/*.yaml`` node (``_target_`` names the class, other keys are its
hyper-parameters).

A ``_target_`` is looked up in posenc's catalogue of encoding classes (every module of this
package, imported here, and any :class:`StackEncoding` subclass a program defines itself), never
imported from the dotted path it spells: a run directory's ``config.yaml`` is read from disks
that others may write, and importing what it names would run their code."""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from posenc.model.encodings.base import (
    CATALOGUE,
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
)
from posenc.model.positions import PositionAugmentation
from posenc.model.sinks import Sinks
from posenc.model.temperature import Temperature

__all__ = [
    "SHARED_SETTINGS",
    "AttentionCall",
    "AttentionRule",
    "Site",
    "StackEncoding",
    "encoding_class",
    "encoding_factory",
]

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


#: the ``pe.*`` settings every encoding accepts (defaults in ``configs/train.yaml``), handled here
#: rather than by the encoding classes
SHARED_SETTINGS = (
    "off_layers",
    "augment",
    "augment_range",
    "temperature",
    "temperature_layers",
    "temperature_scale",
    "temperature_floor_scale",
    "sinks",
)


def encoding_class(target: str, name: str = "?") -> type[StackEncoding]:
    """The encoding class ``target`` (``"module.Class"``) names in the catalogue.

    Raises:
        ValueError: ``target`` is no encoding class of the catalogue (one line; nothing is
            imported).
    """
    cls = CATALOGUE.get(str(target))
    if cls is None:
        raise ValueError(
            f"pe={name}: _target_ {target!r} is not one of posenc's encodings "
            f"({__name__}.MODULE.CLASS); a pe config names a class that configs/pe/ uses"
        )
    return cls


def encoding_factory(pe_cfg: Mapping[str, Any]) -> Callable[..., StackEncoding]:
    """A callable ``(site, d_model, n_heads, n_layers) -> StackEncoding`` for a ``pe`` config.

    The settings every encoding accepts (:data:`SHARED_SETTINGS`) are taken out of the class's
    arguments: ``off_layers`` (layers whose attention is plain, :meth:`StackEncoding.switch_off`),
    ``augment``/``augment_range`` (training positions, :mod:`posenc.model.positions`) and
    ``temperature*`` (the queries' temperature, :mod:`posenc.model.temperature`) and ``sinks``
    (learned attention sinks, :mod:`posenc.model.sinks`); null or absent: off.
    """
    params = dict(pe_cfg)
    name = params.pop("name", "?")
    target = params.pop("_target_", None)
    shared = {key: params.pop(key, None) for key in SHARED_SETTINGS}
    if target is None:
        raise ValueError(f"pe={name}: its config has no _target_ naming the encoding class")
    base = params.get("base")
    if base is not None and not (
        isinstance(base, int | float) and not isinstance(base, bool) and 1 < base < math.inf
    ):
        raise ValueError(
            f"pe.base={base} must be a finite number above 1 (the wavelengths' base: 10000 in "
            "the papers; at 1 or below every frequency is the same or grows)"
        )
    build = functools.partial(encoding_class(target, name), **params)
    off_layers = shared["off_layers"]
    augmentation = PositionAugmentation.of(shared["augment"], shared["augment_range"])
    temperature = Temperature.of(
        *(shared[f"temperature{suffix}"] for suffix in ("", "_layers", "_scale", "_floor_scale"))
    )
    sinks = Sinks.of(shared["sinks"], name)
    if off_layers is None and augmentation is None and temperature is None and sinks is None:
        return build
    return functools.partial(
        _with_shared_settings, build, off_layers, augmentation, temperature, sinks, name
    )


def _with_shared_settings(
    build: Callable[..., StackEncoding],
    off_layers: list[int] | None,
    augmentation: PositionAugmentation | None,
    temperature: Temperature | None,
    sinks: Sinks | None,
    name: str,
    *args: Any,
    **kwargs: Any,
) -> StackEncoding:
    """``build(*args, **kwargs)`` with plain attention on ``off_layers``, training positions
    drawn by ``augmentation`` and the queries' ``temperature``."""
    encoding = build(*args, **kwargs)
    if off_layers is not None:
        encoding.switch_off(list(off_layers), name)
    encoding.augment(augmentation, name)
    encoding.temper(temperature)
    encoding.add_sinks(sinks)
    return encoding
