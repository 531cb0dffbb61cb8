"""Figures written small: a PNG keeps a palette of at most 256 colours and looks as
matplotlib drew it; other formats are written as matplotlib writes them."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from posenc.runtime.figures import PALETTE_COLOURS, save_figure


def drawn(fig, dpi: int) -> np.ndarray:
    """``fig`` as matplotlib renders it at ``dpi``, ``(H, W, 3)``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    return np.asarray(Image.open(buffer).convert("RGB")).astype(int)


def test_a_heat_map_is_kept_with_a_palette_and_looks_as_drawn(tmp_path):
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.imshow(np.random.default_rng(0).random((40, 40)), cmap="viridis")
    ax.plot(np.sin(np.linspace(0, 6, 50)) * 10 + 20, color="tab:orange")
    save_figure(fig, tmp_path / "map.png", dpi=60)
    with Image.open(tmp_path / "map.png") as image:
        assert image.mode == "P" and len(image.getcolors()) <= PALETTE_COLOURS
        kept = np.asarray(image.convert("RGB")).astype(int)
    error = np.abs(kept - drawn(fig, 60))
    assert error.mean() < 1.0 and np.percentile(error, 99) <= 16  # of 255 levels: 1,600 colours
    assert [p.name for p in tmp_path.iterdir()] == ["map.png"]  # no temporary left
    plt.close(fig)


def test_a_plot_of_few_colours_is_kept_exactly_and_the_same_bytes_twice(tmp_path):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar([0, 1, 2], [1, 3, 2], color=["tab:blue", "tab:green", "tab:red"])
    ax.set_axis_off()
    for name in ("a.png", "b.png"):
        save_figure(fig, tmp_path / name, dpi=40)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    with Image.open(tmp_path / "a.png") as image:
        kept = np.asarray(image.convert("RGB")).astype(int)
    original = drawn(fig, 40)
    assert len(np.unique(original.reshape(-1, 3), axis=0)) <= PALETTE_COLOURS
    assert np.array_equal(kept, original)
    plt.close(fig)


def test_a_vector_format_is_written_as_matplotlib_writes_it(tmp_path):
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    save_figure(fig, tmp_path / "line.svg", dpi=72)
    assert (tmp_path / "line.svg").read_text().lstrip().startswith("<?xml")
    plt.close(fig)
