"""The README's table of encodings, generated from each encoding's own statements."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from posenc.encodings import encoding_factory
from posenc.markdown import fill_section


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


def with_table(readme: str, table: str) -> str:
    """``readme`` with its ``pe-table`` section replaced by ``table``."""
    return fill_section(readme, "pe-table", table)
