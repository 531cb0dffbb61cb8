"""Print the README's generated sections (the encodings table and the map of the source
tree), or write them into README.md between their markers:
``python scripts/readme_sections.py [--write]``."""

import argparse
from pathlib import Path

from posenc.analysis.readme_sections import encodings_table, layout_tree, with_generated_sections

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args()
    readme = ROOT / "README.md"
    if args.write:
        page = with_generated_sections(readme.read_text(encoding="utf-8"), ROOT)
        readme.write_text(page, encoding="utf-8")
    else:
        print(encodings_table(ROOT / "configs" / "pe"), layout_tree(ROOT), sep="\n\n")
