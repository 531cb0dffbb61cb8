"""The code a run was trained with, recorded in its ``train_summary.json`` (``code``). A
study can so show its runs come from one commit: posenc's git commit and whether the work tree
differed from it (tracked files only), posenc's and torch's versions."""

from __future__ import annotations

import functools
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

#: the checkout posenc runs from (``src/posenc/runtime/version.py`` -> the repository root), or
#: None for an installed copy (whose folder may still lie inside some checkout, a virtual
#: environment's say, whose commit is not the code's)
REPOSITORY: Path | None = Path(__file__).resolve().parents[3]
if not (REPOSITORY / "src" / "posenc" / "runtime" / "version.py").is_file():
    REPOSITORY = None


def _git(*args: str) -> str | None:
    """The output of ``git args`` in :data:`REPOSITORY`, or None without git or a checkout."""
    if REPOSITORY is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(REPOSITORY), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def code_version() -> dict[str, Any]:
    """``{"commit", "dirty", "posenc", "torch"}``: the commit is None (and dirty None) when
    posenc is not run from a git checkout (an installed wheel). Read once per process, when this
    module is first imported, so that a later commit does not relabel code loaded before it."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    try:
        posenc = version("posenc")
    except PackageNotFoundError:
        posenc = None
    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "posenc": posenc,
        "torch": torch.__version__,
    }


def describe(code: dict[str, Any]) -> str:
    """One code version as a report states it: ``commit 1a2b3c4 (dirty), torch 2.13.0``."""
    commit = code.get("commit")
    where = f"commit {str(commit)[:7]}" if commit else "no git commit"
    if code.get("dirty"):
        where += " (dirty)"
    return f"{where}, posenc {code.get('posenc')}, torch {code.get('torch')}"


code_version()  # read once when posenc is loaded: the code a process runs is that moment's
