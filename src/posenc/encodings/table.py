"""The README's table of encodings, generated from each encoding's own statements."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from posenc.encodings import encoding_factory


def encodings_table(pe_dir: Path) -> str:
    """Markdown: one row per ``configs/pe/*.yaml`` with where it acts and its encoder form."""
    rows = [
        "| `pe=` | class | where it acts | encoder (bidirectional) form |",
        "|---|---|---|---|",
    ]
    for path in sorted(pe_dir.glob("*.yaml")):
        cfg = OmegaConf.to_container(OmegaConf.load(path))
        cls = encoding_factory(cfg).func
        cells = [
            f"`{cfg['name']}`",
            f"`{cls.__module__.split('.')[-1]}.{cls.__name__}`",
            cls.applies_to,
            cls.encoder_form,
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


START, END = "<!-- pe-table -->", "<!-- /pe-table -->"


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between the pe-table markers replaced by ``table``."""
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"
