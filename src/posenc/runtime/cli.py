"""How posenc's commands (standalone evaluation, translate, the report) end on an error: with one
line on stderr, never a traceback. Ctrl-C exits with status 130, as a shell reports it; any
other failure with status 1. ``POSENC_FULL_ERROR=1`` lets an unforeseen exception through with
its traceback, for a bug report."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: the environment variable that shows the traceback of an unforeseen exception
FULL_ERROR = "POSENC_FULL_ERROR"


@contextmanager
def one_line_errors(
    command: str, known: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
    """Run the block; an exception leaving it ends the process with one line naming
    ``command``: a ``known`` error (one whose message names the problem and the fix) as it is,
    any other as unexpected. ``SystemExit`` (a command's own refusal) passes unchanged."""
    try:
        yield
    except known as err:
        raise SystemExit(f"{command}: {type(err).__name__}: {_first_line(err)}") from None
    except KeyboardInterrupt:
        print(f"{command}: interrupted (Ctrl-C); nothing half-written was kept", file=sys.stderr)
        sys.exit(130)
    except OSError as err:
        where = f" {err.filename}" if err.filename else ""
        raise SystemExit(f"{command}: cannot use{where}: {err.strerror or err}") from None
    except Exception as err:
        if os.environ.get(FULL_ERROR):
            raise
        raise SystemExit(
            f"{command}: {type(err).__name__}: {_first_line(err)} (unexpected; {FULL_ERROR}=1 "
            "shows the traceback)"
        ) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]
