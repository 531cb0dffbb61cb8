"""Print the README's table of encodings: ``python scripts/pe_table.py``."""

from pathlib import Path

from posenc.encodings.table import encodings_table

if __name__ == "__main__":
    print(encodings_table(Path(__file__).resolve().parents[1] / "configs" / "pe"))
