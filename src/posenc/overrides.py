"""Command-line overrides that a message asks the user to paste.

Run directories are named by their overrides (``pe=rope,seed=1``), and Hydra's override parser
rejects ``=`` and ``,`` in an unquoted value, so a path is printed quoted twice: in single quotes
for Hydra and the whole override in double quotes for the shell.
"""

from __future__ import annotations

import shlex
from pathlib import Path

_SHELL_SPECIAL = set('"$`\\!')


def paste(key: str, value: str | Path) -> str:
    """``key=value`` as one shell word that Hydra reads back as the string ``value``."""
    text = str(value)
    if "'" not in text and not _SHELL_SPECIAL & set(text):
        return f"\"{key}='{text}'\""
    hydra_value = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return shlex.quote(f"{key}={hydra_value}")
