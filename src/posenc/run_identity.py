"""What a checkpoint's weights were trained as: the encoding, the model shape and the tokenizer.

Resuming continues training *the same model*; a checkpoint written with other ``pe``, ``model``
or ``tokenizer`` settings would otherwise go on training and label its results with the new
settings. Paths (a vocabulary file's location) are not part of the identity, so a moved run
directory still resumes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
