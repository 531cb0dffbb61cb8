"""Generated sections of hand-written pages: filled between their markers."""

import pytest

from posenc.analysis.markdown import fill_section


def test_a_section_is_replaced_between_its_markers_and_nothing_else_changes():
    page = "intro\n<!-- table -->\nold\n<!-- /table -->\noutro\n"
    filled = fill_section(page, "table", "new\n")
    assert filled == "intro\n<!-- table -->\nnew\n<!-- /table -->\noutro\n"


def test_a_missing_section_names_the_markers_to_add():
    with pytest.raises(ValueError, match=r"no section 'bench'.*<!-- bench -->"):
        fill_section("no markers here", "bench", "x")
