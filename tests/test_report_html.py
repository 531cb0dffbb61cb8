"""The report's HTML page, ``report.html``, specified on a real smoke sweep (nonepe and rope
trained and scored by ``posenc.job.run``) with two runs whose names, settings and failure
message hold markup: the page stands alone, shows report.md's tables, sorts them, and shows
every text from a run directory as text."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf
from test_report import SHORT

from posenc.analysis.report.build import build_report
from posenc.analysis.report.html import SCRIPT, STYLE, inline, sort_key
from posenc.analysis.report.render import SECTIONS, inert
from posenc.job import run

SCRIPT_NAME = (
    "<script>alert(1)</script>"  # a run directory nested as "<script>alert(1)<" / "script>"
)
IMG = "<img src=x onerror=alert(1)>"
VOID = {"meta", "img", "br", "hr", "link", "input"}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two done runs, an unfinished run named and configured with markup, and a failed run
    whose failure message is markup."""
    root = tmp_path_factory.mktemp("sweep")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSENC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for pe in ("nonepe", "rope"):
            run(compose(*SHORT, f"pe={pe}"), root / f"pe={pe}")
    torch.set_num_threads(threads)
    config = OmegaConf.load(root / "pe=rope" / "config.yaml")
    config.name = f"</td></tr></table>{IMG}"
    config.pe.name = IMG
    (root / SCRIPT_NAME).mkdir(parents=True)
    OmegaConf.save(config, root / SCRIPT_NAME / "config.yaml")
    failed = root / "failed"
    failed.mkdir()
    OmegaConf.save(OmegaConf.load(root / "pe=nonepe" / "config.yaml"), failed / "config.yaml")
    failure = {"error": "<b>Boom</b>", "message": "<script>document.title='x'</script>"}
    (failed / "failed.json").write_text(json.dumps(failure))
    return root


@pytest.fixture(scope="module")
def report(sweep) -> tuple[Path, str, str]:
    """The report of the sweep: (out dir, report.md, report.html)."""
    written = build_report(sweep, sweep / "out", samples=50)
    out = written.path.parent
    return out, written.path.read_text("utf-8"), (out / "report.html").read_text("utf-8")


class Page(HTMLParser):
    """The page's tags (with attributes), tables (rows of cell texts, header first), text, and
    what does not nest: end tags that close no open tag, tags left open at the end."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.tables: list[list[list[str]]] = []
        self.text: list[str] = []
        self.errors: list[str] = []
        self.stack: list[str] = []
        self.cell: list[str] | None = None
        self.feed(page)
        self.close()
        self.errors += [f"<{tag}> never closed" for tag in self.stack]

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def markdown_tables(markdown: str) -> list[list[list[str]]]:
    """The tables of report.md, each a list of rows of cells (header first), as the page shows
    them: ``\\|`` unescaped, the inline markdown (```code```, ``**bold**``) gone."""
    tables: list[list[list[str]]] = []
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if i and re.fullmatch(r"---( \| ---)*", line):
            rows = [lines[i - 1]] + [r for r in _rows_after(lines, i + 1)]
            tables.append([[_plain(c) for c in re.split(r"(?<!\\) \| ", r)] for r in rows])
    return tables


def _rows_after(lines: list[str], start: int):
    for line in lines[start:]:
        if not line:
            return
        yield line


def _plain(cell: str) -> str:
    """A markdown cell as the page shows it: inline code and bold gone, ``\\|`` and the
    ``&lt;`` that keeps a tag inert in the markdown read back."""
    plain = re.sub(r"`([^`]+)`|\*\*(.+?)\*\*", lambda m: m.group(1) or m.group(2), cell)
    return plain.replace("\\|", "|").replace("&lt;", "<")


def test_the_page_is_written_beside_report_md(report):
    out, _, page = report
    assert (out / "report.md").exists() and (out / "report.html").exists()
    assert page.startswith("<!DOCTYPE html>")


def test_the_page_parses_as_html_and_every_tag_nests(report):
    parsed = Page(report[2])
    assert parsed.errors == []
    assert [t for t, _ in parsed.tags].count("h1") == 1


def test_the_page_stands_alone_with_every_figure_embedded(report):
    out, markdown, page = report
    assert 'src="http' not in page and "<link" not in page and "url(" not in page
    assert "@import" not in page
    images = [attrs for tag, attrs in Page(page).tags if tag == "img"]
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(images) == len(shown) >= 6
    prefix = "data:image/png;base64,"
    for attrs, name in zip(images, shown, strict=True):
        assert attrs["src"].startswith(prefix)
        assert base64.b64decode(attrs["src"][len(prefix) :]) == (out / name).read_bytes()
    scripts = [attrs for tag, attrs in Page(page).tags if tag == "script"]
    assert scripts == [{}]  # the one inline script, no src


def test_every_table_of_the_markdown_is_in_the_page_with_the_same_cells(report):
    _, markdown, page = report
    expected = markdown_tables(markdown)
    assert len(expected) >= 8
    assert Page(page).tables == expected


def test_every_table_sorts_by_a_click_on_its_headers_numbers_as_numbers(report):
    page = report[2]
    assert f"<script>{SCRIPT}</script>" in page
    assert 'addEventListener("click"' in SCRIPT and "data-sort" in SCRIPT
    tables = re.findall(r"<table[^>]*>.*?</table>", page, re.S)
    assert len(tables) == len(Page(page).tables)
    for table in tables:
        assert table.startswith('<table class="sortable">')
        headers = re.findall(r"<th\b[^>]*>(.*?)</th>", table, re.S)
        assert headers and all(h.startswith('<button type="button">') for h in headers)
        for attrs, text in re.findall(r"<td\b([^>]*)>(.*?)</td>", table, re.S):
            key = sort_key(html.unescape(re.sub(r"<[^>]+>", "", text)))
            assert (f' data-sort="{key!r}"' in attrs) == (key is not None)


def test_a_cell_sorts_by_the_number_it_starts_with():
    assert sort_key("24.50 ± 0.31") == 24.5
    assert sort_key("1,234") == 1234.0 and sort_key("1,234.5") == 1234.5
    assert sort_key("0, 1") == 0.0  # a list of seeds sorts by its first
    assert sort_key("+0.12, -0.30") == 0.12 and sort_key("-3e-05") == -3e-05
    assert sort_key("2.89 (2.90 ± 0.21)") == 2.89
    for text in ("—", "", "baseline", "pe=rope", "`pe=nonepe`", "1e999"):
        assert sort_key(text) is None


def test_text_from_run_directories_is_shown_as_text(report):
    _, markdown, page = report
    assert inert(SCRIPT_NAME) in markdown  # the run is in the report, inert
    parsed = Page(page)
    assert parsed.errors == []
    assert [tag for tag, _ in parsed.tags].count("script") == 1
    assert all(attrs["src"].startswith("data:") for tag, attrs in parsed.tags if tag == "img")
    assert not any(k.startswith("on") for _, attrs in parsed.tags for k in attrs)
    text = "".join(parsed.text)
    for untrusted in (SCRIPT_NAME, IMG, "<b>Boom</b>", "document.title='x'", "</td></tr>"):
        assert untrusted in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert inline("`<i>` **<b>**") == "<code>&lt;i&gt;</code> <b>&lt;b&gt;</b>"


def test_the_contents_link_every_section_and_the_policy_allows_only_the_pages_own_code(report):
    page = report[2]
    parsed = Page(page)
    ids = {attrs["id"] for _, attrs in parsed.tags if "id" in attrs}
    links = [attrs["href"] for tag, attrs in parsed.tags if tag == "a"]
    sections = [attrs["id"] for tag, attrs in parsed.tags if tag == "h2"]
    assert len(sections) == 1 + len(SECTIONS) and set(sections) <= {link[1:] for link in links}
    assert all(link.startswith("#") and link[1:] in ids for link in links)
    policy = next(a["content"] for t, a in parsed.tags if a.get("http-equiv"))
    for source in (SCRIPT, STYLE):
        digest = base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    assert "default-src 'none'" in policy and "img-src data:" in policy
