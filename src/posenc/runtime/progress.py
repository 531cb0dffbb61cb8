"""When a progress bar is drawn: asked for, and only on a terminal. Piped into a file or a log,
a bar's carriage-return redraws would be kilobytes of noise; the log lines say the same."""

from __future__ import annotations


def bar_disabled(wanted: bool) -> bool | None:
    """tqdm's ``disable`` for a bar that is ``wanted``: True when not wanted, else None, with
    which tqdm draws only when its stream is a terminal."""
    return None if wanted else True
