"""An encoding with options is read from a sweep's overrides as Hydra reads them and named the
same way by the report and the benchmark, so that a benchmark's measurement of a variant is
found by the report's rows of it (and a variant the benchmark did not measure says so)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from posenc.analysis.report.benchtime import add_bench_curves, bench_time
from posenc.analysis.report.runs import Run, group_runs
from posenc.config.variants import parse_variant, split_labels, variant_label
from posenc.model.factory import build_named_model


def test_a_variant_is_read_as_a_sweep_overrides_it():
    assert parse_variant("pe=alibi pe.dape=true") == ("alibi", {"pe.dape": True})
    assert parse_variant("sinpe pe.augment_range=100 pe.augment=shift") == (
        "sinpe",
        {"pe.augment": "shift", "pe.augment_range": 100},  # sorted, as the report orders keys
    )
    assert parse_variant("rope pe.off_layers=[0]") == ("rope", {"pe.off_layers": [0]})
    assert parse_variant("rope") == ("rope", {})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "begin with the encoding"),
        ("no_such_pe", "unknown encoding 'no_such_pe'"),
        ("rope pe.no_such_key=1", "have pe.no_such_key"),
        ("rope model.d_model=8", "is not pe.KEY=VALUE"),
        ("rope pe.base=10,20", "is not pe.KEY=VALUE"),  # a sweep, not one variant
        ("rope pe.base=[", "rope pe.base=["),
    ],
)
def test_a_bad_variant_is_refused_in_one_line(text, problem):
    with pytest.raises(ValueError, match="variant") as error:
        parse_variant(text)
    assert problem in str(error.value) and "\n" not in str(error.value)


def test_a_variant_builds_its_options_into_the_model():
    plain = build_named_model("alibi", "tiny", 50)
    with_mlp = build_named_model("alibi", "tiny", 50, options={"pe.dape": True})
    assert sum(p.numel() for p in with_mlp.parameters()) > sum(
        p.numel() for p in plain.parameters()
    )


def test_the_benchmark_names_a_variant_as_the_report_labels_its_runs():
    default = {"pe.name": "alibi", "pe.dape": None, "seed": 0}
    runs = [
        Run("plain", Path("plain"), default),
        Run("dape", Path("dape"), {**default, "pe.dape": True}),
        Run("rope", Path("rope"), {"pe.name": "rope", "seed": 0}),
    ]
    labels = [group.label for group in group_runs(runs)]
    assert (
        labels[1] == variant_label(*parse_variant("alibi pe.dape=true")) == "alibi (pe.dape=True)"
    )


def test_a_variant_has_its_own_benchmark_time_else_its_encodings_marked_so():
    table = {"alibi": 0.1, "alibi (pe.dape=True)": 0.12}
    assert bench_time(table, "alibi (pe.dape=True)", "alibi") == (0.12, True)
    assert bench_time(table, "alibi", "alibi") == (0.1, True)
    assert bench_time(table, "alibi (pe.encoder_bias=symmetric)", "alibi") == (0.1, False)
    assert bench_time(table, "rope", "rope") == (None, True)

    default = {"pe.name": "alibi", "pe.dape": None, "pe.encoder_bias": "split", "seed": 0}
    runs = [
        Run("plain", Path("plain"), default),
        Run("dape", Path("dape"), {**default, "pe.dape": True}),
        Run("symmetric", Path("symmetric"), {**default, "pe.encoder_bias": "symmetric"}),
        Run("rope", Path("rope"), {"pe.name": "rope", "seed": 0}),
    ]
    for run in runs:
        run.curves["steps"] = (np.array([100.0, 200.0]), np.array([5.0, 4.0]))
    group_runs(runs)
    missing, borrowed = add_bench_curves(runs, table)
    assert (missing, borrowed) == (["rope"], ["alibi (pe.encoder_bias=symmetric)"])
    np.testing.assert_allclose(runs[1].curves["bench"][0], [12.0, 24.0])  # its own step
    np.testing.assert_allclose(runs[2].curves["bench"][0], [10.0, 20.0])  # alibi's


def test_a_list_of_labels_splits_only_between_labels():
    two_settings = variant_label("nonepe", {"pe.temperature": "llama4", "pe.floor": 20})
    text = f"rope,{two_settings}, alibi (pe.dape=True),"
    assert split_labels(text) == ["rope", two_settings, "alibi (pe.dape=True)"]
