"""One process at a time in a run directory: :func:`run_lock` holds an exclusive lock on
``RUN/.lock`` while a process trains or evaluates there, so two commands never write the same
checkpoints, logs and metrics at once.

The lock is ``flock`` on the file, which the kernel releases when its holder ends in any way
(``kill -9`` included): a lock file left by a killed process is taken over at once, and the log
says so. While held, the file records its holder as JSON (pid, host, purpose, start time,
command line), which a refused process names; on release the record is emptied but the file
stays (removing it would let two processes lock two different files of the same name). The
file may hold anything a previous process or a person left there: it is read as untrusted text
and a symbolic link is refused, never followed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("posenc.runtime.lock")

LOCK_NAME = ".lock"
#: the most bytes of a lock file read back (a record is far shorter)
MAX_RECORD_BYTES = 4096


class RunLockedError(RuntimeError):
    """The run directory's lock cannot be taken: another live process holds it, or the lock
    file is not a plain file; the message (one line) names the holder and what to do."""


@contextmanager
def run_lock(directory: Path, purpose: str) -> Iterator[Path]:
    """Hold the exclusive lock ``directory/.lock`` for the block (``directory`` is created if
    missing); ``purpose`` (e.g. ``training``) is recorded for whoever is refused. Yields the lock
    file's path. Not reentrant: a second ``run_lock`` on the same directory in the same process
    is refused too.

    Raises:
        RunLockedError: another process holds the lock, or ``.lock`` is a symbolic link or not
            a plain file (one line).
    """
    path = Path(directory) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open(path)
    try:
        _acquire(fd, path)
        try:
            left = _describe(_read(fd))
            if left:
                log.info("took over %s, left by %s, which has ended", path, left)
            _write(fd, path, _record(purpose))
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open(path: Path) -> int:
    """The lock file opened for reading and writing (created if missing), never through a
    symbolic link; RunLockedError when it is a link or not a plain file."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RunLockedError(
                f"{path} is a symbolic link, not a lock file; delete it and run again"
            ) from None
        raise RunLockedError(
            f"cannot open the lock file {path} ({err.strerror}); delete it and run again"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunLockedError(f"{path} is not a plain file; delete it and run again")
    return fd


def _acquire(fd: int, path: Path) -> None:
    """Take the exclusive lock at once; RunLockedError naming the holder when it is held."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(_read(fd)) or "another process (its record is not written)"
        raise RunLockedError(
            f"{path.parent} is in use by {holder}; wait for it to end, or stop that process, "
            "then run again"
        ) from None


def _record(purpose: str) -> dict[str, Any]:
    """Who holds the lock: this process, on this host, for ``purpose``, since now."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "purpose": purpose,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(sys.argv),
    }


def _write(fd: int, path: Path, record: dict[str, Any]) -> None:
    """``record`` as the lock file's content; a full disk leaves it unrecorded (the lock holds
    all the same, and a refused process then says it has no record)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError as err:
        log.warning("could not record the holder in %s: %s", path, err.strerror)


def _read(fd: int) -> dict[str, Any]:
    """The record in the lock file (a JSON object), or ``{}`` when it is empty or not one."""
    try:
        record = json.loads(os.pread(fd, MAX_RECORD_BYTES, 0).decode("utf-8", "replace"))
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _describe(record: dict[str, Any]) -> str:
    """``training (pid 123 on host, since TIME)``, from an untrusted record, on one line; empty
    when the record names no pid."""
    if "pid" not in record:
        return ""
    pid, host, purpose, started = (
        _clean(record.get(key, "?")) for key in ("pid", "host", "purpose", "started")
    )
    return f"{purpose} (pid {pid} on {host}, since {started})"


def _clean(value: Any, limit: int = 80) -> str:
    """``value`` as printable text of at most ``limit`` characters (a record may hold anything)."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."
