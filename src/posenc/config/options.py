"""The names a command line gives: an option of a config group (``experiment=smoke``) and a key
of a group without a typed schema (``pe.base``), each checked against the YAMLs of ``configs/``
before Hydra composes anything, with the closest name when there is no such one."""

from __future__ import annotations

import difflib

from posenc.config import CONFIG_DIR, hydra_quoted
from posenc.config.identity import FILE_SETTINGS

#: settings that name a path, whose values may hold what Hydra's grammar reads otherwise (a run
#: directory's name has ``=`` and ``,``)
PATH_SETTINGS = FILE_SETTINGS | {"trainer.resume"}
#: characters of a path that Hydra would not read as part of a plain value
HYDRA_SPECIAL = set("=,[]{}()'\" \\:$")

#: config groups whose option a command line names (``GROUP=OPTION``), each a folder of YAMLs
OPTION_GROUPS = ("experiment", "pe", "model", "data", "tokenizer", "trainer", "eval", "bench")
#: groups without a typed schema: their keys are those of any of their YAMLs
UNTYPED_GROUPS = ("pe", "data", "tokenizer")


def group_options(group: str) -> list[str]:
    """The options of config group ``group``: its YAMLs' names, sorted."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def unknown_option(key: str, value: str) -> str | None:
    """One line when ``GROUP=VALUE`` of an override names no option of the group (each of a
    sweep's comma-separated values is checked), with the closest option; None otherwise (a
    known option, ``null``, a sweep function such as ``choice(...)``, or no group)."""
    group = key.lstrip("+~")
    if group not in OPTION_GROUPS or "(" in value or value in ("null", ""):
        return None
    options = group_options(group)
    for choice in (v.strip() for v in value.split(",")):
        if choice not in options:
            close = difflib.get_close_matches(choice, options, n=1)
            hint = f"did you mean {group}={close[0]}?" if close else "the options are listed"
            return (
                f"{group}={choice} is no option of {group}; {hint} ({group} options: "
                f"{', '.join(options)})"
            )
    return None


def untyped_keys(group: str) -> set[str]:
    """Every top-level key of the YAMLs of ``group`` (an untyped group) and of its section of
    ``train.yaml`` (the settings every option accepts)."""
    import yaml

    nodes = [
        yaml.safe_load((CONFIG_DIR / group / f"{o}.yaml").read_text()) for o in group_options(group)
    ]
    nodes.append(yaml.safe_load((CONFIG_DIR / "train.yaml").read_text()).get(group))
    return {str(key) for node in nodes if isinstance(node, dict) for key in node}


def unknown_key(key: str) -> str | None:
    """One line when ``key`` (``GROUP.NAME...``) names a key that no option of an untyped group
    (:data:`UNTYPED_GROUPS`) has, with the closest one; None otherwise (a key added with ``+``
    is the user's own)."""
    group, _, rest = key.lstrip("~").partition(".")
    name = rest.split(".")[0]
    if group not in UNTYPED_GROUPS or not name or key.startswith("+"):
        return None
    known = untyped_keys(group)
    if name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {group}.{close[0]}?" if close else f"add a key of your own as +{key}"
    return f"{group}.{name} is not among the {group} settings of any {group} option; {hint}"


def quoted_path(arg: str) -> str:
    """``KEY=PATH`` with ``PATH`` quoted for Hydra when ``KEY`` names a path and the path holds
    characters Hydra's grammar would read otherwise: a run directory's name pasted as
    ``trainer.resume=outputs/runs/default/pe=rope,seed=0@1a2b3c4d/checkpoints/last.pt`` works
    as typed. Any other argument, or one already quoted, is returned as it is."""
    key, equals, value = arg.partition("=")
    if not equals or key.lstrip("+~") not in PATH_SETTINGS or value[:1] in ("'", '"'):
        return arg
    return f"{key}={hydra_quoted(value)}" if HYDRA_SPECIAL & set(value) else arg
