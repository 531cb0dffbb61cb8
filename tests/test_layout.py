"""The source tree is a map of the data flow: packages by phase, each module importing only
from its own phase or an earlier one, small files, and encodings named nowhere but in their
own modules, their configs and the tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import PE_NAMES, ROOT

from study.guide_sections import PHASES  # the phases in data-flow order

SRC = ROOT / "src" / "posenc"
MAX_LINES = 500
MODULES = sorted(p for p in SRC.rglob("*.py"))
STUDY = sorted((ROOT / "study").rglob("*.py"))


def phase(module: str) -> int:
    """The phase index of a dotted ``posenc.*`` module name."""
    return PHASES.index(module.split(".")[1])


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def posenc_imports(path: Path) -> list[str]:
    """The ``posenc.*`` modules ``path`` imports (at any depth of the file)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("posenc."):
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("posenc.")]
    return names


def test_every_module_belongs_to_a_phase():
    outside = [module_name(p) for p in MODULES if module_name(p) != "posenc"]
    assert [m for m in outside if m.split(".")[1] not in PHASES] == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_no_module_imports_a_later_phase(path):
    me = module_name(path)
    if me == "posenc":
        return
    later = [m for m in posenc_imports(path) if phase(m) > phase(me)]
    assert later == [], f"{me} imports {later}, of a later phase"


@pytest.mark.parametrize("path", MODULES + STUDY, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_file_is_over_500_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_LINES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_the_harness_never_imports_the_study(path):
    """The study sits beside posenc, not in its wheel: posenc runs without it."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    assert [n for n in names if n == "study" or n.startswith("study.")] == []


def code_files() -> list[Path]:
    """The code that must not name an encoding: the package outside ``model/encodings``, the
    scripts and ``train.py``."""
    package = [p for p in MODULES if "encodings" not in p.relative_to(SRC).parts]
    return [*package, *sorted((ROOT / "scripts").glob("*.py")), ROOT / "train.py"]


@pytest.mark.parametrize("path", code_files(), ids=lambda p: p.name)
def test_no_encoding_is_named_in_code_outside_its_module(path):
    """No string in the code is an encoding's name, and no code imports one encoding's module:
    adding an encoding is one module, one YAML and one test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PE_NAMES
    ]
    encoding_modules = [
        m
        for m in posenc_imports(path)
        if m.startswith("posenc.model.encodings.") and m not in RULE_FOUNDATIONS
    ]
    assert named == [] and encoding_modules == []


ENCODINGS = "posenc.model.encodings"
#: what code outside the encodings may import from their package: the base of every rule and
#: the wrappers around any rule (temperatures, sinks)
RULE_FOUNDATIONS = {f"{ENCODINGS}.base", f"{ENCODINGS}.wrapping"}
#: the modules an encoding module may import from its own package: the base, the helpers that
#: several encodings share (``rotation``: the rotary encodings' rotation of q and k; ``wrapping``:
#: rules around rules) and RoPE's context-extension scalings (``rope_scaling``, a table apart as
#: transformers keeps its own)
ENCODING_LIBRARIES = {
    f"{ENCODINGS}.base",
    f"{ENCODINGS}.wrapping",
    f"{ENCODINGS}.common",
    f"{ENCODINGS}.rotation",
    f"{ENCODINGS}.rope_scaling",
}


def package_imports(path: Path) -> list[str]:
    """Every module of :data:`ENCODINGS`, or the package itself, that ``path`` imports at any
    depth: ``import M``, ``from M import x``, ``from PACKAGE import M``, relative imports."""
    package = module_name(path).rsplit(".", 1)[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            for alias in node.names:  # ``from PACKAGE import M`` imports the module M
                full = f"{module}.{alias.name}"
                names.append(full if ENCODINGS in (module, full) else module)
    inside = (name for name in names if name == ENCODINGS or name.startswith(f"{ENCODINGS}."))
    return list(dict.fromkeys(inside))


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (SRC / "model" / "encodings").glob("*.py") if p.name != "__init__.py"),
    ids=lambda p: p.stem,
)
def test_encoding_modules_import_no_other_encoding(path):
    """Encoding modules are leaves: each imports only the libraries of its package
    (:data:`ENCODING_LIBRARIES`: what two or more encodings share), so one encoding's module can
    change without touching another's."""
    others = [m for m in package_imports(path) if m not in ENCODING_LIBRARIES]
    assert others == [], f"{module_name(path)} imports {others}; encodings import only libraries"
