"""The README stays true: its encodings table is the one the code generates."""

from conftest import ROOT

from posenc.analysis.pe_table import encodings_table, with_table


def test_the_readme_encodings_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    expected = with_table(readme, encodings_table(ROOT / "configs" / "pe"))
    assert readme == expected, "run: python scripts/pe_table.py --write"


def test_every_encoding_states_where_it_acts():
    table = encodings_table(ROOT / "configs" / "pe")
    assert "nowhere" in table  # nonepe
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[2] and cells[3], line
