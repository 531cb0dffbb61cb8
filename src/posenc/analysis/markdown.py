"""Generated sections of hand-written Markdown pages (the guide's tables)."""

from __future__ import annotations


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
