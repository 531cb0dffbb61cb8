"""Text made portable before it is committed: paths inside the checkouts a result was made in
written relative to them, the shared folder beside a checkout (where the data lives, e.g.
``POSENC_DATA`` set to it) written ``../shared``, and the home directory written ``~``, so
that nothing in the repository names a path of one machine."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def portable(data: bytes, roots: Iterable[Path]) -> bytes:
    """``data`` with ``ROOT/`` removed and ``ROOT/../shared/`` (spelled either way) written
    ``../shared/`` for every checkout in ``roots``, and ``HOME/`` written ``~/``."""
    for root in roots:
        data = data.replace(f"{root}/".encode(), b"")
        data = data.replace(f"{root.parent / 'shared'}/".encode(), b"../shared/")
    return data.replace(f"{Path.home()}/".encode(), b"~/")
