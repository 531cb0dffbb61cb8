"""Text made portable before it is committed: paths inside or beside the checkouts a result was
made in written relative to them (a data folder beside the checkout that ``POSENC_DATA`` named,
say), and the home directory written ``~``, so that nothing in the repository names a path of one
machine."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def portable(data: bytes, roots: Iterable[Path]) -> bytes:
    """``data`` with ``ROOT/`` removed and the folders beside it (``PARENT/X/``) written
    ``../X/`` for every checkout in ``roots`` (not at a file system's top), then ``HOME/``
    written ``~/``."""
    for root in roots:
        data = data.replace(f"{root}/".encode(), b"")
        if root.parent != Path(root.anchor):
            data = data.replace(f"{root.parent}/".encode(), b"../")
    return data.replace(f"{Path.home()}/".encode(), b"~/")
