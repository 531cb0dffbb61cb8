"""Generated sections of hand-written Markdown pages (the guide's tables, docs/METHODS.md)."""

from __future__ import annotations

import re


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


def embed_report(report: str, folder: str, link_only: tuple[str, ...] = ()) -> str:
    """A report page made fit to sit inside another page, its files living in ``folder``.

    Its title goes, its headings move down one level, its images and links point into
    ``folder``, and the sections titled in ``link_only`` become one link to the full report.
    """
    kept: list[str] = []
    skipping = False
    for line in report.splitlines()[1:]:  # without the "# title" line
        heading = re.match(r"^(#+) (.*)$", line)
        if heading and len(heading.group(1)) == 2:
            title = heading.group(2)
            skipping = title.split(". ", 1)[-1] in link_only
            if skipping:
                anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
                link = f"{folder}/report.md"
                kept += [f"#{line}", "", f"See [{link}]({link}#{anchor}).", ""]
                continue
        if skipping:
            continue
        if heading:
            line = "#" + line
        kept.append(re.sub(r"\]\((?!https?:|#)([^)]+)\)", rf"]({folder}/\1)", line))
    return "\n".join(kept)
