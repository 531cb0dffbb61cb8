"""Draw what a positional encoding does: ``python scripts/plot_pe.py pe=rope [--out DIR]``.

Writes ``DIR/NAME.png`` (default ``outputs/plots``) and the plotted arrays as ``DIR/NAME.npz``;
see :mod:`posenc.plot_pe` for the panels.
"""

from posenc.plot_pe import main

if __name__ == "__main__":
    raise SystemExit(main())
