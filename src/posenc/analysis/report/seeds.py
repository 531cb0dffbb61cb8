"""Which training seeds a page judges: a family judged on some seeds' runs alone, for every
system alike (``--seeds``; seeds trained at another commit left out)."""

from __future__ import annotations

import argparse


def seed_selection(text: str) -> frozenset[int]:
    """The training seeds of ``1-4`` or ``1,2,3`` (``--seeds``: a family judged on these runs
    alone, for every system alike).

    Raises:
        argparse.ArgumentTypeError: anything else (one line).
    """
    seeds: set[int] = set()
    try:
        for part in text.split(","):
            low, dash, high = part.partition("-")
            seeds.update(range(int(low), int(high) + 1) if dash else {int(low)})
    except ValueError:
        seeds = set()
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} names no training seeds (e.g. 1-4 or 0,2)")
    return frozenset(seeds)


def seeds_note(seeds: frozenset[int] | None) -> str:
    """The line a page states its seed selection in (empty without one)."""
    if not seeds:
        return ""
    return f"Runs of seeds {', '.join(map(str, sorted(seeds)))} only, for every system alike."
