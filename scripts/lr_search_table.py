"""The learning-rate searches' table: ``python scripts/lr_search_table.py [SEARCH_DIR]``.

``SEARCH_DIR`` (default ``outputs/sweeps/lr_search``) holds one folder per encoding
(``pe=NAME``, from ``python train.py -m experiment=lr_search pe=NAME``); each trial is a run
folder whose name ends in ``trainer.lr=VALUE`` and whose ``train_summary.json`` has its best
validation loss. Prints a markdown table: per encoding, the best learning rate and loss, and
every trial as ``lr: loss`` in learning-rate order.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from posenc.runtime.files import read_json

LR = re.compile(r"(?:^|,)trainer\.lr=([0-9.eE+-]+)(?:,|$)")


def trials(search: Path) -> list[tuple[float, float]]:
    """``(lr, best validation loss)`` of every finished trial in one encoding's folder, by lr."""
    found = []
    for run in search.iterdir():
        match = LR.search(run.name)
        loss = (read_json(run / "train_summary.json") or {}).get("best_valid_loss")
        if match and loss is not None:
            found.append((float(match.group(1)), float(loss)))
    return sorted(found)


def table(root: Path) -> str:
    """The markdown table of every search under ``root``."""
    lines = [
        "| encoding | best lr | best valid loss | trials (lr: loss) |",
        "|---|---|---|---|",
    ]
    for search in sorted(p for p in root.glob("pe=*") if p.is_dir()):
        found = trials(search)
        if not found:
            continue
        lr, loss = min(found, key=lambda t: t[1])
        cells = ", ".join(f"{x:.2g}: {y:.3f}" for x, y in found)
        lines.append(f"| {search.name[3:]} | {lr:.2g} | {loss:.3f} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, nargs="?", default=Path("outputs/sweeps/lr_search"))
    args = parser.parse_args(argv)
    print(table(args.root))


if __name__ == "__main__":
    main()
