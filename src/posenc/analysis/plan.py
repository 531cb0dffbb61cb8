"""A study's analysis plan: the families of comparisons, their metrics, splits and baseline, and
the equivalence margins, declared in a YAML file before the runs they judge
(``docs/study/plans/NAME.yaml``), and recorded by the SHA-256 of its bytes wherever a verdict
drawn from it is printed. A family that is not in a plan, or that the plan itself marks as
formed after the results, is *exploratory*: its verdicts are printed with that word.

The file is untrusted input: every key is checked, and a bad one is one line naming it.
"""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: how a plan states that a family was declared before its runs (any other value: afterwards)
BEFORE = "before the runs"
#: the top-level keys a plan may hold
KEYS = {
    "plan",
    "declared",
    "question",
    "runs",
    "baseline",
    "systems",
    "splits",
    "margins",
    "families",
}
#: the keys a family may hold
FAMILY_KEYS = {
    "name",
    "contrast",
    "metrics",
    "splits",
    "steps",
    "tests",
    "declared",
    "note",
    "holm_within",
}
#: the factors a family's Holm correction may be split by (``holm_within``): ``depth``, each
#: model depth apart; ``kind``, the BLEU-and-chrF cells apart from the validation losses
HOLM_FACTORS = ("depth", "kind")


class PlanError(ValueError):
    """A plan file that cannot be read as a plan (the message names the file and the key)."""


@dataclass(frozen=True)
class Family:
    """One family of comparisons corrected together: its name, the contrast, the metrics it
    tests, how many tests it holds, when it was declared (:data:`BEFORE` or a statement that
    it was formed afterwards) and the factors its Holm correction is split by
    (:data:`HOLM_FACTORS`; none: one correction over every test of the family)."""

    name: str
    contrast: str
    metrics: tuple[str, ...]
    tests: int
    declared: str = BEFORE
    holm_within: tuple[str, ...] = ()

    @property
    def exploratory(self) -> bool:
        """Whether the family was formed after the results it judges."""
        return self.declared != BEFORE


@dataclass(frozen=True)
class Plan:
    """A plan file read and checked: its name, the date it was declared, the SHA-256 of its
    bytes (:attr:`digest`, the first 12 hex digits), the baseline, the equivalence margins by
    metric and the families."""

    path: Path
    name: str
    declared: str
    digest: str
    baseline: str
    margins: dict[str, float]
    families: tuple[Family, ...]

    def family(self, name: str) -> Family | None:
        """The family called ``name`` (None when the plan has none by that name)."""
        return next((f for f in self.families if f.name == name), None)


def _require(mapping: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise PlanError(f"{where}: '{key}' must be a {kind.__name__}, got {value!r}")
    return value


def _family(raw: Any, where: str) -> Family:
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: a family must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - FAMILY_KEYS)
    if unknown:
        raise PlanError(f"{where}: unknown key '{unknown[0]}' (known: {sorted(FAMILY_KEYS)})")
    name = _require(raw, "name", str, where)
    metrics = _require(raw, "metrics", list, f"{where} '{name}'")
    if not metrics or not all(isinstance(m, str) for m in metrics):
        raise PlanError(f"{where} '{name}': 'metrics' must list metric names, got {metrics!r}")
    tests = _require(raw, "tests", int, f"{where} '{name}'")
    if tests < 1:
        raise PlanError(f"{where} '{name}': 'tests' must be at least 1, got {tests}")
    declared = raw.get("declared", BEFORE)
    if not isinstance(declared, str) or not declared:
        raise PlanError(f"{where} '{name}': 'declared' must be a sentence, got {declared!r}")
    contrast = _require(raw, "contrast", str, f"{where} '{name}'")
    within = raw.get("holm_within", [])
    if not isinstance(within, list) or not all(f in HOLM_FACTORS for f in within):
        raise PlanError(
            f"{where} '{name}': 'holm_within' must list factors of {list(HOLM_FACTORS)} "
            f"(none: one correction over the family), got {within!r}"
        )
    return Family(name, contrast, tuple(metrics), tests, declared, tuple(within))


def _declared(raw: dict[str, Any], where: str) -> str:
    value = raw.get("declared")
    if value is None or isinstance(value, bool) or str(value).strip() == "":
        raise PlanError(f"{where}: 'declared' must give the date the plan was declared")
    return str(value)


def load_plan(path: Path) -> Plan:
    """Read and check the plan at ``path`` (:class:`PlanError` naming the problem)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PlanError(f"plan {path}: cannot be read ({err.strerror or err})") from err
    try:
        raw = yaml.safe_load(data)
    except yaml.YAMLError as err:
        raise PlanError(f"plan {path}: not YAML ({str(err).splitlines()[0]})") from err
    where = f"plan {path}"
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: must be a mapping of keys, got {type(raw).__name__}")
    unknown = sorted(set(map(str, raw)) - KEYS)
    if unknown:
        raise PlanError(f"{where}: unknown key '{unknown[0]}' (known: {sorted(KEYS)})")
    margins = raw.get("margins") or {}
    if not isinstance(margins, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in margins.values()
    ):
        raise PlanError(f"{where}: 'margins' must map metrics to positive numbers, got {margins!r}")
    families = _require(raw, "families", list, where)
    if not families:
        raise PlanError(f"{where}: 'families' lists no family")
    parsed = tuple(_family(f, f"{where}, family {i + 1}") for i, f in enumerate(families))
    names = [f.name for f in parsed]
    if len(set(names)) != len(names):
        raise PlanError(f"{where}: two families share a name ({names})")
    return Plan(
        path=path,
        name=_require(raw, "plan", str, where),
        declared=_declared(raw, where),
        digest=hashlib.sha256(data).hexdigest()[:12],
        baseline=_require(raw, "baseline", str, where),
        margins={str(k): float(v) for k, v in margins.items()},
        families=parsed,
    )


def provenance(plan: Plan | None, family: str | None) -> str:
    """The line a table of verdicts opens with: the plan, its digest and the family's
    declaration, or why the verdicts are exploratory."""
    if plan is None or family is None:
        return (
            "**Exploratory**: these comparisons are not a family of a declared analysis plan "
            "(no `--plan` and `--family`)."
        )
    found = plan.family(family)
    if found is None:
        return (
            f"**Exploratory**: plan `{plan.name}` (sha256 {plan.digest}) declares no family "
            f"'{family}'."
        )
    head = f"Family '{found.name}' ({found.tests} tests) of plan `{plan.name}`"
    head += f" (sha256 {plan.digest})"
    if found.exploratory:
        return f"**Exploratory**: {head}, formed {found.declared}."
    return f"{head}, declared on {plan.declared} {BEFORE}."


def declared_tests_note(plan: Plan | None, family: str | None, held: int) -> str | None:
    """The line a table adds when it holds another number of tests than its plan's family
    declares (None without a plan's family, or when the two agree)."""
    found = plan.family(family) if plan is not None and family is not None else None
    if found is None or found.tests == held:
        return None
    return (
        f"**The family declares {found.tests} tests; this table holds {held}** (a cell below the "
        "quality floor, with one seed a side or whose seeds split into modes is not tested)."
    )


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """``--plan FILE`` and ``--family NAME``, the family of a plan a command's comparisons are."""
    parser.add_argument("--plan", type=Path, help="the analysis plan (YAML) declaring the family")
    parser.add_argument("--family", help="the plan's family these comparisons are")


def plan_of(path: Path | None, command: str) -> Plan | None:
    """The plan at ``path`` (None without one); SystemExit with one line, naming ``command``,
    when it cannot be read as a plan."""
    try:
        return load_plan(path) if path is not None else None
    except PlanError as err:
        raise SystemExit(f"{command}: {err}") from None
