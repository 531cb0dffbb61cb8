"""The report as one self-contained HTML page, ``report.html``, rendered from its blocks.

Every figure is embedded as a ``data:`` URI and the style and the table-sorting script are
inline, so the one file is the whole page and opens offline. All text is escaped (run names,
settings and messages come from run directories); the page's Content-Security-Policy lets only
its own script and style run, by their hashes, and loads nothing from elsewhere."""

from __future__ import annotations

import base64
import hashlib
import html
import math
import mimetypes
import re
from collections.abc import Sequence
from pathlib import Path

from posenc.analysis.report.render import Block, Details, Heading, Image, Table, Text
from posenc.runtime.files import write_text

#: inline markdown of the report's text: ```code``` and ``**bold**``
INLINE = re.compile(r"`([^`]+)`|\*\*(.+?)\*\*")
#: a number at the start of a cell: ``24.50 ± 0.31`` sorts as 24.5, ``1,234`` as 1234
LEADING_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?")

STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
  margin: 0; background: #f6f8fa; }
main { max-width: 1280px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { font-size: 1.7em; margin: 0.2em 0 0.6em; }
h2 { font-size: 1.35em; border-bottom: 1px solid #d0d7de; padding-bottom: 0.2em; margin-top: 2em; }
h3 { font-size: 1.1em; margin-top: 1.5em; }
code { font: 0.88em/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  background: #eff1f3; padding: 0.1em 0.3em; border-radius: 4px; overflow-wrap: anywhere; }
nav.toc { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px;
  padding: 8px 16px; margin: 1em 0 1.5em; }
nav.toc ul { margin: 0.3em 0; padding-left: 0; list-style: none; }
nav.toc ul ul { display: inline; margin: 0 0 0 0.6em; }
nav.toc ul ul li { display: inline; margin-right: 0.6em; font-size: 0.9em; }
a { color: #0969da; text-decoration: none; }
a:hover { text-decoration: underline; }
.table-wrap { overflow-x: auto; margin: 0.8em 0 1.2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
th.num button { text-align: right; }
thead th { background: #eaeef2; position: sticky; top: 0; }
tbody tr:nth-child(even) { background: #f6f8fa; }
tbody tr:hover { background: #fff8c5; }
th button { all: unset; cursor: pointer; display: block; width: 100%; font-weight: 600; }
th button:focus-visible { outline: 2px solid #0969da; }
th button::after { content: "\\00a0\\2195"; color: #8c959f; font-weight: 400; }
th[aria-sort="ascending"] button::after { content: "\\00a0\\25B2"; color: #1f2328; }
th[aria-sort="descending"] button::after { content: "\\00a0\\25BC"; color: #1f2328; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #d0d7de; }
figcaption { color: #59636e; font-size: 0.9em; }
details { margin: 0.5em 0 1em; }
summary { cursor: pointer; color: #0969da; }
.missing { color: #cf222e; }
"""

#: clicking a header sorts its table by that column, ascending then descending; a cell with
#: ``data-sort`` sorts as that number, before text cells; blank and "—" cells stay last
SCRIPT = """
(function () {
  function key(cell) {
    if (!cell) return [2, ""];
    if (cell.hasAttribute("data-sort")) return [0, parseFloat(cell.getAttribute("data-sort"))];
    var text = cell.textContent.trim();
    return text === "" || text === "\\u2014" ? [2, ""] : [1, text];
  }
  function compare(a, b, direction) {
    if (a[0] !== b[0]) return a[0] - b[0];
    if (a[0] === 2) return 0;
    if (a[0] === 0) return direction * (a[1] - b[1]);
    return direction * a[1].localeCompare(b[1], undefined, {numeric: true});
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(headers, function (th, column) {
      th.querySelector("button").addEventListener("click", function () {
        var direction = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        Array.prototype.forEach.call(headers, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", direction === 1 ? "ascending" : "descending");
        var body = table.tBodies[0];
        Array.prototype.slice.call(body.rows).map(function (row, index) {
          return {row: row, key: key(row.cells[column]), index: index};
        }).sort(function (a, b) {
          return compare(a.key, b.key, direction) || a.index - b.index;
        }).forEach(function (item) { body.appendChild(item.row); });
      });
    });
  });
})();
"""


def sort_key(cell: str) -> float | None:
    """The number a cell sorts by: the one it starts with (thousands separators dropped), None
    for a cell that starts with none (text, blank or "—")."""
    match = LEADING_NUMBER.match(cell.strip())
    value = float(match.group().replace(",", "")) if match else None
    return value if value is not None and math.isfinite(value) else None


def inline(text: str) -> str:
    """``text`` as HTML: everything escaped, ```code``` and ``**bold**`` as tags."""
    parts, pos = [], 0
    for match in INLINE.finditer(text):
        parts.append(html.escape(text[pos : match.start()]))
        code, bold = match.groups()
        parts.append(f"<code>{html.escape(code)}</code>" if code else f"<b>{inline(bold)}</b>")
        pos = match.end()
    parts.append(html.escape(text[pos:]))
    return "".join(parts)


def paragraphs(lines: Sequence[str]) -> list[str]:
    """Each line a paragraph, and runs of ``- `` lines a list."""
    out: list[str] = []
    items: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("- "):
            items.append(f"<li>{inline(line[2:])}</li>")
            continue
        if items:
            out += ["<ul>", *items, "</ul>"]
            items = []
        if line.strip():
            out.append(f"<p>{inline(line)}</p>")
    return out


def table_html(table: Table) -> list[str]:
    """A sortable table: each header a button, each numeric cell its ``data-sort`` number; a
    column whose filled cells are all numbers is aligned right."""
    rows = [[str(cell) for cell in row] for row in table.rows]
    width = max([len(table.header), *map(len, rows)])
    numeric = [
        any(_filled(row, i) for row in rows)
        and all(sort_key(row[i]) is not None for row in rows if _filled(row, i))
        for i in range(width)
    ]
    header = "".join(
        f'<th scope="col"{_num(numeric[i])}><button type="button">{inline(title)}</button></th>'
        for i, title in enumerate(table.header)
    )
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            key = sort_key(cell)
            sort = "" if key is None else f' data-sort="{key!r}"'
            cells.append(f"<td{_num(numeric[i])}{sort}>{inline(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return [
        '<div class="table-wrap"><table class="sortable">',
        f"<thead><tr>{header}</tr></thead>",
        "<tbody>",
        *body,
        "</tbody></table></div>",
    ]


def _filled(row: Sequence[str], i: int) -> bool:
    return i < len(row) and row[i].strip() not in ("", "—")


def _num(numeric: bool) -> str:
    return ' class="num"' if numeric else ""


def image_html(image: Image, folder: Path) -> list[str]:
    """The image embedded as a ``data:`` URI (its file in ``folder``), after its lead text."""
    lead = paragraphs(image.lead)
    path = folder / image.name
    if not path.is_file():
        return [*lead, f'<p class="missing">Figure {html.escape(image.name)} is missing.</p>']
    mime = mimetypes.guess_type(image.name)[0] or "application/octet-stream"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    caption = html.escape(image.caption)
    tag = f'<img src="data:{mime};base64,{data}" alt="{caption}" title="{caption}">'
    shown = "" if image.lead else f"<figcaption>{caption}</figcaption>"
    return [*lead, f"<figure>{tag}{shown}</figure>"]


def page(blocks: Sequence[Block], folder: Path) -> str:
    """The whole page of ``blocks``, the images read from ``folder``: the first heading as its
    title, then a table of contents of the sections (``##``) and their subsections (``###``)."""
    anchors = {i: f"s{i}" for i, block in enumerate(blocks) if isinstance(block, Heading)}
    toc: list[tuple[str, str, list[tuple[str, str]]]] = []
    for i, anchor in anchors.items():
        title = str(getattr(blocks[i], "title", ""))
        if _level(blocks[i]) == 2:
            toc.append((anchor, title, []))
        elif _level(blocks[i]) == 3 and toc:
            toc[-1][2].append((anchor, title))
    first = next((i for i in anchors if _level(blocks[i]) == 1), None)
    title = "Report" if first is None else str(getattr(blocks[first], "title", ""))
    body = [] if first is not None else [_toc(toc)]
    for i, block in enumerate(blocks):
        if isinstance(block, Heading):
            level = min(max(block.level, 1), 6)
            body.append(f'<h{level} id="{anchors[i]}">{inline(block.title)}</h{level}>')
            if i == first:
                body.append(_toc(toc))
        elif isinstance(block, Text):
            body += paragraphs(block.lines)
        elif isinstance(block, Table):
            body += table_html(block)
        elif isinstance(block, Image):
            body += image_html(block, folder)
        elif isinstance(block, Details):
            body += [f"<details><summary>{inline(block.summary)}</summary>"]
            body += [*paragraphs(block.lines), "</details>"]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f'<meta http-equiv="Content-Security-Policy" content="{_policy()}">',
            f"<title>{html.escape(_plain(title))}</title>",
            f"<style>{STYLE}</style>",
            "</head>",
            "<body><main>",
            *body,
            "</main>",
            f"<script>{SCRIPT}</script>",
            "</body>",
            "</html>",
            "",
        ]
    )


def _level(block: Block) -> int:
    return block.level if isinstance(block, Heading) else 0


def _toc(entries: Sequence[tuple[str, str, list[tuple[str, str]]]]) -> str:
    """The table of contents: a numbered list of the sections, each with its subsections."""
    items = []
    for anchor, title, subsections in entries:
        sub = "".join(f'<li><a href="#{a}">{inline(t)}</a></li>' for a, t in subsections)
        nested = f"<ul>{sub}</ul>" if sub else ""
        items.append(f'<li><a href="#{anchor}">{inline(title)}</a>{nested}</li>')
    return f'<nav class="toc"><b>Contents</b><ul>{"".join(items)}</ul></nav>' if items else ""


def _plain(text: str) -> str:
    """``text`` without its inline markdown's markers."""
    return INLINE.sub(lambda m: m.group(1) or m.group(2), text)


def _hash(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def _policy() -> str:
    """Nothing loaded from elsewhere: images from ``data:`` only, and only this page's own
    style and script (by their hashes), so no markup that slipped into a run's text could run."""
    return (
        f"default-src 'none'; img-src data:; style-src {_hash(STYLE)}; "
        f"script-src {_hash(SCRIPT)}; base-uri 'none'; form-action 'none'"
    )


def write_html(blocks: Sequence[Block], folder: Path) -> Path:
    """Write ``folder/report.html`` (:func:`page`); returns its path."""
    path = folder / "report.html"
    write_text(path, page(blocks, folder))
    return path
