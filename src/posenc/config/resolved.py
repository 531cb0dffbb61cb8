"""Config nodes as plain, resolved values: an interpolation that cannot be resolved is one line
naming its key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plain(node: Mapping) -> dict:
    """A config node as a plain, resolved dict.

    Raises:
        ValueError: a value's interpolation cannot be resolved (one line naming its key).
    """
    from omegaconf import OmegaConf

    if OmegaConf.is_config(node):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except Exception as err:  # omegaconf's errors: a grammar, a resolver, a missing key
            raise ValueError(unresolvable(node, err)) from None
    return dict(node)


def unresolvable(node: Any, err: Exception) -> str:
    """One line for the first value of ``node`` (a DictConfig) whose interpolation cannot be
    resolved: its key, its text and why (``err``'s first line where no single value fails)."""
    from omegaconf import OmegaConf

    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    for key, value in flatten(OmegaConf.to_container(node, resolve=False)).items():
        if isinstance(value, str) and "${" in value:
            try:
                OmegaConf.select(node, key, throw_on_missing=True)
            except Exception as failed:
                why = str(failed).splitlines()[0] if str(failed) else type(failed).__name__
                return f"{key}={value} cannot be resolved ({why}); give a plain value"
    return f"the config cannot be resolved ({reason})"


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and empty mappings stay values."""
    if isinstance(node, Mapping) and node:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: node} if prefix else {}
