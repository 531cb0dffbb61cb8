"""Generated sections of hand-written pages: filled between their markers, reports embedded."""

import pytest

from posenc.analysis.markdown import embed_report, fill_section


def test_a_section_is_replaced_between_its_markers_and_nothing_else_changes():
    page = "intro\n<!-- table -->\nold\n<!-- /table -->\noutro\n"
    filled = fill_section(page, "table", "new\n")
    assert filled == "intro\n<!-- table -->\nnew\n<!-- /table -->\noutro\n"


def test_a_missing_section_names_the_markers_to_add():
    with pytest.raises(ValueError, match=r"no section 'bench'.*<!-- bench -->"):
        fill_section("no markers here", "bench", "x")


REPORT = """# Sweep report: compare

## 1. Scores

![scores](scores.png) and [the csv](report.csv), [a site](https://example.org)

### test

## 7. Attention maps

![attention](attention_rope.png)
"""


def test_an_embedded_report_moves_down_a_level_and_points_into_its_folder():
    embedded = embed_report(REPORT, "compare", link_only=("Attention maps",))
    assert "# Sweep report" not in embedded
    assert "### 1. Scores" in embedded and "#### test" in embedded
    assert "![scores](compare/scores.png)" in embedded
    assert "[the csv](compare/report.csv)" in embedded
    assert "[a site](https://example.org)" in embedded
    assert "attention_rope.png" not in embedded
    assert "[compare/report.md](compare/report.md#7-attention-maps)" in embedded
