"""Print the guide's generated sections (the encodings table and the map of the source tree),
or write them into docs/GUIDE.md between their markers: ``python -m study guide-sections
[--write]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from study.guide_sections import encodings_table, layout_tree, with_generated_sections

#: the repository's root (the study package sits at its top)
ROOT = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/GUIDE.md in place")
    args = parser.parse_args(argv)
    guide = ROOT / "docs" / "GUIDE.md"
    if args.write:
        page = with_generated_sections(guide.read_text(encoding="utf-8"), ROOT)
        guide.write_text(page, encoding="utf-8")
    else:
        print(encodings_table(ROOT / "configs" / "pe"), layout_tree(ROOT), sep="\n\n")
    return 0
