"""Print the README's table of encodings, or write it into README.md between its markers:
``python scripts/pe_table.py [--write]``."""

import argparse
from pathlib import Path

from posenc.analysis.pe_table import encodings_table, with_table

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args()
    table = encodings_table(ROOT / "configs" / "pe")
    if args.write:
        readme = ROOT / "README.md"
        readme.write_text(with_table(readme.read_text(), table))
    else:
        print(table)
