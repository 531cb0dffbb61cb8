"""A run directory is untrusted input (a shared lab disk: others can write into the runs you
evaluate and report). Nothing in it is executed, nothing is written through it to elsewhere, no
result is returned under another run's label, and every fault ends a command with one line.

Malformed files (YAML alias bombs, wrong JSON types, broken tokenizers) are in
``test_untrusted_files.py``; NaN losses, kills between checkpoints and the run lock itself in
``test_nan_and_kills.py``."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SMOKE, compose, pythonpath
from omegaconf import OmegaConf

from posenc.analysis.report.build import main as report_main
from posenc.config.identity import differences
from posenc.evaluation import evaluate as evaluate_module
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.model.encodings import encoding_class
from posenc.runtime.files import write_json
from posenc.runtime.lock import run_lock
from posenc.runtime.rundir import MAX_NAME_BYTES, run_dir_name
from posenc.translate import main as translate_main

TRAIN = (*SMOKE, "pe=rope", "trainer.max_steps=4", "trainer.valid_every=2")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("sweep") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    """A copy of the trained run that a test may spoil."""
    target = tmp_path / "sweep" / "run"
    shutil.copytree(trained, target)
    return target


def one_line(exit_info: pytest.ExceptionInfo) -> str:
    message = str(exit_info.value.code)
    assert "\n" not in message and "Traceback" not in message, message
    return message


# ---------------------------------------------------------------- nothing from a run is executed


def plant_module(root: Path, marker: Path) -> str:
    """A module importable from ``root`` that creates ``marker`` when imported; returns the
    dotted path of a class in it."""
    (root / "planted").mkdir(exist_ok=True)
    (root / "planted" / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass Evil: pass\n"
    )
    return "planted.evil.Evil"


def test_a_config_naming_a_module_of_its_own_is_refused_without_importing_it(
    copy, tmp_path, monkeypatch
):
    marker = tmp_path / "ran"
    monkeypatch.syspath_prepend(str(copy))
    target = plant_module(copy, marker)
    cfg = OmegaConf.load(copy / "config.yaml")
    cfg.pe._target_ = target
    OmegaConf.save(cfg, copy / "config.yaml")
    for checkpoint in (copy / "checkpoints").glob("*.pt"):  # the settings stored beside weights
        payload = torch.load(checkpoint, weights_only=True)
        payload["config"]["pe"]["_target_"] = target
        checkpoint.unlink()  # best.pt may be a hard link of last.pt: save each anew
        torch.save(payload, checkpoint)
    with pytest.raises(SystemExit) as refused:
        evaluate_main([f"run_dir={copy}"])
    assert "is not one of posenc's encodings" in one_line(refused)
    with pytest.raises(SystemExit) as refused:
        translate_main([f"run_dir={copy}", f"input={copy / 'config.yaml'}"])
    assert "is not one of posenc's encodings" in one_line(refused)
    assert not marker.exists()


def test_a_test_time_variant_naming_foreign_code_is_refused(copy, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.syspath_prepend(str(copy))
    target = plant_module(copy, marker)
    with pytest.raises(SystemExit) as refused:
        evaluate_main([f"run_dir={copy}", f"eval.pe_variants={{x: {{_target_: {target}}}}}"])
    assert "is not one of posenc's encodings" in one_line(refused)
    assert not marker.exists()
    assert not list((copy / "evals").glob("eval.pe_variants*"))  # nothing half-written


def test_the_catalogue_holds_posencs_encodings_and_classes_a_program_defines():
    assert encoding_class("posenc.model.encodings.rotary.RotaryEncoding").__name__ == (
        "RotaryEncoding"
    )
    with pytest.raises(ValueError, match="os.system' is not one of posenc's encodings"):
        encoding_class("os.system")


# ---------------------------------------------------------------- nothing written outside a run


def train_command(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *SMOKE, "trainer.max_steps=2", *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )


def test_a_name_that_leaves_outputs_is_refused_in_one_line(tmp_path):
    done = train_command(tmp_path, "name=../../escaped")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "name='../../escaped' cannot name a directory under outputs/: use letters, digits, "
        "'-', '_' and '.' (no '/' or '..', at most 100 bytes)"
    ]
    assert not (tmp_path.parent / "escaped").exists() and not (tmp_path / "escaped").exists()


def test_train_log_is_never_appended_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.log").symlink_to(victim)
    done = train_command(tmp_path, f"hydra.run.dir={run_dir}")
    assert done.returncode == 1
    assert "train.log is a symbolic link" in done.stderr.strip().splitlines()[-1]
    assert victim.read_text() == "mine\n"


@pytest.mark.parametrize("link", ["hypotheses.test.txt", "evals", "tb"])
def test_a_run_holding_links_that_leave_it_is_refused(copy, tmp_path, link):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    target = copy / link
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    target.symlink_to(victim)
    with pytest.raises(SystemExit):  # training again: refused, failed.json not written
        run(compose(*TRAIN, "eval.max_sentences=3"), copy)
    assert not (copy / "failed.json").exists()
    with pytest.raises(SystemExit) as refused:
        evaluate_main([f"run_dir={copy}", "eval.max_sentences=3"])
    assert "symbolic link leading out of the run directory" in one_line(refused)
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]


def test_the_report_writes_nothing_through_links(copy, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    sweep = copy.parent
    (sweep / "report").symlink_to(victim)
    with pytest.raises(SystemExit) as refused:
        report_main([str(sweep)])
    assert "is a symbolic link" in one_line(refused)
    (sweep / "report").unlink()
    (sweep / "report").mkdir()
    (sweep / "report" / "report.csv").symlink_to(victim / "report.csv")
    report_main([str(sweep)])
    assert not (sweep / "report" / "report.csv").is_symlink()
    assert list(victim.iterdir()) == []


def test_a_directory_that_is_no_posenc_run_of_these_settings_is_refused(copy, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "config.yaml").write_text("theirs: 1\n")
    with pytest.raises(SystemExit):
        run(compose(*TRAIN), notes)
    assert (notes / "config.yaml").read_text() == "theirs: 1\n"
    assert sorted(p.name for p in notes.iterdir()) == ["config.yaml"]

    (notes / "config.yaml").unlink()
    (notes / "thesis.tex").write_text("mine")
    with pytest.raises(SystemExit):
        run(compose(*TRAIN), notes)
    assert sorted(p.name for p in notes.iterdir()) == ["thesis.tex"]

    saved = (copy / "config.yaml").read_text()
    with pytest.raises(SystemExit):  # another run's directory: another learning rate
        run(compose(*TRAIN, "trainer.lr=0.01"), copy)
    assert (copy / "config.yaml").read_text() == saved and not (copy / "failed.json").exists()


# ---------------------------------------------------------------- no result under the wrong label


def names(*overrides: str) -> str:
    cfg = OmegaConf.to_container(compose(*overrides), resolve=True)
    return run_dir_name("", cfg)


def test_runs_that_train_different_models_never_share_a_directory():
    plain = names(*SMOKE)
    assert names(*SMOKE, "trainer.lr=0.01") != plain
    assert names(*SMOKE, "data.seed=7") != plain  # a setting left out of the overrides
    assert names(*SMOKE, "data=local", "data.dir=/a") != names(*SMOKE, "data=local", "data.dir=/b")
    # budgets and run control are not what a run is: raising them continues it
    assert names(*SMOKE, "trainer.max_steps=99", "threads=2", "trainer.progress=true") == plain
    assert names(*SMOKE, "eval.max_sentences=3") == plain  # evaluated again, in the same run


def test_a_setting_added_later_with_an_off_default_leaves_directory_names_as_they_were():
    cfg = OmegaConf.to_container(compose(*SMOKE), resolve=True)
    later = {**cfg, "trainer": {**cfg["trainer"], "new_switch": None, "new_table": {}}}
    assert run_dir_name("", later) == run_dir_name("", cfg)
    assert run_dir_name("", {**later, "trainer": {**later["trainer"], "new_switch": 1}}) != (
        run_dir_name("", cfg)
    )


def test_a_checkpoint_from_before_a_setting_with_an_off_default_still_matches_its_config():
    saved = {"tokenizer": {"kind": "bpe", "vocab_size": 8000}, "pe": {"name": "rope"}}
    now = {**saved, "tokenizer": {**saved["tokenizer"], "train_sentences": None}}
    assert differences(saved, now) == []
    sampled = {**saved, "tokenizer": {**saved["tokenizer"], "train_sentences": 100}}
    assert differences(saved, sampled) == ["tokenizer.train_sentences=<unset> (now 100)"]


def test_a_directory_name_fits_a_file_system_however_many_overrides():
    long = ",".join(f"+data.extra_tests.t{i}={{min_len: {i}, max_len: {i + 9}}}" for i in range(40))
    name = run_dir_name(long + "/../x", {"seed": 0})
    assert len(name.encode()) <= MAX_NAME_BYTES and "/" not in name
    assert name.endswith("+more@" + name.rsplit("@", 1)[1])
    assert run_dir_name(long, {"seed": 1}) != run_dir_name(long, {"seed": 0})


def test_a_rerun_under_other_evaluation_settings_evaluates_again_and_keeps_the_first(copy):
    first = json.loads((copy / "metrics.json").read_text())
    again = run(compose(*TRAIN, "eval.max_sentences=3"), copy)
    assert again["splits"]["test"]["sentences"] == 3 != first["splits"]["test"]["sentences"]
    kept = copy / "evals" / "step=4"
    assert json.loads((kept / "metrics.json").read_text()) == first
    assert OmegaConf.load(kept / "eval_config.yaml").eval.max_sentences == 12
    assert run(compose(*TRAIN, "eval.max_sentences=3"), copy) == again  # now nothing to do


def test_evaluation_refuses_to_score_a_model_it_did_not_train(copy):
    for override in ("model.n_heads=8", "pe.base=500", "data.seed=9"):
        with pytest.raises(SystemExit) as refused:
            evaluate_main([f"run_dir={copy}", override])
        assert "is not how" in one_line(refused) and override.split("=")[0] in str(
            refused.value.code
        )
    cfg = OmegaConf.load(copy / "config.yaml")  # the config says 8 heads, the weights had 4
    cfg.model.n_heads = 8
    OmegaConf.save(cfg, copy / "config.yaml")
    with pytest.raises(SystemExit) as refused:
        evaluate_main([f"run_dir={copy}"])
    assert "was trained with model.n_heads=4 (now 8)" in one_line(refused)


def test_a_standalone_evaluation_made_under_other_settings_is_not_the_answer(copy):
    evaluate_main([f"run_dir={copy}", "eval.beam_size=2"])
    first = copy / "evals" / "eval.beam_size=2,step=4"
    cfg = OmegaConf.load(copy / "config.yaml")
    cfg.eval.max_sentences = 3  # the run was evaluated again under other settings since
    OmegaConf.save(cfg, copy / "config.yaml")
    evaluate_main([f"run_dir={copy}", "eval.beam_size=2"])
    (second,) = (copy / "evals").glob("eval.beam_size=2,step=4@*")
    assert json.loads((second / "metrics.json").read_text())["splits"]["test"]["sentences"] == 3
    assert json.loads((first / "metrics.json").read_text())["splits"]["test"]["sentences"] == 12


# ---------------------------------------------------------------- one process, one line, no halves


def test_a_second_process_in_a_run_directory_is_refused(copy):
    with run_lock(copy, "training"), pytest.raises(SystemExit):
        run(compose(*TRAIN, "trainer.max_steps=6"), copy)
    assert json.loads((copy / "metrics.json").read_text())["step"] == 4  # untouched


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (KeyboardInterrupt(), "interrupted \\(Ctrl-C\\); nothing half-written"),
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
        (RuntimeError("a bug"), "RuntimeError: a bug \\(unexpected; POSENC_FULL_ERROR=1"),
    ],
)
def test_an_evaluation_stopped_midway_leaves_nothing_half_written(
    copy, monkeypatch, capsys, fault, expected
):
    def fail(*args, **kwargs):
        raise fault

    monkeypatch.setattr(evaluate_module, "_save_attention_example", fail)
    with pytest.raises(SystemExit) as stopped:
        evaluate_main([f"run_dir={copy}", "eval.beam_size=2"])
    if isinstance(fault, KeyboardInterrupt):  # as a shell reports Ctrl-C
        assert stopped.value.code == 130
        assert re.search(expected, capsys.readouterr().err.strip())
    else:
        assert re.search(expected, one_line(stopped))
    left = sorted(p.name for p in (copy / "evals").iterdir() if p.name != ".lock")
    if isinstance(fault, RuntimeError):  # a bug: its traceback kept for the report of it
        assert left == ["eval.beam_size=2,step=4"]
        failed = json.loads((copy / "evals" / left[0] / "failed.json").read_text())
        assert "Traceback" in failed["traceback"]
        assert not (copy / "evals" / left[0] / "metrics.json").exists()
    else:
        assert left == []


def test_an_unforeseen_error_in_training_is_one_line_and_recorded(copy, monkeypatch, caplog):
    from posenc import job

    def fail(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(job, "evaluate", fail)
    with pytest.raises(SystemExit):
        run(compose(*TRAIN, "eval.max_sentences=3"), copy)
    failed = json.loads((copy / "failed.json").read_text())
    assert failed["error"] == "KeyError" and "Traceback" in failed["traceback"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("unexpected KeyError: 'surprise' (the traceback is in ")


def test_files_written_atomically_are_readable_by_the_group(tmp_path):
    mask = os.umask(0o022)
    try:
        write_json(tmp_path / "metrics.json", {})
    finally:
        os.umask(mask)
    assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("override", ["trainer.max_steps=abc", "trainer.lr=3e-3x"])
def test_a_refused_setting_writes_nothing(tmp_path, override):
    done = train_command(tmp_path, override)
    assert done.returncode == 1 and "ValueError: trainer." in done.stdout + done.stderr
    assert not [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()]
