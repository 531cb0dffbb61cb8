"""The headline (``scripts/headline.py``): each system against a baseline by split and depth,
every cell judged by the decision rule as one family, drawn as small multiples."""

from __future__ import annotations

import pytest
from conftest import scored_entry as entry

from posenc.analysis.headline import MAX_SYSTEMS, headline, headline_table, plot_headline
from posenc.analysis.report.findings import ONE_SEED


def sweep(tmp_path, depth: str, systems: dict[str, int], seeds=(0, 1, 2)) -> dict:
    """One split, ``test``, with each system's hypotheses wrong every ``n``-th sentence."""
    folder = tmp_path / depth
    folder.mkdir()
    return {
        "test": {
            name: [entry(folder, name, s, every) for s in seeds] for name, every in systems.items()
        }
    }


def test_each_system_is_set_against_the_baseline_at_every_depth(tmp_path):
    sweeps = {
        "1 layer": sweep(tmp_path, "one", {"nonepe": 2, "rope": 9}),
        "3 layers": sweep(tmp_path, "three", {"nonepe": 2, "rope": 9}, seeds=(0,)),
    }
    cells = headline(sweeps, ["rope", "absent"], "nonepe", samples=200)
    at = {(c.depth, c.system): c for c in cells}
    assert at["1 layer", "rope"].verdict() == "ahead"
    assert at["3 layers", "rope"].verdict() == ONE_SEED
    assert at["1 layer", "absent"].verdict() == "-"
    table = "\n".join(headline_table(cells, "bleu", "nonepe"))
    assert "| system | 1 layer, test | 3 layers, test |" in table
    assert "| rope | +" in table and " ahead |" in table
    assert plot_headline(cells, "bleu", "nonepe", tmp_path / "h.png").stat().st_size > 0


def test_a_figure_holds_at_most_eight_systems(tmp_path):
    sweeps = {"d": sweep(tmp_path, "d", {"nonepe": 2}, seeds=(0,))}
    cells = headline(sweeps, [f"s{i}" for i in range(MAX_SYSTEMS + 1)], "nonepe", samples=10)
    with pytest.raises(ValueError, match="draw at most 8 a figure"):
        plot_headline(cells, "bleu", "nonepe", tmp_path / "h.png")
