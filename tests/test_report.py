"""The sweep report, specified on a real smoke sweep: two encodings (nonepe with seeds 0 and 1,
rope with seed 0) trained and scored by ``posenc.job.run``, a run that failed, and an unfinished
one (its config and the first points of its curve only)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, SMOKE, compose
from omegaconf import OmegaConf

from posenc.analysis.report.benchtime import add_bench_curves, read_bench
from posenc.analysis.report.build import build_report, main, scores_summary, shown
from posenc.analysis.report.curves import (
    kendall_tau,
    means_at_equal_steps,
    rankings_at_last_validations,
    swaps_against_noise,
)
from posenc.analysis.report.findings import ONE_SEED, UNINFORMATIVE, VERDICTS
from posenc.analysis.report.render import SECTIONS, Table, slug
from posenc.analysis.report.runs import DONE as SCORED
from posenc.analysis.report.runs import (
    ReportError,
    Run,
    group_runs,
    load_run,
    read_curves,
    reference_of,
)
from posenc.analysis.report.sections_by_encoding import setup_groups
from posenc.analysis.report.sections_by_split import SEEDS_COLUMN
from posenc.analysis.report.stats import bucket_position, length_limits, mean_std
from posenc.config import LENGTH_LIMITS, reference_encoding
from posenc.evaluation.metrics import corpus_scores
from posenc.job import run
from posenc.runtime.hparams import EXPERIMENT_DIR
from posenc.runtime.sinks import CsvSink
from posenc.runtime.tblog import RunLogger

SHORT = (
    *SMOKE,
    "eval.max_sentences=4",
    "trainer.max_steps=4",
    "trainer.valid_every=2",
    "+data.extra_tests.long={min_len: 13, max_len: 24, size: 8}",
    "eval.splits=[test,long]",
    "threads=1",  # tiny models: one thread is ~5x faster on a busy 2-core machine
)
DONE = {"pe=nonepe": ("nonepe", 0), "pe=nonepe,seed=1": ("nonepe", 1), "pe=rope": ("rope", 0)}
FAILED, UNFINISHED = "model.n_heads=3,pe=alibi", "pe=rope,seed=2"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A sweep directory laid out as a Hydra multirun, with done, failed and unfinished runs."""
    root = tmp_path_factory.mktemp("sweep")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSENC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for name, (pe, seed) in DONE.items():
            run(compose(*SHORT, f"pe={pe}", f"seed={seed}"), root / name)
        # a sweep's job records its failure in failed.json and the sweep goes on
        run(compose(*SHORT, "pe=alibi", "model.n_heads=3"), root / FAILED, multirun=True)
    torch.set_num_threads(threads)  # run() set it for this process; leave other tests alone
    unfinished = root / UNFINISHED
    unfinished.mkdir()
    config = OmegaConf.load(root / "pe=rope" / "config.yaml")
    config.seed = 2
    OmegaConf.save(config, unfinished / "config.yaml")
    logger = RunLogger(unfinished / "tb")
    logger.scalars(2, {"valid/loss": 5.9})
    logger.against_time("valid_loss", 5.9, 0.5)
    logger.close()
    (root / "pe=rope" / ".hydra").mkdir(exist_ok=True)  # Hydra's copy must not count as a run
    shutil.copy(root / "pe=rope" / "config.yaml", root / "pe=rope" / ".hydra" / "config.yaml")
    return root


@pytest.fixture(scope="module")
def report(sweep) -> tuple[Path, str, list[dict[str, str]]]:
    """The report built through the command-line entry point: (out dir, markdown, CSV rows)."""
    out = sweep / "out"
    main([str(sweep), "--out", str(out), "--bootstrap", "100"])
    with open(out / "report.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return out, (out / "report.md").read_text(encoding="utf-8"), rows


def metrics_of(sweep: Path, name: str) -> dict:
    return json.loads((sweep / name / "metrics.json").read_text())


def section(markdown: str, number: int) -> str:
    """The text of section ``number`` (1-8) of the report."""
    start = markdown.index(f"\n## {SECTIONS[number - 1]}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end > 0 else None]


def table_row(markdown: str, first_cell: str) -> list[str]:
    """The cells of the first markdown table row whose first cell is ``first_cell``."""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starts with {first_cell!r}")


def csv_value(rows, **match) -> str:
    found = [r["value"] for r in rows if all(r[k] == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_the_report_has_every_section(report):
    _, markdown, _ = report
    for title in ("Reading", *SECTIONS):
        assert f"\n## {title}\n" in markdown
    assert markdown.index("## Reading") < markdown.index(f"## {SECTIONS[0]}")


def test_the_reading_is_written_from_the_significance_rows(report):
    out, markdown, rows = report
    text = (out / "reading.txt").read_text().strip()
    assert text in markdown and text.startswith("On `test`, ") and "How far to trust" in text
    # tiny runs translate nothing yet: BLEU at the noise floor ranks nothing
    assert "below the noise floor of 2: no encoding is ranked on this split" in text
    verdicts = {r["value"] for r in rows if r["metric"] == "verdict"}
    assert verdicts == {UNINFORMATIVE}
    for split in ("test", "long"):
        assert markdown.count(f"\n### {split}\n") == 3  # scores, significance, buckets


def test_every_run_is_listed_with_its_status_and_the_hydra_copy_is_not(report, sweep):
    _, markdown, rows = report
    for name, (pe, seed) in DONE.items():
        cells = table_row(markdown, f"`{name}`")
        bleu = metrics_of(sweep, name)["splits"]["test"]["bleu"]
        assert cells[1:4] == [pe, str(seed), "done"]
        assert cells[7] == f"{bleu:.2f}"
    failure = json.loads((sweep / FAILED / "failed.json").read_text())
    cells = table_row(markdown, f"`{FAILED}`")
    assert cells[3] == "failed" and failure["message"] in cells[-1] and "divisible" in cells[-1]
    cells = table_row(markdown, f"`{UNFINISHED}`")
    assert cells[3] == "unfinished" and "step 2" in cells[-1]
    assert "5 run(s): 3 done, 1 failed, 1 unfinished." in markdown
    assert ".hydra" not in markdown
    assert csv_value(rows, section="runs", run=FAILED, metric="status") == "failed"


def test_every_run_records_the_code_it_ran_and_the_report_states_it(report, sweep):
    code = json.loads((sweep / "pe=rope" / "train_summary.json").read_text())["code"]
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert code["commit"] == head and isinstance(code["dirty"], bool)
    assert code["torch"] == torch.__version__
    _, markdown, _ = report
    line = next(line for line in markdown.splitlines() if line.startswith("Code: "))
    assert f"commit {head[:7]}" in line and "(3 run(s))" in line
    assert "not recorded (2 run(s)" in line  # the failed and the unfinished run


def test_every_run_records_its_hardware_and_the_report_states_it(report, sweep):
    """The same code and seed round differently on another processor, so a run says where it
    computed."""
    machine = json.loads((sweep / "pe=rope" / "train_summary.json").read_text())["machine"]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert machine["cpu"] and machine["gpu"] == gpu
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    _, markdown, _ = report
    line = next(line for line in markdown.splitlines() if line.startswith("Hardware: "))
    where = " + ".join(filter(None, [machine["cpu"], machine["cpu_capability"], gpu]))
    assert f"{where} (3 run(s))" in line
    assert "not recorded (2 run(s))" in line


def test_score_tables_match_the_runs_metrics(report, sweep):
    _, markdown, rows = report
    rope = metrics_of(sweep, "pe=rope")["splits"]
    nonepe = [metrics_of(sweep, n)["splits"]["test"] for n in ("pe=nonepe", "pe=nonepe,seed=1")]
    scores = section(markdown, 3)
    cells = table_row(scores, "rope")  # the first row is the test split's
    assert cells[1:3] == ["0", "4"]  # seeds: the training seeds of the row's runs
    assert cells[3] == f"{rope['test']['bleu']:.2f}" and cells[6] == f"{rope['test']['loss']:.4f}"
    losses = [m["loss"] for m in nonepe]
    assert table_row(scores, "nonepe")[6] == (
        f"{np.mean(losses):.4f} ± {np.std(losses, ddof=1):.4f}"
    )
    for split in ("test", "long"):
        for metric in ("bleu", "chrf", "loss"):
            value = csv_value(rows, section="scores", split=split, run="pe=rope", metric=metric)
            assert float(value) == rope[split][metric]
    mean = csv_value(rows, section="scores", split="test", encoding="nonepe", metric="loss_mean")
    assert float(mean) == pytest.approx(np.mean(losses))
    assert "BERTScore null: BERTScore is off" in markdown
    assert rope["test"]["bleu_signature"] in markdown


def test_figures_exist(report):
    out, markdown, _ = report
    names = [
        "valid_loss_vs_steps.png",
        "valid_loss_vs_time.png",
        "scores_test.png",
        "scores_long.png",
        "buckets_test.png",
        "buckets_long.png",
    ]
    if (Path(out).parent / "pe=rope" / "attention.png").exists():
        names += ["attention_nonepe.png", "attention_rope.png"]
    else:
        assert "No attention map" in markdown
    for name in names:
        assert (out / name).stat().st_size > 1000, name
        assert f"]({name})" in markdown


def test_cost_is_relative_to_nonepe(report, sweep):
    _, _, rows = report
    speeds = [metrics_of(sweep, n)["train"]["train_tokens_per_s"] for n in DONE]
    ratio = csv_value(rows, section="cost", encoding="rope", metric="train_tokens_per_s_vs_nonepe")
    assert float(ratio) == pytest.approx(speeds[2] / np.mean(speeds[:2]))
    assert (
        float(
            csv_value(
                rows, section="cost", encoding="nonepe", metric="train_tokens_per_s_vs_nonepe"
            )
        )
        == 1.0
    )


def test_the_unfinished_run_adds_its_curve_so_far(report):
    _, _, rows = report
    n = csv_value(rows, section="curves", encoding="rope", metric="best_valid_loss_n")
    assert float(n) == 2  # rope seed 0 (done) and seed 2 (unfinished)


def test_the_training_length_limit_is_named(report):
    _, markdown, _ = report
    assert "`data.max_len` = 12 symbols" in markdown


def test_significance_judges_each_system_against_the_best_by_the_decision_rule(sweep, tmp_path):
    """With real translations: nonepe (seeds 0, 1) perfect; rope half garbage, on seed 0 (the
    odd sentences) and on a copy as seed 1 (the even ones), and a third system with seed 0 only.
    Each is judged against nonepe over its own seeds, in BLEU points with an interval."""
    copy = tmp_path / "sweep"
    names = {**DONE, "pe=rope,seed=1": ("rope", 1), "pe=sinpe": ("sinpe", 0)}
    for name, (pe, seed) in names.items():
        source = name if name in DONE else "pe=rope"
        shutil.copytree(sweep / source, copy / name, ignore=shutil.ignore_patterns("checkpoints"))
        config = OmegaConf.load(copy / name / "config.yaml")
        config.seed, config.pe.name = seed, pe
        OmegaConf.save(config, copy / name / "config.yaml")
        refs = (copy / name / "references.test.txt").read_text().splitlines()
        hyps = [r if pe == "nonepe" or (i + seed) % 2 else "x y" for i, r in enumerate(refs)]
        (copy / name / "hypotheses.test.txt").write_text("\n".join(hyps) + "\n")
        metrics = metrics_of(copy, name)
        metrics["splits"]["test"].update(corpus_scores(hyps, refs))
        (copy / name / "metrics.json").write_text(json.dumps(metrics))
    build_report(copy, samples=200)
    markdown = (copy / "report" / "report.md").read_text()
    scores = {name: metrics_of(copy, name)["splits"]["test"]["bleu"] for name in names}
    rope = table_row(section(markdown, 4), "rope")
    assert rope[1] == "0, 1"
    expected = 100.0 - (scores["pe=rope"] + scores["pe=rope,seed=1"]) / 2
    assert rope[3].startswith(f"{expected:+.2f} [")  # the baseline's lead, with its interval
    assert 0 < float(rope[4]) <= 1 and rope[-1] in VERDICTS
    single = table_row(section(markdown, 4), "sinpe")
    assert single[1] == "0" and single[-1] == ONE_SEED and single[4] == "—"
    nonepe = table_row(section(markdown, 4), "nonepe")
    assert nonepe[1] == "0, 1" and nonepe[3] == "baseline" and nonepe[2] == "100.00"
    assert table_row(section(markdown, 3), "nonepe")[1] == "0, 1"  # the same seeds column
    assert SEEDS_COLUMN in section(markdown, 3) and SEEDS_COLUMN in section(markdown, 4)
    assert "one family" in section(markdown, 4)


def test_user_errors_are_one_line(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit, match=r"error: .* is not a directory"):
        main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="no run directory"):
        main([str(tmp_path)])
    with pytest.raises(SystemExit, match=r"split 'nope' is in no metrics.json; found: test, long"):
        main([str(sweep), "--out", str(tmp_path / "out"), "--split", "nope"])


def test_helpers():
    assert mean_std([1.0, None, 3.0]) == (2.0, pytest.approx(2**0.5), 2)
    assert mean_std([None]) is None
    edges = [(0, 10), (10, 20), (20, 40)]
    assert bucket_position(15, edges) == pytest.approx(1.0)
    assert bucket_position(20, edges) == pytest.approx(1.5)
    assert bucket_position(40, edges) is None
    assert slug("rope (model.d_model=32)") == "rope_model.d_model=32"


def test_the_demo_prints_the_focus_split_score_table():
    """The summary is built from the score table's data, never parsed back from the markdown."""
    assert scores_summary(Table(["system", "BLEU"], [["rope", "1.5"]])) == (
        "system | BLEU\n--- | ---\nrope | 1.5"
    )
    assert scores_summary(Table(["system", "BLEU"], [["a|b", 0.5]])).endswith("a\\|b | 0.5")
    assert scores_summary(None) == ""  # no finished run yet


def test_the_command_line_prints_the_focus_scores_the_reading_and_the_path(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    main([str(sweep), "--out", str(out), "--bootstrap", "10", "--split", "long"])
    printed = capsys.readouterr().out.rstrip("\n").split("\n")
    markdown = (out / "report.md").read_text()
    scores = section(markdown, 3).split("\n### long\n", 1)[1]
    table = scores.strip().split("\n\n")[0].splitlines()
    assert printed[: len(table)] == table and table[0].startswith("system | seeds")
    assert printed[len(table)] == ""
    assert printed[len(table) + 1] == (out / "reading.txt").read_text().strip()
    assert printed[-1] == f"report: {out / 'report.md'}"


def test_the_shared_setup_is_read_from_the_runs_one_line_per_config_group(report, sweep):
    """It is the last section: a wall of settings comes after the figures, not before."""
    _, markdown, _ = report
    assert markdown.index(f"## {SECTIONS[7]}") > markdown.index(f"## {SECTIONS[1]}")
    setup = section(markdown, 8).split("<details>", 1)[0].split("\n", 2)[2]
    lines = {line.split("**")[1]: line for line in setup.strip().splitlines()}
    config = OmegaConf.load(sweep / "pe=rope" / "config.yaml")
    assert f"d_model={config.model.d_model}" in lines["model"]
    assert "max_steps=4" in lines["trainer"] and "valid_every=2" in lines["trainer"]
    assert "max_len=12" in lines["data"] and f"reference_pe={config.reference_pe}" in lines["run"]
    assert "pe" not in lines  # the encodings' settings are listed per encoding
    top_level = lines["run"].split(": ", 1)[1].split(", ")
    assert not any(item.startswith("seed=") for item in top_level)  # it varies
    assert "cache_dir" not in section(markdown, 1)  # posenc.config.UNREPORTED_KEYS
    assert "<summary>All shared settings</summary>" in markdown


def test_setup_groups_take_the_first_dotted_component():
    shared = {"device": "cpu", "model.d_model": 8, "pe.name": "rope", "data.clean.max_words": 80}
    assert setup_groups(shared) == {
        "run": ["device=cpu"],
        "model": ["d_model=8"],
        "data": ["clean.max_words=80"],
    }


def test_curves_of_runs_logged_before_the_seconds_group_was_renamed_are_still_read(tmp_path):
    """Older runs hold their seconds curves as ``time/``; the report reads either name."""
    for prefix, name in (("time/", "old"), ("vs_train_seconds/", "new")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        rows = [
            "tag,step,value,wall_time",
            f"{prefix}valid_loss,3,5.0,0",
            f"{prefix}valid_loss,7,4.0,0",
        ]
        (run_dir / "scalars.csv").write_text("\n".join(rows) + "\n")
        x, y = read_curves(run_dir)["time"]
        assert x.tolist() == [3.0, 7.0] and y.tolist() == [5.0, 4.0]


def test_a_variant_is_labelled_by_where_it_leaves_the_encodings_default():
    """A run saved before a setting existed (no key) and one with its null default are the same
    system, named by the encoding alone; a variant names only the setting it changes."""
    default = {"pe.name": "rope", "pe.rotary_fraction": 1.0, "seed": 0}
    runs = [
        Run("old", Path("old"), default),
        Run("new", Path("new"), {**default, "pe.rope_proportion": None, "seed": 1}),
        Run("half", Path("half"), {**default, "pe.rotary_fraction": 0.5}),
        Run("p", Path("p"), {**default, "pe.rope_proportion": 0.75}),
    ]
    labels = [group.label for group in group_runs(runs)]
    assert labels == ["rope", "rope (pe.rotary_fraction=0.5)", "rope (pe.rope_proportion=0.75)"]


def test_where_a_machine_keeps_the_data_makes_no_variant():
    """The same data read from another folder (another checkout, another spelling of the path)
    is the same system."""
    runs = [
        Run("here", Path("here"), {"pe.name": "rope", "data.dir": "/srv/checkout/../data"}),
        Run("there", Path("there"), {"pe.name": "rope", "data.dir": "../data", "seed": 1}),
    ]
    assert [group.label for group in group_runs(runs)] == ["rope"]


def test_length_limits_are_the_declared_keys_with_finite_values():
    config = {
        "trainer.max_positions": 128,
        "trainer.max_source_tokens": 20,
        "data.clean.max_words": None,  # not set: no limit
        "data.max_src_tokens_train": 50,  # not declared in posenc.config.LENGTH_LIMITS
        "trainer.max_steps": 4,
    }
    runs = [Run("a", Path("a"), config), Run("b", Path("b"), dict(config, seed=1))]
    assert length_limits(runs) == [
        ("trainer.max_positions", 128.0, LENGTH_LIMITS["trainer.max_positions"]),
        ("trainer.max_source_tokens", 20.0, LENGTH_LIMITS["trainer.max_source_tokens"]),
    ]


def test_the_reference_encoding_comes_from_the_runs_configs():
    def runs(*references):
        return [Run(str(i), Path(str(i)), {"reference_pe": r}) for i, r in enumerate(references)]

    assert reference_of(runs("rope", "rope")) == "rope"
    assert reference_of(runs("rope", "nonepe"), override="sinpe") == "sinpe"
    with pytest.raises(
        ReportError, match=r"disagree on reference_pe \(nonepe, rope\); .*--reference"
    ):
        reference_of(runs("rope", "nonepe"))
    old = [Run("old", Path("old"), {"pe.name": "rope"})]  # saved before reference_pe existed
    assert reference_of(old) == reference_encoding() == "nonepe"


def test_cost_is_relative_to_the_configured_or_requested_reference(sweep, tmp_path):
    copy = tmp_path / "sweep"
    for name in DONE:
        shutil.copytree(sweep / name, copy / name, ignore=shutil.ignore_patterns("checkpoints"))
        config = OmegaConf.load(copy / name / "config.yaml")
        config.reference_pe = "rope"
        OmegaConf.save(config, copy / name / "config.yaml")
    speeds = [metrics_of(sweep, n)["train"]["train_tokens_per_s"] for n in DONE]
    build_report(copy, samples=10)
    cost = section((copy / "report" / "report.md").read_text(), 6)
    assert "train tokens/s | × rope" in cost and "× nonepe" not in cost
    with open(copy / "report" / "report.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ratio = csv_value(rows, section="cost", encoding="nonepe", metric="train_tokens_per_s_vs_rope")
    assert float(ratio) == pytest.approx(np.mean(speeds[:2]) / speeds[2])

    config = OmegaConf.load(copy / "pe=rope" / "config.yaml")
    config.reference_pe = "nonepe"
    OmegaConf.save(config, copy / "pe=rope" / "config.yaml")
    with pytest.raises(SystemExit, match=r"^error: the runs disagree on reference_pe"):
        main([str(copy), "--bootstrap", "10"])
    main([str(copy), "--bootstrap", "10", "--reference", "rope"])
    assert "× rope" in section((copy / "report" / "report.md").read_text(), 6)


def test_the_report_writes_the_sweeps_hparams_summary(report, sweep):
    """The runs were trained outside a Hydra multirun, so no job wrote the sweep's summary:
    the report does, and TensorBoard's HParams tab then shows the encodings as differing."""
    from test_hparams import TensorBoardView, python

    _, markdown, _ = report
    (summary,) = [p for p in sweep.iterdir() if EXPERIMENT_DIR.fullmatch(p.name)]
    assert f"`{summary.name}/`" in markdown
    infos = {i.name: i for i in TensorBoardView(sweep).experiment().hparam_infos}
    assert infos["pe.name"].differs and infos["seed"].differs
    assert [python(v) for v in infos["pe.name"].domain_discrete.values] == ["nonepe", "rope"]


def test_the_ranking_settles_when_the_last_two_shared_validations_agree():
    steps = np.array([200.0, 400.0, 600.0])
    curves = {
        "a": [(steps, np.array([6.0, 5.0, 4.0])), (steps, np.array([6.2, 5.2, 4.2]))],
        "b": [(steps, np.array([5.0, 5.1, 4.5]))],
        "c": [(steps[:2], np.array([7.0, 5.5]))],  # stopped at 400: 600 is not shared
    }
    (first_step, first), (last_step, last) = rankings_at_last_validations(curves)
    assert (first_step, first) == (200, ["b", "a", "c"])
    assert (last_step, last) == (400, ["a", "b", "c"])
    assert kendall_tau(first, last) == pytest.approx(1 / 3)
    assert kendall_tau(last, last) == 1.0
    assert rankings_at_last_validations({"a": curves["a"]}) == []


def test_runs_stopped_at_different_steps_are_compared_at_the_steps_they_share():
    """Time budgets end runs at different steps: the table sets them side by side at the last
    steps every run logged, then at the last step each smaller set of systems reached."""
    steps = np.arange(1, 7) * 100.0
    curves = {
        "a": [(steps, np.full(6, 4.0)), (steps[:5], np.full(5, 5.0))],  # seed 2 stopped at 500
        "b": [(steps[:4], np.full(4, 3.0))],
        "c": [(steps[:2], np.full(2, 6.0))],
        "d": [(steps, np.full(6, 2.0))],
    }
    shown, means = means_at_equal_steps(curves, columns=2)
    assert shown == [100, 200, 400, 500]  # every run: 100, 200; three systems: 400; two: 500
    assert means["a"] == [4.5, 4.5, 4.5, 4.5] and means["c"] == [6.0, 6.0, None, None]
    assert means["b"] == [3.0, 3.0, 3.0, None] and means["d"] == [2.0] * 4


def test_a_swap_is_weighed_against_the_seed_noise_of_its_difference():
    steps = np.array([200.0, 400.0])
    curves = {
        "a": [(steps, np.array([5.0, 4.50])), (steps, np.array([5.0, 4.70]))],  # mean 4.6
        "b": [(steps, np.array([4.9, 4.62])), (steps, np.array([4.9, 4.64]))],  # mean 4.63
        "c": [(steps, np.array([6.0, 5.00]))],
    }
    (_, first), (step, second) = rankings_at_last_validations(curves)
    assert (first, second) == (["b", "a", "c"], ["a", "b", "c"])
    [(better, worse, gap, noise)] = swaps_against_noise(curves, first, second, step)
    assert (better, worse) == ("a", "b") and gap == pytest.approx(0.03)
    spread = np.sqrt(np.var([4.5, 4.7], ddof=1) / 2 + np.var([4.62, 4.64], ddof=1) / 2)
    assert noise == pytest.approx(spread) and gap < 2 * noise  # a tie the seeds cannot order
    one_seed = {name: runs[:1] for name, runs in curves.items()}
    assert swaps_against_noise(one_seed, ["b", "a", "c"], ["a", "b", "c"], 400)[0][3] is None


def test_curves_are_also_drawn_against_benchmark_time(sweep, tmp_path):
    """Runs that shared the machine measure their neighbours: with a quiet benchmark's JSON the
    report draws each run's curves against its steps times its encoding's benchmarked step."""
    bench = tmp_path / "bench.json"
    step = {"16": {"median_s": 0.25}, "32": {"median_s": 0.75}}  # a mean of 0.5 s a step
    bench.write_text(
        json.dumps(
            {
                "settings": {"model": "tiny", "tokens": 512, "lengths": [16, 32]},
                "summary": {"train": {"nonepe": step}},
            }
        )
    )
    runs = [load_run(sweep / name, sweep) for name in DONE]
    group_runs(runs)  # the labels a variant's own measurement is found by
    assert add_bench_curves(runs, read_bench(bench).train) == (["rope"], [])
    nonepe = next(r for r in runs if r.pe == "nonepe")
    np.testing.assert_allclose(nonepe.curves["bench"][0], nonepe.curves["steps"][0] * 0.5)
    assert "bench" not in next(r for r in runs if r.pe == "rope").curves

    out = tmp_path / "report"
    build_report(sweep, out, samples=10, bench=bench)
    markdown = (out / "report.md").read_text()
    assert (out / "valid_loss_vs_bench.png").exists()
    assert "model=tiny, 512 tokens a batch, lengths 16, 32" in markdown
    assert "not measured there, so not drawn: alibi, rope" in markdown  # the failed run too
    bench.write_text(
        json.dumps(
            {
                "settings": {"model": "tiny", "tokens": 512, "lengths": [16, 32]},
                "summary": {
                    "train": {"nonepe": step, "rope": {"16": {"median_s": 0.6}}},
                    "decode": {
                        "nonepe": {"16": {"median_s": 0.1}},
                        "rope": {"16": {"median_s": 0.3}},
                    },
                },
            }
        )
    )
    build_report(sweep, out, samples=10, bench=bench)
    markdown = (out / "report.md").read_text()
    assert "Cost in the quiet benchmark `bench.json`" in markdown
    steps = metrics_of(sweep, "pe=rope")["train"]["steps"]
    quiet = markdown.split("Cost in the quiet benchmark", 1)[1]
    assert table_row(quiet, "rope")[1:] == [
        "600.00",
        "1.20",
        "300.00",
        "3.00",
        f"{steps * 0.6:.0f}",
    ]
    with open(out / "report.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert float(
        csv_value(rows, encoding="rope", metric="bench_decode_vs_nonepe")
    ) == pytest.approx(3.0)
    bench.write_text('{"settings": {}}')
    with pytest.raises(SystemExit, match="bench.json: summary is missing"):
        main([str(sweep), "--out", str(tmp_path / "r2"), "--bench", str(bench)])


def test_a_run_archived_as_text_draws_the_same_curves_from_its_scalars_csv(tmp_path):
    """A run whose ``tb/`` is gone (archived as text) is read from ``scalars.csv``; a row cut
    short by a kill and rows of other tags are skipped."""
    logged, archived = tmp_path / "logged", tmp_path / "archived"
    archived.mkdir()
    logger = RunLogger(logged / "tb", sinks=[CsvSink(archived / "scalars.csv")])
    for step, (train, valid) in enumerate([(9.5, 8.25), (7.125, 6.5), (5.0625, 4.75)], start=1):
        logger.scalars(10 * step, {"train/loss": train, "valid/loss": valid, "lr": 0.1})
        logger.against_time("valid_loss", valid, 3.5 * step)
    logger.close()
    with open(archived / "scalars.csv", "a", encoding="utf-8") as handle:
        handle.write("valid/loss,40,4.5\n")  # killed mid-row
    from_events, from_csv = read_curves(logged), read_curves(archived)
    assert sorted(from_csv) == sorted(from_events) == ["steps", "time", "train_steps"]
    for name, (x, y) in from_events.items():
        np.testing.assert_array_equal(from_csv[name][0], x)
        np.testing.assert_array_equal(from_csv[name][1], y)
    assert list(from_csv["time"][0]) == [3.0, 7.0, 10.0]
    assert read_curves(tmp_path / "nothing") == {}


def test_bucket_tables_give_the_seeds_spread_beside_the_mean(report, sweep):
    """Extrapolation is read off the long buckets: each cell is the mean over seeds ± their
    standard deviation (the mean alone for one seed), and the CSV has both."""
    _, markdown, rows = report
    runs = [
        metrics_of(sweep, name)["splits"]["test"]["buckets"] for name in DONE if "nonepe" in name
    ]
    first = runs[0][0]
    losses = [next(b["loss"] for b in r if b["min"] == first["min"]) for r in runs]
    metric = f"loss[{first['min']},{first['max']})"
    assert float(
        csv_value(rows, section="buckets", split="test", encoding="nonepe", metric=metric + "_sd")
    ) == pytest.approx(np.std(losses, ddof=1))
    buckets = section(markdown, 5).split("### test", 1)[1]
    loss_table = buckets.split("Loss by source length", 1)[1]
    assert " ± " in table_row(loss_table, "nonepe")[1]
    assert " ± " not in table_row(loss_table, "rope")[1]


def test_a_run_not_yet_scored_by_the_named_evaluation_stays_in_its_encodings_group():
    """With ``--eval`` naming a beam-5 evaluation, the runs that have it carry its decoding
    settings and the one still without it carries training's (beam 1): the difference is no
    system of its own, while a decoding setting that differs between scored runs is one."""
    scored = {"pe.name": "rope", "eval.beam_size": 5}
    runs = [
        Run("a", Path("a"), {**scored, "seed": 0}, SCORED),
        Run("b", Path("b"), {**scored, "seed": 1}, SCORED),
        Run("c", Path("c"), {**scored, "eval.beam_size": 1, "seed": 2}),  # unfinished
    ]
    assert [group.label for group in group_runs(runs)] == ["rope"]
    runs[2].status = SCORED
    labels = [group.label for group in group_runs(runs)]
    assert labels == ["rope (eval.beam_size=5)", "rope (eval.beam_size=1)"]


def test_a_budget_that_ended_no_runs_training_sets_no_runs_apart():
    """Two GPU calls gave their runs different time limits, and every run stopped at its
    1,000 steps before either: the runs trained alike and are one system. A time limit that
    did end a run keeps it apart, as does a step limit that ended one."""
    budget = {"pe.name": "rope", "trainer.max_steps": 1000}
    runs = [
        Run("a", Path("a"), {**budget, "trainer.max_time": 250, "seed": 1}, SCORED),
        Run("b", Path("b"), {**budget, "trainer.max_time": 300, "seed": 2}, SCORED),
    ]
    for each in runs:
        each.train = {"steps": 1000, "train_seconds": 228.5, "stopped_early": False}
    assert [group.label for group in group_runs(runs)] == ["rope"]
    runs[0].train = {"steps": 930, "train_seconds": 250.1, "stopped_early": False}
    assert len(group_runs(runs)) == 2  # the 250 s limit ended seed 1 at step 930
    runs[0].train = {"steps": 1000, "train_seconds": 228.5, "stopped_early": False}
    runs[1].config["trainer.max_steps"] = 4000  # seed 2 stopped on its time at step 1,000
    runs[1].train = {"steps": 1000, "train_seconds": 300.2, "stopped_early": False}
    assert len(group_runs(runs)) == 2


def test_a_data_setting_older_runs_lack_reads_as_the_value_they_were_made_with():
    """Runs made before ``data.holdout_drops`` existed dropped shared sources only: a newer run
    that asks for that rule explicitly joins their group; one with the newer rule does not."""
    older = {"pe.name": "rope", "data.kind": "local"}
    runs = [
        Run("a", Path("a"), {**older, "seed": 0}, SCORED),
        Run("b", Path("b"), {**older, "data.holdout_drops": ["source"], "seed": 1}, SCORED),
    ]
    assert [group.label for group in group_runs(runs)] == ["rope"]
    runs[1].config["data.holdout_drops"] = ["source", "target"]
    labels = [group.label for group in group_runs(runs)]
    assert labels == [
        "rope (data.holdout_drops=['source'])",
        "rope (data.holdout_drops=['source', 'target'])",
    ]


def test_an_evaluation_setting_that_changes_no_score_never_makes_a_system():
    """A batch size of a neural metric (added after older runs were made, so they lack it)
    changes no number the report shows: runs that differ only in it are one system."""
    runs = [
        Run("a", Path("a"), {"pe.name": "rope", "seed": 0}, SCORED),
        Run("b", Path("b"), {"pe.name": "rope", "eval.comet.batch_size": 16, "seed": 1}, SCORED),
        Run("c", Path("c"), {"pe.name": "rope", "eval.bertscore.batch_size": 8, "seed": 2}, SCORED),
    ]
    assert [group.label for group in group_runs(runs)] == ["rope"]


def test_names_and_messages_from_the_runs_cannot_inject_markdown_html_or_formulas(sweep, tmp_path):
    """A run folder named to start a heading and carry a script, one named as a spreadsheet
    formula, and a failure message with a tag: the markdown shows them as text, the CSV as
    text."""
    copy = tmp_path / "sweep"
    heading = "pe=nonepe\n## Findings: alibi is best <script>alert(1)</script>"
    formula = "=HYPERLINK(1)"
    for name, source in ((heading, "pe=nonepe"), (formula, "pe=rope"), ("failed", FAILED)):
        shutil.copytree(sweep / source, copy / name, ignore=shutil.ignore_patterns("checkpoints"))
    failure = copy / "failed" / "failed.json"
    failure.write_text(json.dumps({"error": "E", "message": "<img src=x onerror=alert(2)>"}))
    build_report(copy, samples=50)
    markdown = (copy / "report" / "report.md").read_text()
    assert "\n## Findings" not in markdown
    assert "<script" not in markdown and "<img" not in markdown and "&lt;script>" in markdown
    with open(copy / "report" / "report.csv", encoding="utf-8") as handle:
        runs = {row["run"] for row in csv.DictReader(handle)}
    assert f"'{formula}" in runs and formula not in runs
    assert all(not r.startswith(("=", "+", "@")) for r in runs)


def test_scores_outside_their_range_mark_the_run_failed(sweep, tmp_path):
    copy = tmp_path / "sweep"
    shutil.copytree(
        sweep / "pe=rope", copy / "pe=rope", ignore=shutil.ignore_patterns("checkpoints")
    )
    metrics = metrics_of(copy, "pe=rope")
    metrics["splits"]["test"]["bleu"] = 1e308
    (copy / "pe=rope" / "metrics.json").write_text(json.dumps(metrics))
    run_ = load_run(copy / "pe=rope", copy)
    assert run_.status == "failed" and "splits.test.bleu is 1e+308, not a number in [0, 100]" in (
        run_.message
    )


def test_the_report_names_paths_as_a_reader_types_them(tmp_path, monkeypatch):
    """Relative to the working directory, or from ~, never this machine's layout where a
    relative path serves."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert shown(tmp_path / "work" / "outputs" / "sweeps" / "demo") == "outputs/sweeps/demo"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert shown(tmp_path / "home" / "runs") == "~/runs"
    assert shown(Path("/elsewhere/sweep")) == "/elsewhere/sweep"


def test_an_interrupted_report_leaves_the_previous_one_as_it_was(sweep, tmp_path, monkeypatch):
    """Once, Ctrl-C during a report left its new figures beside the old ``report.md`` while
    saying nothing half-written was kept: a report is written aside and moved in whole."""
    import posenc.analysis.report.build as build_module

    out = tmp_path / "report"
    build_report(sweep, out, samples=20)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert any(p.suffix == ".png" for p in before)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_module, "write_html", interrupted)  # the last file written
    with pytest.raises(KeyboardInterrupt):
        build_report(sweep, out, focus="test", samples=30)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.")]
