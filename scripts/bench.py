"""Time a training step and cached greedy decoding for every positional encoding.

Usage: ``python scripts/bench.py [--pe rope,alibi] [--lengths 64,128,256] [--quick]``; see
``--help`` and :mod:`posenc.analysis.bench` for what is measured and how the timing stays fair.
"""

from posenc.analysis.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
