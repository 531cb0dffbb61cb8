"""Draw what a positional encoding does: ``python scripts/plot_pe.py pe=rope [--out DIR]``.

Writes ``DIR/NAME.png`` (default ``outputs/plots``) and the plotted arrays as ``DIR/NAME.npz``;
see :mod:`posenc.analysis.plot_pe` for the panels.
"""

from posenc.analysis.plot_pe import main

if __name__ == "__main__":
    raise SystemExit(main())
