"""The extrapolation penalty of a "train short, test long" sweep against the same encodings
trained on all lengths: ``python scripts/extrapolation_penalty.py SHORT_SWEEP FULL_SWEEP
[--split test] [--min-sentences 20]`` prints a markdown table of the extra test loss per token
by source-length bucket (see ``posenc.analysis.penalty``)."""

from posenc.analysis.penalty import main

if __name__ == "__main__":
    main()
