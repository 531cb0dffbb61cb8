"""Copy sweep reports into docs/ and refill the generated sections of the pages:
``python scripts/update_results.py [--sweeps outputs/sweeps] [--study ../study/outputs/sweeps]``.

- The study (``scripts/study.sh``): each sweep's report (``scripts/report.py SWEEP``; its
  ``report/`` folder) is copied to ``docs/study/<sweep>/``, which ``docs/RESULTS.md`` links to.
- The measurements behind the settings (the encoder-form sweeps) and the demo: each report is
  copied to ``docs/<sweep>/``, which ``docs/METHODS.md`` and the README link to (the benchmark's
  tables are ``docs/bench/bench.md``, which ``make bench``'s output replaces).

The hand-written parts of the pages stay as they are.
"""

import argparse
import shutil
from pathlib import Path

from posenc.analysis.portable import portable

ROOT = Path(__file__).resolve().parents[1]
#: the study's sweeps, copied to docs/study/<name>/
STUDY = ("compare", "extrapolation", "seed_report", "scaling")
#: copied to docs/<name>/ and linked
LINKED = ("demo", "demo_toy", "encoder_forms", "encoder_forms_toy")


def copy_report(report_dir: Path, docs_dir: Path, roots: tuple[Path, ...] = (ROOT,)) -> None:
    """Replace ``docs_dir``'s report files (md, txt, csv, png) by those of ``report_dir``, with
    paths inside the project (or inside another checkout in ``roots`` the runs were made in)
    made relative to it and the home directory written ``~``."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    for old in docs_dir.iterdir():
        if old.suffix in {".md", ".txt", ".csv", ".png"}:
            old.unlink()
    for new in report_dir.iterdir():
        if new.suffix == ".png":
            shutil.copy2(new, docs_dir / new.name)
        elif new.suffix in {".md", ".txt", ".csv"}:
            (docs_dir / new.name).write_bytes(portable(new.read_bytes(), roots))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweeps", type=Path, default=ROOT / "outputs" / "sweeps")
    parser.add_argument(
        "--study", type=Path, help="the study's sweeps (default: --sweeps), e.g. its worktree's"
    )
    args = parser.parse_args()
    docs = ROOT / "docs"
    study = args.study or args.sweeps
    for name in STUDY:
        _copy(study / name / "report", docs / "study" / name, study)
    for name in LINKED:
        _copy(args.sweeps / name / "report", docs / name, args.sweeps)


def _copy(report_dir: Path, docs_dir: Path, sweeps: Path) -> bool:
    """:func:`copy_report` when ``report_dir`` holds a report (True), else say so (False)."""
    if not (report_dir / "report.md").exists():
        print(f"{report_dir}: no report (run scripts/report.py on the sweep); kept {docs_dir}")
        return False
    copy_report(report_dir, docs_dir, (ROOT, sweeps.resolve().parents[1]))
    print(f"copied {report_dir} to {docs_dir.relative_to(ROOT)}")
    return True


if __name__ == "__main__":
    main()
