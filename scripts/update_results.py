"""Copy the study's sweep reports into docs/ and refill the generated sections of
docs/RESULTS.md: ``python scripts/update_results.py [--sweeps outputs/sweeps]``. The demo's two
reports are copied (docs/demo/, docs/demo_toy/) and linked from the page, not embedded.

The hand-written parts of the page (setup, commands, discussion) stay as they are.
"""

import argparse
import shutil
from pathlib import Path

from posenc.analysis.markdown import embed_report, fill_section
from posenc.analysis.portable import portable

ROOT = Path(__file__).resolve().parents[1]
STUDIES = (
    "compare",
    "compare_long",
    "extrapolation",
    "encoder_forms",
    "encoder_forms_toy",
    "demo",
    "demo_toy",
    "compare17",
    "extrapolation17",
    "extrapolation17_rope",
)
#: copied into docs/ and linked from the page, not embedded
LINKED = {"demo", "demo_toy", "compare17", "extrapolation17", "extrapolation17_rope"}


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
    args = parser.parse_args()
    docs = ROOT / "docs"
    results = docs / "RESULTS.md"
    page = results.read_text()
    for name in STUDIES:
        report_dir = args.sweeps / name / "report"
        if not (report_dir / "report.md").exists():
            print(f"{name}: no report in {report_dir} (run scripts/report.py on the sweep); kept")
            continue
        copy_report(report_dir, docs / name, (ROOT, args.sweeps.resolve().parents[1]))
        print(f"{name}: copied {report_dir} to docs/{name}")
        if name in LINKED:
            continue
        report = (docs / name / "report.md").read_text()
        page = fill_section(page, name, embed_report(report, name, ("Attention maps",)))
    bench = (docs / "bench" / "bench.md").read_text()
    page = fill_section(page, "bench", embed_report(bench, "bench"))
    results.write_text(page)


if __name__ == "__main__":
    main()
