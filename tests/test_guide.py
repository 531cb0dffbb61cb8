"""The guide (docs/GUIDE.md) stays true: its encodings table and its map of the source tree are
the ones the code generates."""

import re

import pytest
from conftest import PE_NAMES, ROOT, SHARED_DATA, compose

from posenc.config import data as typed
from study.guide_sections import (
    MAX_SUMMARY,
    PHASES,
    encodings_table,
    layout_tree,
    summary,
    with_generated_sections,
)

SRC = ROOT / "src" / "posenc"


def test_the_guide_sections_match_the_code():
    readme = (ROOT / "docs" / "GUIDE.md").read_text()
    assert readme == with_generated_sections(readme, ROOT), (
        "run: python -m study guide-sections --write"
    )


def test_every_encoding_states_where_it_acts():
    table = encodings_table(ROOT / "configs" / "pe")
    assert "nowhere" in table  # nonepe
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[2] and cells[3], line


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_opens_with_a_short_summary_for_the_map(path):
    """The map shows each module's first sentence: it exists and fits two lines."""
    text = summary(path)
    assert text and len(text) <= MAX_SUMMARY, f"{path}: first sentence of {len(text)} chars"


def test_the_map_lists_every_module_in_its_own_package():
    tree = layout_tree(ROOT)
    for path in SRC.rglob("*.py"):
        if path.name != "__init__.py":
            assert f" {path.name} " in tree or tree.count(f" {path.name}\n")
    lines = tree.splitlines()
    translate = next(i for i, line in enumerate(lines) if line.startswith("  translate.py"))
    evaluation = next(i for i, line in enumerate(lines) if line.startswith("  evaluation/"))
    assert evaluation < translate  # a top-level module, after the package it follows
    start = next(i for i, line in enumerate(lines) if line.startswith("src/posenc/"))
    end = next(i for i, line in enumerate(lines) if line.startswith("study/"))
    tops = [line.split()[0] for line in lines[start:end] if re.match(r"  \S", line)]
    names = [top.removesuffix("/").removesuffix(".py") for top in tops]
    assert names == list(PHASES)  # every phase, in data-flow order
    study = lines[end:]
    for path in (ROOT / "study").rglob("*.py"):  # and the study beside it
        if path.name != "__init__.py":
            assert any(line.split()[0] == path.name for line in study if line.strip())


def test_the_gallery_shows_every_encoding_and_only_its_pictures():
    """docs/figures/pe/README.md draws each ``configs/pe`` encoding's picture (``python
    scripts/plot_pe.py pe=NAME --out docs/figures/pe``) and nothing else lies there unlinked."""
    gallery = ROOT / "docs" / "figures" / "pe"
    page = (gallery / "README.md").read_text(encoding="utf-8")
    pictures = sorted(p.stem for p in gallery.glob("*.png"))
    assert pictures == PE_NAMES
    assert sorted(re.findall(r"\]\((\w+)\.png\)", page)) == PE_NAMES
    assert sorted(p.name for p in gallery.iterdir()) == sorted(
        ["README.md", *(f"{n}.png" for n in PE_NAMES)]
    )


def test_every_picture_under_docs_is_shown_by_a_page():
    """A figure no page links is dead weight in every clone."""
    shown = set()
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s#]+)|src=\"([^\"#]+)\"", text):
            shown.add((page.parent / (target[0] or target[1])).resolve())
    pictures = {p.resolve() for p in (ROOT / "docs").rglob("*.png")}
    assert sorted(str(p.relative_to(ROOT)) for p in pictures - shown) == []


def test_the_documents_and_the_study_archive_stay_a_small_part_of_a_clone():
    """The study's runs are kept as one xz archive per sweep and figures as palette PNGs, so
    that a clone is mostly code: docs/ stays under 75 MB (44 MB in all were tracked on
    2026-11-27, 51.4 MB on 2026-11-28 with the added encodings' runs, 60.5 MB on 2026-11-29
    with the 25 depth-recipe runs, 4.5 MB; the studies declared next add about 8 MB; a
    checkpoint or an uncompressed sweep would add tens of MB)."""
    size = sum(p.stat().st_size for p in (ROOT / "docs").rglob("*") if p.is_file())
    assert size < 75_000_000


def test_the_guides_preset_row_lists_every_preset():
    """One set of facts: each ``configs/experiment`` preset is in the groups table."""
    row = next(
        line
        for line in (ROOT / "docs" / "GUIDE.md").read_text().splitlines()
        if line.startswith("| `experiment` |")
    )
    listed = set(re.findall(r"`(\w+)`", row.split("|")[2]))
    assert listed == {p.stem for p in (ROOT / "configs" / "experiment").glob("*.yaml")}


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs the local mix")
def test_the_guides_training_pair_counts_are_what_the_data_gives():
    """One set of facts: the counts the guide states are read from the data by the pipeline a
    run uses (cleaning, then the hold-out rule), under both rules it names."""
    from posenc.config.data import data_config
    from posenc.data.splits import training_stream
    from posenc.data.streams import Cleaner

    guide = (ROOT / "docs" / "GUIDE.md").read_text()
    for overrides, phrase in (
        ((), "({:,} pairs after cleaning and the default hold-out rule"),
        (("data.holdout_drops=[source]",), "; {:,} under the rule of runs made"),
    ):
        data = data_config(compose(*overrides).data)
        cleaner = Cleaner.of(data.clean)
        for pair in training_stream(typed.data_config(data)):
            cleaner.keeps(*pair)
        assert phrase.format(len(cleaner.distinct())) in " ".join(guide.split())
