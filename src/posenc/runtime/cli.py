"""How posenc's commands (standalone evaluation, translate, the report) end on an error: with one
line on stderr, never a traceback. Ctrl-C exits with status 130 and SIGTERM (``timeout``, a
scheduler) with 143, as a shell reports them, each after the command's own cleanup ran; any
other failure with status 1. ``POSENC_FULL_ERROR=1`` lets an unforeseen exception through with
its traceback, for a bug report."""

from __future__ import annotations

import difflib
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from posenc.config import CONFIG_DIR, Setting, flatten
from posenc.runtime.rundir import RunDir

#: the environment variable that shows the traceback of an unforeseen exception
FULL_ERROR = "POSENC_FULL_ERROR"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: raised where the process is, like Ctrl-C, so its cleanup runs."""


def raise_terminated(signum: int, frame: Any) -> None:
    """A SIGTERM handler: raise :class:`Terminated` where the process is."""
    raise Terminated


@contextmanager
def one_line_errors(
    command: str, known: tuple[type[Exception], ...] = (ValueError,)
) -> Iterator[None]:
    """Run the block; an exception leaving it ends the process with one line naming
    ``command``: a ``known`` error (one whose message names the problem and the fix) as it is,
    any other as unexpected. ``SystemExit`` (a command's own refusal) passes unchanged. In the
    main thread SIGTERM raises :class:`Terminated` for the block (Python's default would end
    the process without running any ``finally``, leaving half-written folders behind)."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if main else None
    try:
        yield
    except known as err:
        raise SystemExit(f"{command}: {type(err).__name__}: {_first_line(err)}") from None
    except Terminated:
        print(f"{command}: stopped (SIGTERM); nothing half-written was kept", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
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
    finally:
        if main:  # None: a handler not set from Python, which Python cannot put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0]


@dataclass(frozen=True)
class Command:
    """A ``KEY=VALUE`` command line over a trained run: its name (``posenc.evaluation``), its
    own arguments (``run_dir``, ...: name -> what it is), which of them are required, what it
    does and an example; every other ``KEY=VALUE`` overrides the run's saved config. Its own
    arguments are paths, but those in ``values`` (name -> the :class:`Setting` it accepts,
    ``nbest``), which are read as YAML scalars and checked. A path in ``repeatable`` may be given
    more than once (``run_dir=A run_dir=B``, an ensemble): it is read as the list of them, in
    order (a comma may be part of a path, so they are never one comma-separated value)."""

    name: str
    own: dict[str, str]
    required: tuple[str, ...]
    summary: str
    example: str
    values: dict[str, Setting] = field(default_factory=dict)
    repeatable: tuple[str, ...] = ()
    ignores: tuple[str, ...] = ()
    """settings (or their prefixes, ``eval.bertscore``) the command has no use for: not listed"""

    @property
    def usage(self) -> str:
        parts = []
        for k in self.own:
            kind = "PATH" if k not in self.values else "N" if self.values[k].kind == "int" else "X"
            parts.append(f"{k}={kind}" if k in self.required else f"[{k}={kind}]")
            if k in self.repeatable:
                parts.append(f"[{k}={kind} ...]")
        return f"usage: python -m {self.name} {' '.join(parts)} [KEY=VALUE ...]"

    def help(self, run_config: dict[str, Any] | None = None) -> str:
        """The text ``--help`` prints: usage, what it does, its own arguments, every setting of
        the run's config it may override (those it :attr:`ignores` left out) with what it does
        and its value: the run's (``run_config``, flattened) when given, else configs/'s
        default; and an example."""
        lines = [self.usage, "", *textwrap.wrap(self.summary, 96), "", "Arguments:"]
        for k, what in self.own.items():
            lines += textwrap.wrap(
                what, 96, initial_indent=f"  {k}=  ", subsequent_indent=" " * (len(k) + 5)
            )
        whose = "this run's values" if run_config else "configs/'s defaults; run_dir= shows a run's"
        lines += ["", f"Overrides of the run's saved config ({whose}):"]
        described = setting_descriptions()
        for key, default in overridable_defaults().items():
            if any(key == i or key.startswith(i + ".") for i in self.ignores):
                continue
            value = run_config.get(key, default) if run_config else default
            lines.append(f"  {key}={as_override(value)}")
            if key in described:
                lines += textwrap.wrap(
                    described[key], 96, initial_indent=" " * 6, subsequent_indent=" " * 6
                )
        lines += ["", "Example:", f"  {self.example}"]
        return "\n".join(lines)

    def read(self, args: list[str]) -> tuple[dict[str, Any], list[str]]:
        """The command's own arguments (paths, or the values of :attr:`values`) and the config
        overrides in ``args``.

        Raises:
            SystemExit: status 0 after printing the help for ``-h``/``--help``; otherwise one
                line: an argument that is not ``KEY=VALUE``, an unknown key (with the closest
                known one), an argument given twice (but a :attr:`repeatable` one) or empty, a
                required one missing, a value its :class:`Setting` refuses.
        """
        if any(arg in ("-h", "--help") for arg in args):
            print(self.help(_saved_config(args)))
            raise SystemExit(0)
        known = [*self.own, *top_level_settings()]
        paths: dict[str, Path] = {}
        overrides = []
        for arg in args:
            key, equals, value = arg.partition("=")
            bare = key.lstrip("+~")
            if not equals and not key.startswith("~"):
                raise SystemExit(f"{self.name}: {arg!r} is not KEY=VALUE; {self.usage}")
            if bare in self.values:
                paths[bare] = self._value(bare, value, paths)
            elif bare in self.repeatable:
                if not value:
                    raise SystemExit(f"{self.name}: {bare}= must be given with a path")
                paths.setdefault(bare, []).append(Path(value).expanduser())
            elif bare in self.own:
                if bare in paths or not value:
                    raise SystemExit(f"{self.name}: {bare}= must be given once, with a path")
                paths[bare] = Path(value).expanduser()
            elif bare.split(".")[0] not in known:
                close = difflib.get_close_matches(bare.split(".")[0], known, n=1)
                hint = f"did you mean {close[0]}=?" if close else "see --help"
                raise SystemExit(f"{self.name}: unknown argument {bare}=; {hint}")
            else:
                overrides.append(arg)
        missing = [k for k in self.required if k not in paths]
        if missing:
            raise SystemExit(f"{self.name}: {missing[0]}= is required; {self.usage}")
        return paths, overrides

    def _value(self, key: str, text: str, given: dict[str, Any]) -> Any:
        """``key=text`` read as a YAML scalar; SystemExit (one line) when it is given twice or
        its :class:`Setting` refuses it."""
        if key in given:
            raise SystemExit(f"{self.name}: {key}= must be given once")
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            value = text
        accepts = self.values[key]
        if not accepts.accepts(value):
            raise SystemExit(f"{self.name}: {key}={text} must be {accepts.describe()}")
        return value


def as_override(value: Any) -> str:
    """``value`` as it is written on a Hydra command line (``true``, ``null``, ``[a,b]``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(as_override(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{as_override(v)}" for k, v in value.items()) + "}"
    return str(value)


def top_level_settings() -> list[str]:
    """The first component of every setting a run's config has: ``configs/train.yaml``'s own
    keys and its config groups (``data``, ``eval``, ...)."""
    train = OmegaConf.load(CONFIG_DIR / "train.yaml")
    groups = [
        next(iter(entry)).split(" ")[-1] for entry in train.defaults if not isinstance(entry, str)
    ]
    return [k for k in train if k not in ("defaults", "hydra")] + groups


def overridable_defaults() -> dict[str, Any]:
    """The settings a command over a trained run is meant to change, with their defaults: the
    ``eval`` group's (``configs/eval/default.yaml``), ``device`` and ``threads``."""
    train = OmegaConf.load(CONFIG_DIR / "train.yaml")
    evaluation = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "eval" / "default.yaml"))
    flat = {f"eval.{k}": v for k, v in flatten(evaluation).items()}
    return {**flat, "device": train.device, "threads": train.threads}


def _saved_config(args: list[str]) -> dict[str, Any] | None:
    """The flattened ``config.yaml`` of the first ``run_dir=`` in ``args``, when it reads (an
    untrusted file: any fault gives None, and the help shows configs/'s defaults)."""
    run_dir = next((a.partition("=")[2] for a in args if a.startswith("run_dir=")), None)
    if not run_dir:
        return None
    try:
        saved = yaml.safe_load(RunDir(Path(run_dir).expanduser()).config.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    return flatten(saved) if isinstance(saved, dict) else None


def setting_descriptions() -> dict[str, str]:
    """``{"eval.KEY": what it does}`` from the comments of ``configs/eval/default.yaml`` (the
    text after ``#`` on a key's line and the indented comment lines below it)."""
    described: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    last = None
    for line in (CONFIG_DIR / "eval" / "default.yaml").read_text().splitlines():
        body, _, comment = line.partition("#")
        if not body.strip():
            if last and comment.strip():
                described[last] += " " + comment.strip()
            continue
        indent = len(body) - len(body.lstrip())
        key = body.strip().partition(":")[0]
        parents = [(i, k) for i, k in parents if i < indent]
        last = ".".join(["eval", *(k for _, k in parents), key])
        parents.append((indent, key))
        described[last] = comment.strip()
    return {k: v for k, v in described.items() if v}
