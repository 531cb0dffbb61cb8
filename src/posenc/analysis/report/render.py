"""Rendering the report: its outline, the :class:`Writer` that collects its blocks, CSV rows
and figures, number formatting, and the figure helpers every figure shares.

The blocks (:class:`Heading`, :class:`Text`, :class:`Table`, :class:`Image`, :class:`Details`)
are the report's structured content: ``report.md`` is their markdown, ``report.html`` is
rendered from them (:mod:`.html`)."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from posenc.analysis.report.stats import Stats
from posenc.runtime.figures import save_figure
from posenc.runtime.files import replacing, write_text

#: the report's sections, in order (``## TITLE`` headings, after the reading)
SECTIONS = (
    "1. Runs",
    "2. Learning curves",
    "3. Scores",
    "4. Significance",
    "5. Length buckets",
    "6. Cost",
    "7. Attention maps",
    "8. Shared setup",
)
#: the columns of ``report.csv``
CSV_COLUMNS = ("section", "split", "encoding", "run", "metric", "value")
#: an image shown from the report's own folder: ``![caption](name)``, the name without a folder
IMAGE_LINK = re.compile(r"^!\[[^\]]*\]\(([^/\\()\s]+)\)$", re.MULTILINE)


#: the start of an HTML tag, comment or declaration: a markdown viewer would render it
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def inert(text: str) -> str:
    """``text`` made safe to place in markdown: a line of its own (newlines become spaces, so
    no run name can start a heading or a table row) and no HTML (a ``<`` that would open a tag
    becomes ``&lt;``; ``p < 0.05`` stays as it is). The report's text is built from run names,
    settings and failure messages, all of them untrusted."""
    return TAG_START.sub("&lt;", text.replace("\r", " ").replace("\n", " "))


@dataclass
class Heading:
    """A heading of ``level`` (1 is the title, 2 a section, 3 a subsection)."""

    title: str
    level: int = 2

    def markdown(self) -> list[str]:
        return ["#" * self.level + " " + inert(self.title)]


@dataclass
class Text:
    """Lines of text (a paragraph each; ``- `` starts a list item) in inline markdown:
    ```code``` and ``**bold**``."""

    lines: list[str]

    def markdown(self) -> list[str]:
        return [inert(line) for line in self.lines]


@dataclass
class Table:
    """A table as written: its header and its rows of cells (formatted or raw values)."""

    header: list[str]
    rows: list[list[Any]]

    def markdown(self) -> list[str]:
        """The markdown lines (header, separator, one per row); ``|`` and newlines in cells are
        escaped."""

        def cell(value: Any) -> str:
            return inert(str(value)).replace("|", "\\|")

        body = [" | ".join(cell(c) for c in row) for row in self.rows]
        header = [cell(c) for c in self.header]
        return [" | ".join(header), " | ".join("---" for _ in self.header), *body]


@dataclass
class Image:
    """The image file ``name`` of the report's folder, after the text lines ``lead``."""

    name: str
    caption: str
    lead: list[str] = field(default_factory=list)

    def markdown(self) -> list[str]:
        return [*map(inert, self.lead), f"![{inert(self.caption)}]({self.name})"]


@dataclass
class Details:
    """Lines folded away under ``summary`` (a ``<details>`` block)."""

    summary: str
    lines: list[str]

    def markdown(self) -> list[str]:
        return [
            f"<details><summary>{inert(self.summary)}</summary>",
            "",
            *map(inert, self.lines),
            "",
            "</details>",
        ]


Block = Heading | Text | Table | Image | Details


class Writer:
    """Collects the blocks, the CSV rows (dicts of :data:`CSV_COLUMNS`) and the figures (saved
    into ``out`` at once) of the report."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.blocks: list[Block] = []
        self.rows: list[dict[str, Any]] = []

    @property
    def lines(self) -> list[str]:
        """The markdown of the blocks, one blank line after each."""
        return [line for block in self.blocks for line in (*block.markdown(), "")]

    def text(self, *lines: str) -> None:
        """Append paragraphs."""
        self.blocks.append(Text(list(lines)))

    def heading(self, title: str, level: int = 2) -> None:
        """A heading."""
        self.blocks.append(Heading(title, level))

    def insert(self, at: int, *blocks: Block) -> None:
        """Insert ``blocks`` before the block number ``at`` (``len(blocks)`` once, say)."""
        self.blocks[at:at] = blocks

    def table(self, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
        """Append a table; returns it as a :class:`Table`."""
        table = Table(list(header), [list(row) for row in rows])
        self.blocks.append(table)
        return table

    def details(self, summary: str, *lines: str) -> None:
        """Append ``lines`` folded away under ``summary``."""
        self.blocks.append(Details(summary, list(lines)))

    def record(
        self, section: str, split: str, encoding: str, run: str, metric: str, value: Any
    ) -> None:
        """One CSV row (skipped when ``value`` is None)."""
        if value is not None:
            self.rows.append(
                dict(zip(CSV_COLUMNS, (section, split, encoding, run, metric, value), strict=True))
            )

    def figure(self, fig: Figure, name: str, caption: str) -> None:
        """Save ``fig`` as ``out/name`` and show it in the report."""
        save_figure(fig, self.out / name, dpi=110)
        self.image(name, caption)

    def image(self, name: str, caption: str, *lead: str) -> None:
        """Show the image file ``out/name``, after the text lines ``lead``."""
        self.blocks.append(Image(name, caption, list(lead)))

    def save(self) -> Path:
        """Write ``report.md`` and ``report.csv`` and remove the images the previous
        ``report.md`` showed that this one does not (:func:`stale_images`); returns the path
        of ``report.md``."""
        with replacing(self.out / "report.csv") as handle:
            writer = csv.DictWriter(handle, CSV_COLUMNS)
            writer.writeheader()
            writer.writerows({k: spreadsheet_safe(v) for k, v in row.items()} for row in self.rows)
        path = self.out / "report.md"
        shown = {block.name for block in self.blocks if isinstance(block, Image)}
        for stale in stale_images(path, shown):
            stale.unlink()
        write_text(path, "\n".join(self.lines).rstrip() + "\n")
        return path


#: what a spreadsheet reads as the start of a formula (OWASP's list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string that starts like a formula gets a
    leading apostrophe (OWASP's guard against CSV injection), unless it is a number
    (``-0.25``); numbers and other strings are kept."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


def stale_images(previous: Path, shown: set[str]) -> list[Path]:
    """The images the report ``previous`` (a ``report.md``, untrusted) showed from its own
    folder that are not in ``shown``: plain PNG files named without a folder, so a figure whose
    system was renamed or left the sweep does not outlive it; nothing else is ever named."""
    if not previous.is_file():
        return []
    folder = previous.parent
    names = IMAGE_LINK.findall(previous.read_text(encoding="utf-8", errors="replace"))
    return sorted(
        folder / name
        for name in set(names) - shown
        if name.endswith(".png") and (folder / name).is_file() and not (folder / name).is_symlink()
    )


def record_stats(
    w: Writer, section: str, split: str, encoding: str, metric: str, stats: Stats | None
) -> None:
    """CSV rows ``METRIC_mean``, ``METRIC_std`` and ``METRIC_n`` of a mean over seeds (none when
    ``stats`` is None)."""
    if stats is not None:
        for suffix, value in zip(("mean", "std", "n"), stats, strict=True):
            w.record(section, split, encoding, "", f"{metric}_{suffix}", value)


# ---------------------------------------------------------------- formatting


def fmt(value: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals (integers with thousands separators); "—" for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def fmt_stats(stats: Stats | None, digits: int = 2) -> str:
    """``mean ± std`` (just the mean for one seed); "—" for none."""
    if stats is None:
        return "—"
    mean, std, n = stats
    return f"{mean:,.{digits}f} ± {std:,.{digits}f}" if n > 1 else f"{mean:,.{digits}f}"


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "x"


# ---------------------------------------------------------------- figures


def new_figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Any]]:
    """A figure drawn by the Agg backend (no pyplot state) and its ``panels`` axes, side by
    side."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


#: distinct colours: matplotlib's tab10, then five darker hues (no pale twins, no black: the
#: length limits are black)
COLOURS = (
    *[colormaps["tab10"](i) for i in range(10)],
    "#393b79",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#637939",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
LINE_STYLES = ("-", "--", "-.", ":")


def palette(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """A fixed style per name (sorted), shared by every figure: ``{"color", "marker",
    "linestyle"}`` keyword arguments of ``Axes.plot``. Colours, markers and line styles cycle
    with different periods (15, 12, 4), so no two of the first 60 names look the same."""
    ordered = sorted(set(names))
    return {
        name: {
            "color": COLOURS[i % len(COLOURS)],
            "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINE_STYLES[i % len(LINE_STYLES)],
        }
        for i, name in enumerate(ordered)
    }


#: the style of a name missing from the palette
GREY = {"color": "grey", "marker": ".", "linestyle": "-"}


#: the height of one legend line at the report's 7-point legend font, in points: 26 one-line
#: entries measured 287 points with the frame (11 a line), rounded up for the frame
LEGEND_LINE_PT = 12.0
#: the width of a character of that font, in points (50 letters measured 216 points)
LEGEND_CHAR_PT = 4.3


def outside_legend(fig: Figure, ax: Any, title: str | None = None) -> None:
    """The legend of ``ax``'s labelled lines to the right of the figure, outside the axes, in
    as many columns as it takes to stay within the figure's height (a two-line label counts
    twice); the figure widens by each column past the first, so the axes keep their width."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        lines = sum(label.count("\n") + 1 for label in labels) + (2 if title else 0)
        fits = max(1, int(fig.get_figheight() * 72 * 0.92 / LEGEND_LINE_PT))
        columns = math.ceil(lines / fits)
        longest = max(len(line) for label in labels for line in label.splitlines())
        column_inches = (longest * LEGEND_CHAR_PT + 3 * LEGEND_LINE_PT) / 72
        fig.set_figwidth(fig.get_figwidth() + (columns - 1) * column_inches)
        fig.legend(
            handles, labels, loc="outside right upper", fontsize=7, title=title, ncols=columns
        )
