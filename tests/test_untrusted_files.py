"""Every file a run directory holds is untrusted input: on a shared filesystem anyone may have
written it. Each reader parses with limits and checks the types of what posenc writes; a bad
file is one line naming it, what is wrong and the fix, never a hang, a traceback or a wrong
number in a report. Specified on one real smoke run (``posenc.job.run``), copied and spoiled
one file at a time."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from conftest import SMOKE, compose
from omegaconf import OmegaConf

from posenc.analysis import plot_pe
from posenc.analysis.report.build import build_report
from posenc.analysis.report.render import SECTIONS
from posenc.analysis.report.runs import DONE, FAILED, load_run
from posenc.data import tokenizer as tokenizer_module
from posenc.data.corpus import DataError
from posenc.data.tokenizer import KEPT_FILE, META_FILE, load_tokenizer
from posenc.job import run
from posenc.runtime.rundir import RunDir
from posenc.runtime.untrusted import (
    UntrustedFileError,
    check_failure,
    check_metrics,
    check_summary,
    read_config,
    read_json,
)

TRAIN = (*SMOKE, "pe=nonepe", "trainer.max_steps=2", "trainer.valid_every=2", "threads=1")
#: nine lists of nine references each level: 9**9 strings when expanded
ALIAS_BOMB = (
    "pe: {name: nonepe}\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
)
#: strings that double at every level when resolved: 2**40 characters
INTERPOLATION_BOMB = "pe: {name: nonepe}\ns0: lol\n" + "".join(
    f"s{i}: ${{s{i - 1}}}${{s{i - 1}}}\n" for i in range(1, 41)
)
SAVED_FIX = "copy the run's whole tokenizer/ directory or retrain"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A real run directory, trained and evaluated (never changed: tests change copies)."""
    threads = torch.get_num_threads()
    run_dir = tmp_path_factory.mktemp("trained") / "pe=nonepe"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POSENC_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        run(compose(*TRAIN), run_dir)
    torch.set_num_threads(threads)
    return run_dir


def copy_run(trained: Path, target: Path) -> Path:
    """A copy of the trained run at ``target``."""
    shutil.copytree(trained, target)
    return target


def one_line(err: BaseException, *parts: str) -> str:
    """The message of ``err``, checked to be one line holding every one of ``parts``."""
    message = str(err)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, (part, message)
    return message


def refused_config(path: Path, text: str | bytes, **limits) -> str:
    """The message with which :func:`read_config` refuses ``text`` as ``path``."""
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    with pytest.raises(UntrustedFileError) as caught:
        read_config(path, **limits)
    return one_line(caught.value, str(path), "restore it from the run's owner")


# ---------------------------------------------------------------- config.yaml


def test_a_config_posenc_saved_is_read(tmp_path):
    path = tmp_path / "config.yaml"
    OmegaConf.save(compose(*SMOKE), path, resolve=True)
    cfg = read_config(path)
    assert cfg.pe.name == compose(*SMOKE).pe.name and cfg.trainer.max_steps == 30


def test_an_alias_bomb_is_refused_without_being_expanded(tmp_path):
    started = time.perf_counter()
    message = refused_config(tmp_path / "config.yaml", ALIAS_BOMB)
    assert time.perf_counter() - started < 1.0
    assert "anchors or aliases (line 2)" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (INTERPOLATION_BOMB, "s1 is '${s0}${s0}', an interpolation"),
        ("pe: {name: nonepe}\nmodel: {d_model: '${oc.env:HOME}'}\n", "model.d_model is"),
        ("pe: {name: '???'}\n", "pe.name is '???'"),
        ("defaults: [{pe: rope}]\npe: {name: nonepe}\n", "top-level 'defaults' key"),
        ("hydra: {run: {dir: /}}\npe: {name: nonepe}\n", "top-level 'hydra' key"),
        ("- pe\n- name\n", "not a YAML mapping"),
        ("just text\n", "not a YAML mapping"),
        ("pe: {name: nonepe\n", "not valid YAML"),
        ("pe: {name: !!python/object/apply:os.system [ls]}\n", "not a posenc config"),
        ("pe: {name: nonepe}\npe: {name: rope}\n", "duplicate key"),
        ("seed: 0\n", "pe is missing"),
        ("pe: rope\n", "pe is 'rope', not a mapping"),
        ("pe: {name: [rope]}\n", "pe.name is ['rope'], not a string"),
        ("pe: {name: nonepe}\nx: " + "[" * 40 + "]" * 40 + "\n", "nests deeper than 32"),
        ("pe: {name: nonepe}\nx: [" + "1, " * 6000 + "1]\n", "over 5,000 values"),
    ],
)
def test_a_config_posenc_would_not_write_is_refused(tmp_path, text, problem):
    started = time.perf_counter()
    assert problem in refused_config(tmp_path / "config.yaml", text)
    assert time.perf_counter() - started < 1.0


def test_an_oversized_binary_or_special_config_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    big = "pe: {name: nonepe}\n# " + "x" * 1_000_000 + "\n"
    assert "larger than 1,000,000 bytes" in refused_config(path, big)
    assert "larger than 100 bytes" in refused_config(
        path, "pe: {name: nonepe}\n" * 9, max_bytes=100
    )
    assert "not UTF-8 text (byte 11)" in refused_config(path, b"pe: {name: \xff}\n")
    path.unlink()
    os.mkfifo(path)  # a reader that opened it would wait for a writer forever
    with pytest.raises(UntrustedFileError, match="not a regular file"):
        read_config(path)
    with pytest.raises(UntrustedFileError, match="is missing"):
        read_config(tmp_path / "absent.yaml")
    path.unlink()
    path.mkdir()  # a directory where the file should be: refused, not a crash of the reader
    with pytest.raises(UntrustedFileError, match="not a regular file"):
        read_config(path)


# ---------------------------------------------------------------- the JSON files


def test_json_is_read_with_limits_and_posencs_infinity_kept(tmp_path):
    path = tmp_path / "train_summary.json"
    path.write_text('{"steps": 2, "train_seconds": 1.5, "best_valid_loss": Infinity}')
    assert math.isinf(check_summary(read_json(path), path)["best_valid_loss"])
    for text, problem in [
        ("{'steps': 2}", "not valid JSON (Expecting property name"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (RecursionError)"),
        ('{"steps": ' + "9" * 5000 + "}", "not valid JSON"),
    ]:
        path.write_text(text)
        with pytest.raises(UntrustedFileError) as caught:
            read_json(path)
        one_line(caught.value, str(path), problem, "delete it and run the run's training command")
    path.write_text("[1, 2, 3]" * 10)
    with pytest.raises(UntrustedFileError, match="larger than 20 bytes"):
        read_json(path, max_bytes=20)


def spoil(data: dict, where: str, value) -> dict:
    """A deep copy of ``data`` with the key path ``where`` (``a.b.0.c``) set to ``value``, or
    removed when ``value`` is ``...``."""
    spoiled = copy.deepcopy(data)
    *parents, last = [int(k) if k.isdigit() else k for k in where.split(".")]
    node = spoiled
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return spoiled


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("splits.test.bleu", "high", "splits.test.bleu is 'high', not a number in [0, 100]"),
        ("splits.test.bleu", [99], "splits.test.bleu is [99], not a number in [0, 100]"),
        ("splits.test.bleu", True, "splits.test.bleu is True, not a number in [0, 100]"),
        ("splits.test.loss", float("nan"), "splits.test.loss is nan, not a number >= 0"),
        ("splits.test.sentences", ..., "splits.test.sentences is missing"),
        (
            "splits.test.bertscore_f1",
            "0.9",
            "splits.test.bertscore_f1 is '0.9', not a number in [-1, 1] or",
        ),
        ("splits.test.buckets.0.min", None, "splits.test.buckets[0].min is None, not an integer"),
        ("splits.test.buckets", {}, "splits.test.buckets is {}, not a list"),
        ("splits", [], "splits is [], not a mapping"),
        ("step", "2", "step is '2', not an integer"),
        ("pe", None, "pe is None, not a string"),
        ("averaged", ["step_2.pt", 3], "averaged[1] is 3, not a string"),
        ("variants", {"x": {"pe": 1, "splits": {}}}, "variants.x.pe is 1, not a mapping"),
        ("train.steps", 2.5, "train.steps is 2.5, not an integer"),
    ],
)
def test_metrics_of_the_wrong_types_are_refused_naming_the_key(trained, where, value, problem):
    path = trained / "metrics.json"
    metrics = json.loads(path.read_text())
    assert check_metrics(metrics, path) == metrics
    with pytest.raises(UntrustedFileError) as caught:
        check_metrics(spoil(metrics, where, value), path)
    one_line(caught.value, f"metrics.json: {problem}", "delete it and evaluate the run again")


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("steps", "many", "steps is 'many', not an integer"),
        ("best_valid_loss", "inf", "best_valid_loss is 'inf', not a number"),
        ("train_seconds", ..., "train_seconds is missing"),
        ("stopped_early", "no", "stopped_early is 'no', not true or false"),
    ],
)
def test_a_training_summary_of_the_wrong_types_is_refused(trained, where, value, problem):
    path = trained / "train_summary.json"
    summary = json.loads(path.read_text())
    assert check_summary(summary, path) == summary
    with pytest.raises(UntrustedFileError) as caught:
        check_summary(spoil(summary, where, value), path)
    one_line(caught.value, f"train_summary.json: {problem}")


def test_a_failure_record_is_two_strings(tmp_path):
    path = tmp_path / "failed.json"
    assert check_failure({"error": "DataError", "message": "m"}, path)["error"] == "DataError"
    with pytest.raises(UntrustedFileError, match=r"failed.json: message is missing; delete it"):
        check_failure({"error": "DataError"}, path)


def test_the_run_directory_reads_its_files_missing_as_none_wrong_as_an_error(trained, tmp_path):
    run_dir = RunDir(copy_run(trained, tmp_path / "run"))
    assert run_dir.summary()["steps"] == run_dir.metrics()["step"] == 2
    run_dir.metrics_file.write_text('{"pe": "nonepe", "step": "2", "splits": {}}')
    with pytest.raises(UntrustedFileError, match=r"metrics.json: step is '2', not an integer"):
        run_dir.metrics()  # a ValueError: the job records it as a user error, in one line
    run_dir.metrics_file.unlink()
    run_dir.summary_file.write_text("{")
    assert run_dir.metrics() is None
    with pytest.raises(UntrustedFileError, match="train_summary.json: it is not valid JSON"):
        run_dir.summary()
    run_dir.summary_file.unlink()
    assert run_dir.summary() is None


# ---------------------------------------------------------------- the report and plot_pe


def rewrite_json(path: Path, where: str, value) -> None:
    path.write_text(json.dumps(spoil(json.loads(path.read_text()), where, value)))


@pytest.fixture(scope="module")
def sweep(trained, tmp_path_factory) -> Path:
    """A sweep of the trained run and spoiled copies of it; ``pe=rope`` has the best BLEU if
    its text ``"99"`` were taken for a number."""
    root = tmp_path_factory.mktemp("sweep")
    copy_run(trained, root / "pe=nonepe")
    (copy_run(trained, root / "bomb") / "config.yaml").write_text(ALIAS_BOMB)
    (copy_run(trained, root / "interpolated") / "config.yaml").write_text(INTERPOLATION_BOMB)
    rope = copy_run(trained, root / "pe=rope")
    config = OmegaConf.load(rope / "config.yaml")
    config.pe.name = "rope"
    OmegaConf.save(config, rope / "config.yaml")
    rewrite_json(rope / "metrics.json", "splits.test.bleu", "99")
    rewrite_json(copy_run(trained, root / "summary") / "train_summary.json", "steps", "many")
    (copy_run(trained, root / "failure") / "failed.json").write_text('{"error": 1, "message": "m"}')
    return root


@pytest.fixture(scope="module")
def report(sweep) -> str:
    build_report(sweep, sweep / "out", samples=10)
    return (sweep / "out" / "report.md").read_text(encoding="utf-8")


def run_row(markdown: str, name: str) -> str:
    """The line of run ``name`` in the report's run table."""
    (row,) = [line for line in markdown.splitlines() if line.startswith(f"`{name}` | ")]
    return row


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("bomb", "config.yaml: it has YAML anchors or aliases (line 2)"),
        ("interpolated", "config.yaml: s1 is '${s0}${s0}', an interpolation"),
        ("pe=rope", "metrics.json: splits.test.bleu is '99', not a number in [0, 100]"),
        ("summary", "train_summary.json: steps is 'many', not an integer"),
        ("failure", "failed.json: error is 1, not a string"),
    ],
)
def test_a_run_with_a_bad_file_is_failed_in_the_report_with_one_line(report, sweep, name, problem):
    row = run_row(report, name)
    assert f" | {FAILED} | " in row and f"{sweep / name}/{problem}" in row
    assert run_row(report, "pe=nonepe").count(f" | {DONE} | ") == 1


def test_a_bad_number_never_reaches_a_table(report):
    scores = report[report.index(f"## {SECTIONS[2]}") : report.index(f"## {SECTIONS[3]}")]
    assert "nonepe" in scores and "rope" not in scores
    reading = report[report.index("## Reading") : report.index(f"## {SECTIONS[0]}")]
    assert "rope" not in reading


def test_an_alias_bomb_is_refused_fast_by_the_report_and_plot_pe(sweep, capsys):
    started = time.perf_counter()
    bomb = load_run(sweep / "bomb", sweep)
    assert bomb.status == FAILED and bomb.config == {} and time.perf_counter() - started < 1.0
    capsys.readouterr()
    started = time.perf_counter()
    assert plot_pe.main(["--run", str(sweep / "bomb")]) == 2
    assert time.perf_counter() - started < 2.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bomb/config.yaml: it has YAML anchors or aliases" in err


def test_a_setting_the_report_counts_with_and_an_evaluations_config_are_checked(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path / "sweep" / "run")
    evaluation = run_dir / "evals" / "beam"
    evaluation.mkdir(parents=True)
    shutil.copy(run_dir / "metrics.json", evaluation)
    (evaluation / "eval_config.yaml").write_text(ALIAS_BOMB)
    loaded = load_run(run_dir, tmp_path / "sweep", "beam")
    assert loaded.status == FAILED and loaded.metrics == {} and loaded.train == {}
    one_line(loaded.message, "beam/eval_config.yaml: it has YAML anchors", "evaluation again")
    config = OmegaConf.load(run_dir / "config.yaml")
    config.seed = "abc"
    OmegaConf.save(config, run_dir / "config.yaml")
    loaded = load_run(run_dir, tmp_path / "sweep")
    assert (
        loaded.status == FAILED and "config.yaml: seed is 'abc', not an integer" in loaded.message
    )


def test_plot_pe_names_a_bad_tokenizer_of_a_run_in_one_line(trained, tmp_path, capsys):
    run_dir = copy_run(trained, tmp_path / "run")
    (run_dir / "tokenizer" / "tokenizer.json").write_text("{")
    capsys.readouterr()
    assert plot_pe.main(["--run", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer.json: tokenizers cannot read it" in err


# ---------------------------------------------------------------- the saved tokenizer


@pytest.fixture
def saved(trained, tmp_path) -> Path:
    """A copy of the trained run's tokenizer directory."""
    return shutil.copytree(trained / "tokenizer", tmp_path / "tokenizer")


def refused_tokenizer(directory: Path, *parts: str) -> str:
    with pytest.raises(DataError) as caught:
        load_tokenizer(directory)
    return one_line(caught.value, *parts, SAVED_FIX)


def test_a_malformed_or_oversized_tokenizer_json_is_a_one_line_data_error(saved, monkeypatch):
    assert load_tokenizer(saved).vocab_size > 4
    model = saved / "tokenizer.json"
    text = model.read_text()
    model.write_text(text[: len(text) // 2])
    refused_tokenizer(saved, f"{model}: tokenizers cannot read it")
    model.write_text('{"model": 3}')
    refused_tokenizer(saved, f"{model}: tokenizers cannot read it")
    model.write_text(text)
    monkeypatch.setitem(tokenizer_module.MAX_BYTES, "tokenizer.json", 1000)
    refused_tokenizer(saved, f"{model}: it is larger than 1,000 bytes")


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("kind", "sentencepiece", "kind is 'sentencepiece', not one of bpe, mbert"),
        ("name", 3, "name is 3, not a string"),
        ("specials", ["<pad>"], "specials is ['<pad>'], not a mapping"),
        ("specials.unk", ..., "specials.unk is missing"),
        ("specials.mask", 5, "specials.mask is 5, not a string"),
        ("kept_ids_file", "../../secret.json", "kept_ids_file is '../../secret.json', not one of"),
    ],
)
def test_tokenizer_metadata_of_the_wrong_types_is_a_one_line_data_error(
    saved, where, value, problem
):
    rewrite_json(saved / META_FILE, where, value)
    refused_tokenizer(saved, f"{saved / META_FILE}: {problem}")


def test_kept_ids_of_the_wrong_types_are_a_one_line_data_error(saved, monkeypatch):
    rewrite_json(saved / META_FILE, "kind", "mbert")
    rewrite_json(saved / META_FILE, "kept_ids_file", KEPT_FILE)
    (saved / KEPT_FILE).write_text('[0, 1, "2"]')
    refused_tokenizer(saved, f"{saved / KEPT_FILE}: [2] is '2', not an integer")
    (saved / KEPT_FILE).write_text("[0, 1, 2, 3]" + " " * 100)
    monkeypatch.setitem(tokenizer_module.MAX_BYTES, KEPT_FILE, 100)
    refused_tokenizer(saved, f"{saved / KEPT_FILE}: it is larger than 100 bytes")
    (saved / KEPT_FILE).unlink()
    refused_tokenizer(saved, f"{saved / KEPT_FILE}: it is missing")
