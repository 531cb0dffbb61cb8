"""Files a reader may open at any moment: written through a temporary file beside the target and
renamed over it (``os.replace``), so a reader sees the old file or the new one, never half of
either; a killed write leaves only a ``.NAME.*.tmp`` file, which nobody reads."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def replacing(path: Path, mode: str = "w") -> Iterator[IO]:
    """An open temporary file beside ``path``; on leaving the block without an error it is
    flushed to disk and renamed over ``path``, on an error it is removed.

    ``mode`` is ``"w"`` (UTF-8 text) or ``"wb"``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with replacing(path) as handle:
        handle.write(text)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=2))


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
