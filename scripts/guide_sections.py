"""Print the guide's generated sections (the encodings table and the map of the source tree),
or write them into docs/GUIDE.md between their markers:
``python scripts/guide_sections.py [--write]``."""

import argparse
from pathlib import Path

from posenc.analysis.guide_sections import encodings_table, layout_tree, with_generated_sections

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="update docs/GUIDE.md in place")
    args = parser.parse_args()
    guide = ROOT / "docs" / "GUIDE.md"
    if args.write:
        page = with_generated_sections(guide.read_text(encoding="utf-8"), ROOT)
        guide.write_text(page, encoding="utf-8")
    else:
        print(encodings_table(ROOT / "configs" / "pe"), layout_tree(ROOT), sep="\n\n")
