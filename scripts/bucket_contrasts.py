"""Test loss differences on a source-length bucket against a baseline, over the test sentences
and the training seeds: ``python scripts/bucket_contrasts.py SWEEP [--bucket 80-120]
[--baseline nonepe] [--systems A,B] [--bootstrap 10000]``; see
:mod:`posenc.analysis.bucket_contrasts`."""

from posenc.analysis.bucket_contrasts import main

if __name__ == "__main__":
    main()
