"""The report of a sweep: ``python scripts/report.py SWEEP_DIR [--out DIR] [--split test]
[--bootstrap N] [--eval NAME] [--reference NAME]`` writes report.md, PNG figures and report.csv
(see ``posenc.analysis.report``)."""

from posenc.analysis.report.build import main

if __name__ == "__main__":
    main()
