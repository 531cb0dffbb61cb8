"""The benchmark and plotting scripts: they run for the encodings in ``configs/pe`` and write
what they promise (tiny models, a few positions: seconds)."""

from __future__ import annotations

import io
import json
import os
import runpy
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import PE_NAMES, ROOT

from posenc.analysis import plot_pe
from posenc.analysis.bench import measure
from posenc.analysis.bench import runner as bench
from posenc.model.factory import build_named_model, encoding_names, select_encodings

PLOTTED = [name for name in ("nonepe", "sinpe", "alibi", "rope", "comrope") if name in PE_NAMES]


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


def archive_members(archive: Path) -> dict[str, bytes]:
    """The members of an archive, read with nothing but the standard library."""
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def tar_xz(path: Path, members: list[tarfile.TarInfo], bodies: list[bytes]) -> None:
    """Write an archive of ``members`` as a stranger might (any type, path or size)."""
    with tarfile.open(path, "w:xz") as tar:
        for member, body in zip(members, bodies, strict=True):
            tar.addfile(member, io.BytesIO(body) if member.isfile() else None)


def test_archive_runs_keeps_finished_runs_as_portable_text_and_restores_without_overwriting(
    tmp_path,
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    checkout = tmp_path / "checkout"
    sweep, archive = checkout / "outputs" / "sweeps" / "compare", tmp_path / "compare.tar.xz"
    files = {
        "config.yaml": f"dir: {checkout}/../shared/data\ncache_dir: {Path.home()}/.cache\n"
        f"vocab_file: {tmp_path}/shared/vocab.txt\n",  # POSENC_DATA set to the shared folder
        "metrics.json": "{}",
        "train_summary.json": "{}",
        "hypotheses.test.txt": "a\n",
        "references.test.txt": "the reference\n",
        "scalars.csv": "tag,step,value,wall_time\n",
        "valid_losses.tsv": "source_tokens\tnll\ttarget_tokens\n",
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
    kept = archive_members(archive)
    shared = [p for p in kept if p.startswith("references/")]  # by content, once per archive
    assert len(shared) == 1 and kept[shared[0]] == b"the reference\n"
    assert sorted(p for p in kept if p not in {"done/references.json", *shared}) == sorted(
        f"done/{p}"
        for p in files
        if not p.startswith(("checkpoints", "tb", "references", "evals/."))
    )
    assert list(json.loads(kept["done/references.json"])) == ["references.test.txt"]
    config = kept["done/config.yaml"].decode()
    assert config == "dir: ../shared/data\ncache_dir: ~/.cache\nvocab_file: ../shared/vocab.txt\n"

    (sweep / "done" / "hypotheses.test.txt").write_text("b\n")  # the run was continued
    (sweep / "done" / "scalars.csv").unlink()  # a file the run lacks stays archived
    script["save"](sweep, archive)
    assert archive_members(archive)["done/hypotheses.test.txt"] == b"b\n"
    assert "done/scalars.csv" in archive_members(archive)

    restored = tmp_path / "restored"
    (restored / "done").mkdir(parents=True)  # a run already there is never overwritten
    script["restore"](archive, restored)
    assert list((restored / "done").iterdir()) == []
    (restored / "done").rmdir()
    script["restore"](archive, restored)
    assert (restored / "done" / "hypotheses.test.txt").read_text() == "b\n"
    assert (restored / "done" / "references.test.txt").read_text() == "the reference\n"
    assert not (restored / "done" / "references.json").exists()


def test_runs_trained_but_not_evaluated_are_archived_only_when_asked(tmp_path):
    """A GPU call whose time ran out after training: the curves and validation losses are the
    results there are, and ``--trained`` keeps them; by default only finished runs are kept."""
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    sweep = tmp_path / "outputs" / "sweeps" / "depth"
    for name in ("scored", "trained"):
        for path in ("config.yaml", "train_summary.json", "scalars.csv", "valid_losses.tsv"):
            (sweep / name).mkdir(parents=True, exist_ok=True)
            (sweep / name / path).write_text(f"{name} {path}\n")
    (sweep / "scored" / "metrics.json").write_text("{}")
    (sweep / "trained" / "hypotheses.test.txt").write_text("an evaluation cut short\n")
    (sweep / "half" / "config.yaml").parent.mkdir()
    (sweep / "half" / "config.yaml").write_text("still training\n")
    default, trained = tmp_path / "default.tar.xz", tmp_path / "trained.tar.xz"
    script["save"](sweep, default)
    script["save"](sweep, trained, trained=True)
    assert {name.split("/")[0] for name in archive_members(default)} == {"scored"}
    assert {name.split("/")[0] for name in archive_members(trained)} == {"scored", "trained"}
    assert "trained/hypotheses.test.txt" not in archive_members(trained)
    script["restore"](trained, tmp_path / "restored")
    assert (
        tmp_path / "restored" / "trained" / "scalars.csv"
    ).read_text() == "trained scalars.csv\n"


def test_an_archive_is_the_same_bytes_for_the_same_runs_and_rewritten_only_when_they_change(
    tmp_path,
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    sweep = tmp_path / "outputs" / "sweeps" / "s"
    for name in ("b", "a"):
        for path in ("config.yaml", "metrics.json", "train_summary.json", "hypotheses.test.txt"):
            (sweep / name).mkdir(parents=True, exist_ok=True)
            (sweep / name / path).write_text(f"{name} {path}\n")
    first, second = tmp_path / "first.tar.xz", tmp_path / "second.tar.xz"
    script["save"](sweep, first)
    time.sleep(1.1)  # a time stamp, were one written, would differ
    script["save"](sweep, second)
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first, "r:xz") as tar:  # alike files side by side, no owner or time
        assert tar.getnames() == [
            f"{r}/{f}"
            for f in ("config.yaml", "hypotheses.test.txt", "metrics.json", "train_summary.json")
            for r in "ab"
        ]
        assert {(m.mtime, m.uid, m.uname, m.mode) for m in tar} == {(0, 0, "", 0o644)}
    os.utime(first, (0, 0))
    script["save"](sweep, first)  # nothing changed: the file is not written again
    assert first.stat().st_mtime == 0
    killed = tmp_path / ".third.tar.xz.x1y2.tmp"  # what a save killed with -9 leaves
    killed.write_bytes(b"half")
    script["save"](sweep, tmp_path / "third.tar.xz")
    assert not killed.exists() and (tmp_path / "third.tar.xz").read_bytes() == first.read_bytes()


def test_a_stranger_archive_restores_no_link_no_path_outside_and_no_oversized_file(
    tmp_path, capsys
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    members, bodies = [], []
    for run in ("good", "link", "climbs", "absolute", "badmap", "double", "absmap"):
        for name in ("config.yaml", "metrics.json", "train_summary.json"):
            members.append(tarfile.TarInfo(f"{run}/{name}"))
            members[-1].size = 3
            bodies.append(b"{}\n")
    link = tarfile.TarInfo("link/hypotheses.test.txt")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    climbs = tarfile.TarInfo("climbs/../../outside.txt")
    absolute = tarfile.TarInfo("/absolute/hypotheses.test.txt")
    badmap = tarfile.TarInfo("badmap/references.json")
    badmap.size = len(b'{"../../x.txt": "abc"}')
    # a doubled slash that a path library folds away, then an absolute path
    double = tarfile.TarInfo(f"double/{tmp_path / 'escape.txt'}")
    double.size = 3
    absmap_body = json.dumps({str(tmp_path / "mapped.txt"): "abc"}).encode()
    absmap = tarfile.TarInfo("absmap/references.json")
    absmap.size = len(absmap_body)
    shared = tarfile.TarInfo("references/abc.txt")
    shared.size = 3
    for member, body in (
        (link, b""),
        (climbs, b""),
        (absolute, b""),
        (badmap, b'{"../../x.txt": "abc"}'),
        (double, b"{}\n"),
        (absmap, absmap_body),
        (shared, b"ref"),
    ):
        members.append(member)
        bodies.append(body[: member.size])
    archive = tmp_path / "s.tar.xz"
    tar_xz(archive, members, bodies)
    restored = tmp_path / "deep" / "restored"
    script["restore"](archive, restored)
    out = capsys.readouterr().out
    assert sorted(p.name for p in restored.iterdir()) == ["absolute", "good"]
    for run in ("link", "climbs", "badmap", "double", "absmap"):
        assert f"not restored {run}:" in out
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "x.txt").exists()
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "mapped.txt").exists()


def test_twin_members_and_a_name_with_a_newline_leave_their_runs_out_in_one_line_each(
    tmp_path, capsys
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    members, bodies = [], []
    for run in ("good", "twin", "forged\nrestored everything"):
        for name in ("config.yaml", "metrics.json", "train_summary.json"):
            members.append(tarfile.TarInfo(f"{run}/{name}"))
            members[-1].size = 3
            bodies.append(b"{}\n")
    second = tarfile.TarInfo("twin/config.yaml")  # the later would win silently
    second.size = 3
    members.append(second)
    bodies.append(b"x: 1"[:3])
    archive = tmp_path / "s.tar.xz"
    tar_xz(archive, members, bodies)
    script["restore"](archive, tmp_path / "restored")
    lines = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in (tmp_path / "restored").iterdir()) == ["good"]
    assert "not restored twin: two members are named twin/config.yaml" in lines
    forged = [line for line in lines if line.startswith("not restored forged")]
    assert forged == [
        "not restored forged\\nrestored everything: forged\\nrestored everything/config.yaml "
        "holds a control character"
    ]
    assert "restored everything" not in [line.strip() for line in lines]


def test_a_save_that_cannot_be_written_says_so_and_claims_nothing(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    sweep = tmp_path / "outputs" / "sweeps" / "s"
    for path in ("config.yaml", "metrics.json", "train_summary.json", "hypotheses.test.txt"):
        (sweep / "a").mkdir(parents=True, exist_ok=True)
        (sweep / "a" / path).write_text(f"a {path}\n")
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    with pytest.raises(SystemExit) as stopped:
        script["save"](sweep, blocked / "s.tar.xz")
    assert str(stopped.value.code).startswith(f"archive_runs: cannot write {blocked / 's.tar.xz'}")
    assert "archived" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="archive_runs: cannot make"):
        script["restore"](tmp_path / "none.tar.xz", blocked / "restored")


def test_an_oversized_member_leaves_its_run_out_and_a_broken_archive_is_refused_in_one_line(
    tmp_path, capsys, monkeypatch
):
    script = runpy.run_path(str(ROOT / "scripts" / "archive_runs.py"))
    monkeypatch.setitem(script["restore"].__globals__, "MAX_FILE_BYTES", 1_000)
    sweep = tmp_path / "sweep"
    members, bodies = [], []
    for run in ("good", "big"):
        for name in ("config.yaml", "metrics.json", "train_summary.json"):
            members.append(tarfile.TarInfo(f"{run}/{name}"))
            members[-1].size = 3
            bodies.append(b"{}\n")
    archive = tmp_path / "s.tar.xz"
    with tarfile.open(archive, "w:xz", preset=0) as tar:
        for member, body in zip(members, bodies, strict=True):
            tar.addfile(member, io.BytesIO(body))
        big = tarfile.TarInfo("big/hypotheses.test.txt")
        big.size = 1_001
        tar.addfile(big, io.BytesIO(bytes(big.size)))
    script["restore"](archive, sweep)
    assert sorted(p.name for p in sweep.iterdir()) == ["good"]
    assert "not restored big: big/hypotheses.test.txt is larger than" in capsys.readouterr().out

    archive.write_bytes(archive.read_bytes()[:200])  # cut short
    with pytest.raises(SystemExit, match=r"s\.tar\.xz: is no xz-compressed tar file .*; restore"):
        script["restore"](archive, tmp_path / "other")
    capsys.readouterr()
    with pytest.raises(SystemExit):  # an archive in the folder form kept before
        script["main"](["restore", str(tmp_path / "runs" / "compare"), str(sweep)])
    assert "compare is no archive: name one file per sweep, SWEEP.tar.xz" in capsys.readouterr().err
