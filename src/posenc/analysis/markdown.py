"""Markdown of generated pages: sections of hand-written pages (the guide's tables) and the
one-row-per-system tables of the headline and the depth contrast."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def markers(name: str) -> tuple[str, str]:
    """The comment lines that open and close the generated section ``name``."""
    return f"<!-- {name} -->", f"<!-- /{name} -->"


def fill_section(page: str, name: str, body: str) -> str:
    """``page`` with the text between the markers of ``name`` replaced by ``body``."""
    start, end = markers(name)
    if start not in page or end not in page:
        raise ValueError(f"the page has no section {name!r}: add the lines {start} and {end}")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body.strip()}\n{end}{tail}"


def system_table(
    headings: Sequence[str], systems: Sequence[str], cell: Callable[[str, int], str | None]
) -> list[str]:
    """A Markdown table, one row per system and one column per heading: ``cell(system, i)`` is
    the text of column ``i`` (None: ``-``)."""
    lines = ["| system | " + " | ".join(headings) + " |", "|---|" + "---|" * len(headings)]
    for system in systems:
        row = [cell(system, i) or "-" for i in range(len(headings))]
        lines.append(f"| {system} | " + " | ".join(row) + " |")
    return lines
