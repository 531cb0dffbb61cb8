"""The guide's generated sections (docs/GUIDE.md): the table of encodings, from each encoding's own
statements, and the map of the source tree, from each module's docstring."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from omegaconf import OmegaConf

from posenc.analysis.markdown import fill_section
from posenc.model.encodings import encoding_class, encoding_factory
from posenc.model.encodings.base import Site


def encodings_table(pe_dir: Path) -> str:
    """Markdown: one row per ``configs/pe/*.yaml`` with where it acts, its encoder form (with
    the config's settings), whether the encoder sees the source's word order and the
    ``pe.augment`` modes it accepts."""
    rows = [
        "| `pe=` | class | where it acts | encoder (bidirectional) form | source order "
        "| `pe.augment` |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(pe_dir.glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        cls = encoding_class(cfg["_target_"], cfg["name"])
        encoder = encoding_factory(cfg)(Site.ENCODER, d_model=16, n_heads=2, n_layers=1)
        cells = [
            f"`{cfg['name']}`",
            f"`{cls.__module__.split('.')[-1]}.{cls.__name__}`",
            encoder.applies_to,
            encoder.encoder_form,
            "yes" if encoder.sees_source_order else "**no** (a source and its reversal match)",
            ", ".join(sorted(cls.augment_modes)) or "-",
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


#: the packages of ``src/posenc`` in data-flow order: a module imports only from its own phase or
#: an earlier one (``tests/test_layout.py``); the map lists them in this order
PHASES = (
    "config",
    "runtime",
    "data",
    "model",
    "training",
    "evaluation",
    "translate",
    "api",
    "analysis",
    "job",
    "cli",
)
#: the longest summary the map shows (two of its lines); a longer first sentence fails a test
MAX_SUMMARY = 120
NAME_WIDTH = 26
WIDTH = 100


def summary(path: Path) -> str:
    """The first sentence of the docstring of the Python file ``path``, reST roles and trailing
    ``.``/``:`` dropped; past 100 characters, citations in parentheses go, then what follows a
    colon. Empty without a docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    first = re.split(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.\s", paragraph + " ")[0]
    first = re.sub(r":\w+:`~?\.?([^`]+)`", r"\1", first.strip().rstrip(".:"))
    first = first.replace("``", "`")
    if len(first) > 100:
        first = re.sub(r"\s*\([^()]*\d{4}[^()]*\)", "", first)
    head = first.split(": ", 1)[0]
    if len(first) > 100 and 12 <= len(head) < len(first):
        first = head
    return first


def _entry(depth: int, name: str, text: str) -> list[str]:
    """One entry of the map: ``name`` indented by ``depth``, ``text`` wrapped beside it."""
    label = "  " * depth + name
    indent = " " * NAME_WIDTH
    if len(label) >= NAME_WIDTH:
        return [label, *textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent)]
    lines = textwrap.wrap(text, WIDTH - NAME_WIDTH) or [""]
    return [label.ljust(NAME_WIDTH) + lines[0], *(indent + line for line in lines[1:])]


def _package(folder: Path, depth: int) -> list[str]:
    """The entries of a package folder's modules (alphabetical) and subpackages (after them)."""
    lines: list[str] = []
    modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    for path in modules:
        lines += _entry(depth, path.name, summary(path))
    for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file()):
        lines += _entry(depth, sub.name + "/", summary(sub / "__init__.py"))
        lines += _package(sub, depth + 1)
    return lines


def layout_tree(root: Path) -> str:
    """The map of the repository at ``root``: ``train.py``, the config groups, every module of
    ``src/posenc`` (phases in :data:`PHASES` order) with its summary, the study beside it, the
    scripts and the tests."""
    src = root / "src" / "posenc"
    groups = sorted(p.name for p in (root / "configs").iterdir() if p.is_dir())
    scripts = sorted(p.stem for p in (root / "scripts").iterdir() if p.suffix in (".py", ".sh"))
    lines = [
        *_entry(0, "train.py", summary(root / "train.py")),
        *_entry(0, "configs/", "Hydra groups: " + ", ".join(groups)),
        *_entry(0, "src/posenc/", summary(src / "__init__.py")),
    ]
    for phase in PHASES:
        if (src / phase / "__init__.py").is_file():
            lines += _entry(1, phase + "/", summary(src / phase / "__init__.py"))
            lines += _package(src / phase, 2)
        else:
            lines += _entry(1, phase + ".py", summary(src / f"{phase}.py"))
    lines += _entry(0, "study/", summary(root / "study" / "__init__.py"))
    lines += _package(root / "study", 1)
    lines += _entry(0, "scripts/", "thin command lines: " + ", ".join(scripts))
    lines += _entry(0, "tests/", "specifications; outputs/ is git-ignored")
    return "```text\n" + "\n".join(line.rstrip() for line in lines) + "\n```"


def with_generated_sections(readme: str, root: Path) -> str:
    """``readme`` with its ``pe-table`` and ``layout`` sections generated from the code at
    ``root``."""
    readme = fill_section(readme, "pe-table", encodings_table(root / "configs" / "pe"))
    return fill_section(readme, "layout", layout_tree(root))
