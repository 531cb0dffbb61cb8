"""Figures written small: a PNG is kept with a palette of at most 256 colours (lossless for
plots of a few colours, about a third of matplotlib's full-colour file for heat maps, with no
visible change), written atomically; any other format as matplotlib writes it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from posenc.runtime.files import replacing

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the most colours a PNG's palette holds
PALETTE_COLOURS = 256


def small_png(png: bytes) -> bytes:
    """The PNG ``png`` as a PNG of at most :data:`PALETTE_COLOURS` colours (median cut, no
    dithering, so a plot's flat areas stay flat), transparency dropped; the same bytes for
    the same input."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        paletted = image.convert("RGB").quantize(
            colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    out = io.BytesIO()
    paletted.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save_figure(fig: Figure, path: Path, dpi: int) -> None:
    """Write ``fig`` to ``path`` at ``dpi``, in the format its suffix names (PNG without
    one), atomically; a PNG through :func:`small_png`."""
    kind = path.suffix.lstrip(".").lower() or "png"
    rendered = io.BytesIO()
    fig.savefig(rendered, dpi=dpi, format=kind)
    data = small_png(rendered.getvalue()) if kind == "png" else rendered.getvalue()
    with replacing(path, "wb") as handle:
        handle.write(data)
