"""Text made portable before it is committed: paths inside the checkouts a result was made in
written relative to them, and the home directory written ``~``, so that nothing in the
repository names a path of one machine."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def portable(data: bytes, roots: Iterable[Path]) -> bytes:
    """``data`` with ``ROOT/`` removed for every checkout in ``roots`` and ``HOME/`` written
    ``~/``."""
    for root in roots:
        data = data.replace(f"{root}/".encode(), b"")
    return data.replace(f"{Path.home()}/".encode(), b"~/")
