"""The benchmark and plotting scripts: they run for the encodings in ``configs/pe`` and write
what they promise (tiny models, a few positions: seconds)."""

from __future__ import annotations

import gzip
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PE_NAMES, ROOT

from posenc.analysis import plot_pe
from posenc.analysis.bench import measure
from posenc.analysis.bench import runner as bench
from posenc.model.factory import build_named_model, encoding_names, select_encodings

PLOTTED = [name for name in ("nonepe", "sinpe", "alibi", "rope") if name in PE_NAMES]


def test_catalog_lists_every_config_with_nonepe_first():
    names = encoding_names()
    assert sorted(names) == PE_NAMES
    assert names[0] == "nonepe"
    assert select_encodings("sinpe,nonepe,sinpe") == ["sinpe", "nonepe"]
    with pytest.raises(ValueError, match="unknown encoding"):
        select_encodings("no_such_encoding")


def test_decoding_runs_exactly_length_steps_and_restores_eos():
    settings = bench.BenchSettings(encodings=["nonepe"], model="tiny", vocab_size=50)
    work = bench.build_workload("nonepe", settings)
    # Make EOS the model's favourite token: a fair benchmark must still decode every step.
    with torch.no_grad():
        work.model.output.weight[2] += 10.0
    source = measure.random_tokens((2, 7), 50, seed=0).to(settings.torch_device)
    assert bench.count_decoder_calls(work, source, 7) == 7
    assert work.model.eos_id == 2


def test_bench_quick_writes_json_with_ratios_and_markdown(tmp_path, monkeypatch):
    out = tmp_path / "bench.json"
    argv = [
        "--quick",
        "--pe=nonepe,sinpe",
        "--model=tiny",
        "--vocab=64",
        "--tokens=128",
        "--decode-batch=2",
        "--threads=1",
        "--no-memory",  # it reconfigures malloc for the rest of the process
        "--variant=alibi pe.dape=true",  # an encoding with options, as a sweep overrides it
        f"--out={out}",
    ]
    monkeypatch.setattr(sys, "argv", ["bench.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / "bench.py"), run_name="__main__")
    assert done.value.code == 0
    result = json.loads(out.read_text())
    assert result["settings"]["lengths"] == [64]
    assert result["settings"]["repeats"] == 1
    assert result["machine"]["torch_threads"] == 1
    assert result["errors"] == {}
    for kind in ("train", "decode"):
        assert set(result["summary"][kind]) == {"nonepe", "sinpe", "alibi (pe.dape=True)"}
        assert result["summary"][kind]["nonepe"]["64"]["ratio"] == 1.0
        assert result["summary"][kind]["sinpe"]["64"]["ratio"] > 0
        assert len(result["samples_s"][kind]["sinpe"]["64"]) == 1
    assert result["memory_mb"] is None
    report = out.with_suffix(".md").read_text()
    assert "| sinpe |" in report and "(1.00)" in report
    assert "| alibi (pe.dape=True) |" in report
    assert result["parameters"]["alibi (pe.dape=True)"] > result["parameters"]["nonepe"]
    assert "<= 1.10" in report  # sinpe's target is printed (no verdict: L=128 not measured)


def test_target_verdicts():
    summary = {"train": {"rope": {"128": {"ratio": 1.05}}, "cope": {"128": {"ratio": 2.5}}}}
    assert bench.target_verdict("rope", summary) == (1.10, "pass")
    assert bench.target_verdict("cope", summary) == (2.0, "miss")
    assert bench.target_verdict("nonepe", summary) == (None, "-")


LENGTH, HEADS, WIDTH = 16, 4, 32  # positions plotted; configs/model/tiny.yaml


def test_plot_pe_script_writes_png_and_npz(tmp_path):
    drawn = [name for name in ("nonepe", "rope") if name in PE_NAMES]
    argv = ["pe=" + ",".join(drawn), f"--out={tmp_path}", f"--length={LENGTH}", "--model=tiny"]
    assert plot_pe.main(argv) == 0
    for name in drawn:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        arrays = np.load(tmp_path / f"{name}.npz")
        assert arrays["embed_encoder"].shape == (LENGTH, WIDTH)
        assert arrays["decoder_weights_random"].shape == (HEADS, LENGTH, LENGTH)


@pytest.mark.parametrize("name", PLOTTED)
def test_plotted_arrays(name):
    model = build_named_model(name, "tiny")
    arrays = plot_pe.encoding_view(name, LENGTH, model).arrays()
    assert arrays["embed_encoder"].shape == arrays["embed_decoder"].shape == (LENGTH, WIDTH)
    for site, query in (("encoder", LENGTH // 2), ("decoder", LENGTH - 1)):
        assert int(arrays[f"{site}_query"]) == query
        assert arrays[f"{site}_distance"].shape == (LENGTH,)
        assert arrays[f"{site}_logweight"].shape == (HEADS, LENGTH)
        for kind in ("constant", "random"):
            weights = arrays[f"{site}_weights_{kind}"]
            assert weights.shape == (HEADS, LENGTH, LENGTH)
            np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    # The decoder never attends to later keys.
    assert np.isnan(arrays["decoder_logweight"][:, arrays["decoder_distance"] < 0]).all()
    if name == "nonepe":
        assert not arrays["embed_encoder"].any()
        np.testing.assert_allclose(np.nan_to_num(arrays["encoder_logweight"]), 0, atol=1e-5)
    if name == "sinpe":
        assert np.abs(arrays["embed_encoder"]).max() > 0.5
    if name == "alibi":  # split encoder: -m |i - j| on each head's side, nothing on the other
        bias = arrays["encoder_bias"]
        assert bias.shape == (HEADS, LENGTH)
        signed = arrays["encoder_distance"]  # i - j, positive for keys before the query
        distance = np.abs(signed)
        assert (bias[:, distance == 0] == 0).all()
        assert np.isnan(bias[0::2, signed < 0]).all() and np.isnan(bias[1::2, signed > 0]).all()
        slopes = -bias[:, distance > 0] / distance[distance > 0]
        for head_slopes in slopes:
            seen = head_slopes[~np.isnan(head_slopes)]
            np.testing.assert_allclose(seen, np.full_like(seen, seen[0]))
            assert seen.size >= LENGTH // 2 - 1 and seen[0] > 0
    if name == "rope":  # q . q rotated: largest at distance 0, symmetric in the encoder
        mean = arrays["encoder_rotary_mean"]
        assert mean.shape == arrays["decoder_rotary_score"].shape == (LENGTH,)
        assert np.argmax(mean) == LENGTH // 2
        np.testing.assert_allclose(mean[1:], mean[1:][::-1], atol=1e-4)


def test_recipe_table_reads_loss_at_fixed_minutes_and_ranks_at_the_shared_horizon(tmp_path):
    from posenc.runtime.tblog import RunLogger

    def fake_run(name: str, curve: dict[int, float]) -> None:
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text("pe: {name: sinpe}\n")
        (run / "train_summary.json").write_text(
            json.dumps({"steps": 10, "train_tokens_per_s": 1000.0, "parameters": 1_500_000})
        )
        logger = RunLogger(run / "tb")
        for second, loss in curve.items():
            logger.against_time("valid_loss", loss, second)
        logger.close()

    fake_run("slow", {10: 8.0, 60: 7.0, 120: 6.0})  # ahead at 2 min
    fake_run("fast", {10: 7.0, 60: 6.5, 120: 6.2, 360: 5.0})  # ran longer
    table = runpy.run_path(str(ROOT / "scripts" / "recipe_table.py"))
    rows = table["recipe_rows"](tmp_path, [0.5, 2, 6])
    assert [r["setting"] for r in rows] == ["slow", "fast"]  # ranked at 2 min, not 6
    assert rows[0]["loss"]["0.5"] == pytest.approx(7.6)  # 30 s: between 10 s and 60 s
    assert np.isnan(rows[0]["loss"]["6"]) and rows[1]["loss"]["6"] == pytest.approx(5.0)
    text = table["markdown"](rows, [0.5, 2, 6])
    assert "| `slow` | 7.600 | 6.000 |  | 10 | 1,000 | 1.5M |" in text


def test_lr_search_table_gives_each_encodings_best_rate_and_every_trial(tmp_path):
    searches = {"rope": {0.002: 5.5, 0.004: 5.4}, "sinpe": {0.001: 5.9, 0.003: 6.0}}
    for pe, results in searches.items():
        for lr, loss in results.items():
            run = tmp_path / f"pe={pe}" / f"pe={pe},trainer.lr={lr}"
            run.mkdir(parents=True)
            (run / "train_summary.json").write_text(json.dumps({"best_valid_loss": loss}))
    (tmp_path / "pe=rope" / "pe=rope,trainer.lr=0.009").mkdir()  # unfinished: not listed
    script = runpy.run_path(str(ROOT / "scripts" / "lr_search_table.py"))
    text = script["table"](tmp_path)
    assert "| rope | 0.004 | 5.400 | 0.002: 5.500, 0.004: 5.400 |" in text
    assert "| sinpe | 0.001 | 5.900 | 0.001: 5.900, 0.003: 6.000 |" in text


def test_archive_runs_keeps_finished_runs_as_portable_text_and_restores_without_overwriting(
    tmp_path,
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    checkout = tmp_path / "checkout"
    sweep, archive = checkout / "outputs" / "sweeps" / "compare", tmp_path / "archive"
    files = {
        "config.yaml": f"dir: {checkout}/../shared/data\ncache_dir: {Path.home()}/.cache\n"
        f"vocab_file: {tmp_path}/shared/vocab.txt\n",  # POSENC_DATA set to the shared folder
        "metrics.json": "{}",
        "train_summary.json": "{}",
        "hypotheses.test.txt": "a\n",
        "references.test.txt": "the reference\n",
        "scalars.csv": "tag,step,value,wall_time\n",
        "evals/beam5/metrics.json": "{}",
        "evals/beam5/eval_config.yaml": "seed: 0\n",
        "checkpoints/last.pt": "weights",
        "tb/events.out": "events",
        # an evaluation still running writes into a hidden folder renamed when it is complete
        "evals/.beam5.x1y2/hypotheses.test.txt": "half a file",
        "evals/.beam5.x1y2/references.test.txt": "the reference\n",
    }
    for name in ("done", "unfinished"):
        for path, text in files.items():
            if name == "done" or path == "config.yaml":
                (sweep / name / path).parent.mkdir(parents=True, exist_ok=True)
                (sweep / name / path).write_text(text)
    (sweep / "done" / "hypotheses.long.txt").symlink_to(tmp_path / "elsewhere.txt")
    script["save"](sweep, archive)
    kept = sorted(str(p.relative_to(archive)) for p in archive.rglob("*") if p.is_file())
    shared = [p for p in kept if p.startswith("references/")]  # by content, once per archive
    assert len(shared) == 1 and gzip.decompress((archive / shared[0]).read_bytes()) == (
        b"the reference\n"
    )
    per_run = {"done/references.json", *shared}
    bulky = ("hypotheses.test.txt", "scalars.csv")  # kept compressed, the small files as text
    assert [p for p in kept if p not in per_run] == sorted(
        f"done/{p}" + (".gz" if p in bulky else "")
        for p in files
        if not p.startswith(("checkpoints", "tb", "references", "evals/."))
    )
    references = json.loads((archive / "done" / "references.json").read_text())
    assert list(references) == ["references.test.txt"]
    config = (archive / "done" / "config.yaml").read_text()
    assert config == "dir: ../shared/data\ncache_dir: ~/.cache\nvocab_file: ../shared/vocab.txt\n"

    (sweep / "done" / "hypotheses.test.txt").write_text("b\n")  # the run was continued
    (sweep / "done" / "scalars.csv").unlink()  # a file the run lacks stays archived
    script["save"](sweep, archive)
    assert gzip.decompress((archive / "done" / "hypotheses.test.txt.gz").read_bytes()) == b"b\n"
    assert (archive / "done" / "scalars.csv.gz").is_file()

    restored = tmp_path / "restored"
    (restored / "done").mkdir(parents=True)  # a run already there is never overwritten
    script["restore"](archive, restored)
    assert list((restored / "done").iterdir()) == []
    (restored / "done").rmdir()
    script["restore"](archive, restored)
    assert (restored / "done" / "hypotheses.test.txt").read_text() == "b\n"
    assert (restored / "done" / "references.test.txt").read_text() == "the reference\n"


def test_archive_runs_follows_no_link_and_restores_a_run_whole_or_not_at_all(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    sweep, archive = tmp_path / "outputs" / "sweeps" / "s", tmp_path / "archive"
    outside = tmp_path / "outside"
    (outside / "beam5").mkdir(parents=True)
    (outside / "beam5" / "metrics.json").write_text("{}")
    for name in ("a", "b"):
        for path in ("config.yaml", "metrics.json", "train_summary.json", "hypotheses.test.txt"):
            (sweep / name).mkdir(parents=True, exist_ok=True)
            (sweep / name / path).write_text("x\n")
    (sweep / "a" / "evals").symlink_to(outside)  # evals/ itself a link out of the run
    script["save"](sweep, archive)
    assert not (archive / "a" / "evals").exists()
    with open(archive / "b" / "hypotheses.test.txt.gz", "r+b") as handle:
        handle.truncate(script["MAX_FILE_BYTES"] + 1)  # sparse: costs no disk
    restored = tmp_path / "restored"
    script["restore"](archive, restored)
    assert sorted(p.name for p in restored.iterdir()) == ["a"]  # no half-restored b, no leftover
    assert "not restored b:" in capsys.readouterr().out


def test_an_archive_kept_before_compression_restores_and_compresses_to_the_same_runs(tmp_path):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    old, restored = tmp_path / "old", tmp_path / "restored"
    texts = {"config.yaml": "seed: 0\n", "metrics.json": "{}", "train_summary.json": "{}"}
    texts |= {"hypotheses.test.txt": "a translation\n", "scalars.csv": "tag,step\n"}
    for name, text in texts.items():  # as archives were kept before: every file as text
        (old / "run" / name).parent.mkdir(parents=True, exist_ok=True)
        (old / "run" / name).write_text(text)
    (old / "references" / "abc.txt").parent.mkdir()
    (old / "references" / "abc.txt").write_text("the reference\n")
    (old / "run" / "references.json").write_text('{"references.test.txt": "abc"}')
    script["restore"](old, restored / "plain")
    script["compress"](old)
    assert (old / "run" / "hypotheses.test.txt.gz").is_file()
    assert not (old / "run" / "hypotheses.test.txt").exists()
    assert (old / "run" / "config.yaml").read_text() == "seed: 0\n"
    assert (old / "references" / "abc.txt.gz").is_file()
    script["restore"](old, restored / "packed")
    for name in [*texts, "references.test.txt"]:
        plain = (restored / "plain" / "run" / name).read_bytes()
        assert (restored / "packed" / "run" / name).read_bytes() == plain
    before = {p: p.read_bytes() for p in old.rglob("*.gz")}
    script["compress"](old)  # again: nothing changes, byte for byte
    assert {p: p.read_bytes() for p in old.rglob("*.gz")} == before


def test_a_packed_file_that_unpacks_past_the_cap_is_refused(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    archive = tmp_path / "archive"
    for name in ("config.yaml", "metrics.json", "train_summary.json"):
        (archive / "run").mkdir(parents=True, exist_ok=True)
        (archive / "run" / name).write_text("{}")
    cap = script["MAX_FILE_BYTES"]
    (archive / "run" / "hypotheses.test.txt.gz").write_bytes(gzip.compress(b"x" * (cap + 1)))
    script["restore"](archive, tmp_path / "restored")
    assert "unpacks to more than" in capsys.readouterr().out
    assert not (tmp_path / "restored" / "run").exists()
