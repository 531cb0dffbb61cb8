"""Positional encodings. Each module holds one family; :func:`encoding_factory` builds one
from its ``configs/pe/*.yaml`` node (``_target_`` names the class, other keys are its
hyper-parameters)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from hydra.utils import get_class

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site, StackEncoding

__all__ = ["AttentionCall", "AttentionRule", "Site", "StackEncoding", "encoding_factory"]


def encoding_factory(pe_cfg: Mapping[str, Any]) -> Callable[..., StackEncoding]:
    """A callable ``(site, d_model, n_heads, n_layers) -> StackEncoding`` for a ``pe`` config."""
    params = dict(pe_cfg)
    name = params.pop("name", "?")
    target = params.pop("_target_", None)
    if target is None:
        raise ValueError(f"pe={name}: its config has no _target_ naming the encoding class")
    cls = get_class(target)
    if not (isinstance(cls, type) and issubclass(cls, StackEncoding)):
        raise ValueError(f"pe={name}: {target} is not a posenc StackEncoding")
    return functools.partial(cls, **params)
