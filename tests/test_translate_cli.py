"""The translate command (``python -m posenc.translate run_dir=RUN``), like
``fairseq-interactive``: raw sentences in (a file or stdin), detokenised translations out (a
file or stdout), one per line in input order, with the run's tokenizer and checkpoint; errors
in one line."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading

import pytest
from conftest import ROOT, SMOKE, compose
from omegaconf import OmegaConf

from posenc.config import data as typed
from posenc.data.splits import load_corpora
from posenc.evaluation.standalone import main as evaluate_main
from posenc.job import run
from posenc.translate import main as translate_main

TRAIN = (*SMOKE, "pe=rope")  # 30 steps: the model translates (into something)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("translate") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


def evaluated_sources(run_dir) -> list[str]:
    """The sentences the run's own evaluation translated into ``hypotheses.test.txt``."""
    data = OmegaConf.load(run_dir / "config.yaml").data
    return load_corpora(typed.data_config(data), with_train=False)["test"].src[:12]


def test_a_file_is_translated_as_the_evaluation_translated_it(trained, tmp_path):
    sources = evaluated_sources(trained)
    hypotheses = (trained / "hypotheses.test.txt").read_text().splitlines()
    assert sum(bool(h) for h in hypotheses) > 6
    source_file, output = tmp_path / "in.fr", tmp_path / "out" / "en.txt"
    source_file.write_text("\n".join([*sources[:5], "", *sources[5:]]) + "\n")
    translate_main([f"run_dir={trained}", f"input={source_file}", f"output={output}"])
    assert output.read_text().splitlines() == [*hypotheses[:5], "", *hypotheses[5:]]


def test_stdin_is_translated_to_stdout_with_beam_search(trained, monkeypatch, capsys):
    sources = evaluated_sources(trained)[:4]
    args = [f"run_dir={trained}", "eval.beam_size=3", "eval.lenpen=0.6"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(sources) + "\n"))
    translate_main(args)
    out = capsys.readouterr().out
    source_file = trained.parent / "four.fr"
    source_file.write_text("\n".join(sources) + "\n")
    translate_main([*args, f"input={source_file}"])
    assert capsys.readouterr().out == out and len(out.splitlines()) == 4 and out.strip()


def test_the_command_runs_as_a_module(trained):
    done = subprocess.run(
        [sys.executable, "-m", "posenc.translate", f"run_dir={trained}"],
        input="Bonjour.\n\nMerci.\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    assert len(done.stdout.splitlines()) == 3 and done.stdout.splitlines()[1] == ""
    assert "3 lines translated" in done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run_dir={missing}"], "config.yaml not found: is .* a posenc run"),
        (["run_dir={run}", "input={missing}"], "cannot read input=.*: No such file or directory"),
        (["input=x.txt"], "run_dir= is required; usage: python -m posenc.translate run_dir=PATH"),
        (["run_dr={run}"], "unknown argument run_dr=; did you mean run_dir=\\?"),
        (["run_dir={run}", "inpt=x.txt"], "unknown argument inpt=; did you mean input=\\?"),
        (["run_dir={run}", "eval.beam_size"], "'eval.beam_size' is not KEY=VALUE"),
        (["run_dir={run}", "eval.beam_sise=5"], "Key 'beam_sise' is not in the run's config"),
        (["run_dir={run}", "eval.beam_size=0"], "eval.beam_size=0 must be an integer in \\[1, "),
        (["run_dir={run}", "eval.beam_size=100000"], "eval.beam_size=100000 must be an integer in"),
        (["run_dir={run}", "eval.max_len_a=1e30"], "eval.max_len_a=1e\\+30 must be a number in"),
        (
            ["run_dir={run}", "eval.max_len_b=99999999999999999999"],
            "eval.max_len_b=99999999999999999999 must be an integer in",
        ),
        (["run_dir={run}", "input={latin1}"], "not UTF-8 \\(byte offset 1: invalid continuation"),
        (["run_dir={run}", "input={long}"], "input line 2 has 10,001 characters, over the 10,000"),
    ],
)
def test_an_error_is_one_line(trained, tmp_path, args, expected):
    long = tmp_path / "long.txt"  # once decoded for hours without a word
    long.write_text("bonjour\n" + "a" * 10_001 + "\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("d\u00e9j\u00e0 vu\n".encode("latin-1"))
    paths = {"run": trained, "missing": tmp_path / "missing", "long": long, "latin1": latin1}
    with pytest.raises(SystemExit) as exit_info:
        translate_main([arg.format(**paths) for arg in args])
    message = str(exit_info.value.code)
    assert "\n" not in message
    assert re.search(expected, message), message


def test_a_line_is_one_line_whatever_breaks_it_holds(trained, tmp_path):
    """Only ``\\n`` ends a line: ``\\r\\n`` is one ending, and a ``\\r``, form feed or
    U+2028 inside a line is a space, so five lines in are five lines out, each translation
    beside its source."""
    sources = evaluated_sources(trained)[:5]
    broken = [sources[0], "un\rdeux", "trois\x0cquatre", "cinq\u2028six", sources[4]]
    source_file, output = tmp_path / "broken.fr", tmp_path / "broken.en"
    source_file.write_bytes(("\r\n".join(broken) + "\r\n").encode("utf-8"))
    translate_main([f"run_dir={trained}", f"input={source_file}", f"output={output}"])
    lines = output.read_text().split("\n")
    assert len(lines) == 6 and lines[-1] == ""  # five lines and the final newline
    plain = tmp_path / "plain.fr"
    plain.write_text("\n".join([sources[0], "un deux", "trois quatre", "cinq six", sources[4]]))
    again = tmp_path / "plain.en"
    translate_main([f"run_dir={trained}", f"input={plain}", f"output={again}"])
    assert again.read_text() == output.read_text()


def test_non_utf8_standard_input_is_one_line(trained, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"d\xe9j\xe0\n")))
    with pytest.raises(SystemExit) as exit_info:
        translate_main([f"run_dir={trained}"])
    assert str(exit_info.value.code).startswith("cannot read standard input: not UTF-8")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_output_to_a_fifo_is_written_into_it_not_replaced(trained, tmp_path):
    source_file, fifo = tmp_path / "two.fr", tmp_path / "out.fifo"
    source_file.write_text("\n".join(evaluated_sources(trained)[:2]) + "\n")
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    translate_main([f"run_dir={trained}", f"input={source_file}", f"output={fifo}"])
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO its reader opened
    assert len(received) == 1 and len(received[0].splitlines()) == 2


def test_a_run_saved_before_beam_search_existed_can_use_it(trained, tmp_path):
    """A run whose config has no ``eval.beam_size``, ``eval.lenpen`` or ``eval.average_last``
    decodes greedily, and standalone evaluation may still set them."""
    old = tmp_path / "old"
    shutil.copytree(trained, old)
    cfg = OmegaConf.load(old / "config.yaml")
    for key in ("beam_size", "lenpen", "average_last"):
        cfg.eval.pop(key)
    OmegaConf.save(cfg, old / "config.yaml")
    evaluate_main([f"run_dir={old}", "eval.beam_size=2"])
    metrics = json.loads((old / "evals" / "eval.beam_size=2,step=30" / "metrics.json").read_text())
    assert metrics["splits"]["test"]["beam_size"] == 2
    assert metrics["splits"]["test"]["lenpen"] == 1.0


@pytest.mark.parametrize("command", ["posenc.translate", "posenc.evaluation"])
def test_help_lists_the_arguments_and_the_settings_with_their_defaults_and_exits_0(command):
    done = subprocess.run(
        [sys.executable, "-m", command, "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m {command} run_dir=PATH")
    for line in ("  run_dir=  the trained run", "  eval.beam_size=1\n      1 = greedy decoding"):
        assert line in done.stdout  # each setting with what it does, from configs/eval's comments
    # translate reads its input: what selects and scores test splits is not its to set
    assert ("  eval.splits=[all]" in done.stdout) == (command == "posenc.evaluation")
    assert f"Example:\n  python -m {command} run_dir=" in done.stdout


def test_help_with_a_run_shows_the_runs_own_values(tmp_path):
    (tmp_path / "config.yaml").write_text("eval:\n  beam_size: 4\n  lenpen: 0.6\n")
    done = subprocess.run(
        [sys.executable, "-m", "posenc.translate", f"run_dir={tmp_path}", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "(this run's values)" in done.stdout
    assert "  eval.beam_size=4\n" in done.stdout and "  eval.lenpen=0.6\n" in done.stdout
    assert "  eval.use_cache=true\n" in done.stdout  # not in its config: the default


def test_the_python_api_loads_a_run_and_translates_as_the_command_does(trained, tmp_path):
    import posenc

    sources = evaluated_sources(trained)[:4]
    source_file, output = tmp_path / "src.txt", tmp_path / "out.txt"
    source_file.write_text("\n".join(sources) + "\n")
    translate_main([f"run_dir={trained}", f"input={source_file}", f"output={output}"])
    loaded = posenc.load_run(trained, "device=cpu")
    assert loaded.step > 0 and loaded.checkpoint.name in ("best.pt", "last.pt")
    assert loaded.translate(sources) == output.read_text().splitlines()
    best = loaded.translate(sources[:2], beam_size=3, nbest=2)
    assert [len(found) for found in best] == [2, 2]
    assert best[0][0][0] >= best[0][1][0]  # best first
    with pytest.raises(ValueError, match="nbest=4 needs a beam at least that wide"):
        loaded.translate(sources, beam_size=2, nbest=4)
    assert repr(loaded) == (
        f"TrainedRun({str(trained)!r}, pe={loaded.config.pe.name}, step={loaded.step}, "
        f"checkpoint={loaded.checkpoint.name}, device=cpu)"
    )


def test_the_python_api_raises_what_python_code_catches(trained, tmp_path):
    """A notebook's ``except FileNotFoundError`` / ``except ValueError`` catches every refusal;
    none ends the interpreter (SystemExit)."""
    import posenc
    from posenc.api import RunNotFoundError, RunSettingError

    with pytest.raises(RunNotFoundError, match="is no posenc run"):
        posenc.load_run(tmp_path / "nowhere")
    without = tmp_path / "without_checkpoints"
    shutil.copytree(trained, without, ignore=shutil.ignore_patterns("checkpoints"))
    with pytest.raises(FileNotFoundError):
        posenc.load_run(without)
    with pytest.raises(RunSettingError):
        posenc.load_run(trained, "eval.beam_sise=3")
    with pytest.raises(ValueError):
        posenc.load_run(trained, "eval.beam_size=wide")
    loaded = posenc.load_run(trained, "device=cpu")
    for beam in (0, 2.5, True, 100_000):
        with pytest.raises(ValueError, match=r"beam_size=\S+ must be an integer in \[1, 256\]"):
            loaded.translate(["bonjour"], beam_size=beam)
    with pytest.raises(ValueError, match=r"nbest=0 must be an integer in \[1, 256\]"):
        loaded.translate(["bonjour"], nbest=0)
    with pytest.raises(ValueError, match="sentence 1 has 10,001 characters"):
        loaded.translate(["bonjour", "a" * 10_001])
    planted = tmp_path / "planted"
    shutil.copytree(trained, planted)
    config = (planted / "config.yaml").read_text()
    (planted / "config.yaml").write_text(re.sub(r"max_len_b: \d+", "max_len_b: 100000000", config))
    with pytest.raises(ValueError, match="eval.max_len_b=100000000 must be an integer in"):
        posenc.load_run(planted, "device=cpu").translate(["bonjour"])
