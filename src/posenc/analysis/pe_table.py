"""The README's table of encodings, generated from each encoding's own statements."""

from __future__ import annotations

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


def with_table(readme: str, table: str) -> str:
    """``readme`` with its ``pe-table`` section replaced by ``table``."""
    return fill_section(readme, "pe-table", table)
