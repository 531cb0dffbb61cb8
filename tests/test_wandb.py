"""Weights & Biases as a logger (``logger.wandb=true``), offline only: W&B is never contacted.

W&B (0.2x) has no Python reader for an offline run's ``.wandb`` file (the old
``wandb.sdk.internal.datastore`` is gone), so :func:`wandb_records` reads it as ``wandb sync``
does: a LevelDB log (32 KiB blocks of CRC-checked chunks) after W&B's 7-byte header, each record
one ``wandb_internal_pb2.Record`` protobuf of wandb's own package.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SMOKE, compose
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc.config import reported_settings
from posenc.job import run
from posenc.runtime.sinks import WANDB_SECONDS, WANDB_STEP, WandbSink

OVERRIDES = (
    *SMOKE,
    "pe=nonepe",
    "trainer.max_steps=10",
    "trainer.log_every=5",
    "trainer.valid_every=5",
    "logger.wandb=true",
)
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)  # ident, magic, version
BLOCK, CHUNK_HEADER = 32768, 7  # LevelDB log: chunk = crc32 (4), length (2), type (1), data
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch) -> Iterator[Path]:
    """W&B offline and silent, its runs (``WANDB_DIR``), settings, cache and data under
    ``tmp_path``; the directory its runs go to. W&B reads them once per process (``wandb.setup``),
    so its set-up is torn down before and after."""
    wandb = pytest.importorskip("wandb")
    wandb.teardown()
    for key in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path / "wandb_home" / key.lower()))
    (tmp_path / "wandb_home" / "wandb_dir").mkdir(parents=True)
    yield tmp_path / "wandb_home" / "wandb_dir"
    wandb.teardown()


def wandb_records(path: Path) -> list:
    """Every record of an offline run's ``run-ID.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[: len(HEADER)] == HEADER
    records, pending, pos = [], b"", len(HEADER)
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a chunk: padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:  # zero padding
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            records.append(wandb_internal_pb2.Record.FromString(pending))
    return records


def offline_runs(root: Path) -> list[Path]:
    """The offline W&B run directories under ``root/wandb``, oldest first."""
    return sorted((root / "wandb").glob("offline-run-*"))


def history(runs: list[Path]) -> dict[str, dict[int, float]]:
    """Tag -> {step: value} over the history rows of ``runs`` (later rows win), each value at
    the step its row holds under ``global_step`` or, for seconds tags, ``train_seconds``."""
    curves: dict[str, dict[int, float]] = {}
    for directory in runs:
        for row in rows(directory):
            key = WANDB_SECONDS if WANDB_SECONDS in row else WANDB_STEP
            for tag, value in row.items():
                if not tag.startswith("_") and tag not in (WANDB_STEP, WANDB_SECONDS):
                    curves.setdefault(tag, {})[row[key]] = value
    return curves


def rows(directory: Path) -> list[dict]:
    """The history rows of an offline W&B run directory, in order."""
    (path,) = directory.glob("run-*.wandb")
    return [
        {
            ".".join(item.nested_key) or item.key: json.loads(item.value_json)
            for item in record.history.item
        }
        for record in wandb_records(path)
        if record.WhichOneof("record_type") == "history"
    ]


def tensorboard(run_dir: Path) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def run_records(directory: Path) -> list:
    (path,) = directory.glob("run-*.wandb")
    return [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]


def test_an_offline_wandb_run_gets_every_scalar_and_the_settings_and_a_resume_continues_it(
    tmp_path, wandb_dir
):
    run_dir = tmp_path / "run"
    cfg = compose(*OVERRIDES)
    run(cfg, run_dir)
    (first,) = offline_runs(wandb_dir)
    assert not (run_dir / "wandb").exists()  # the run directory keeps only the id
    run_id = json.loads((run_dir / "wandb.json").read_text())["run_id"]
    assert first.name.endswith(f"-{run_id}")
    (started,) = run_records(first)
    assert (started.run_id, started.project, started.display_name) == (run_id, "smoke", "run")
    config = {item.key: json.loads(item.value_json) for item in started.config.update}
    config.pop("_wandb", None)
    assert config == reported_settings(cfg)  # what HParams and MLflow get; no logger.*
    assert not any(key.startswith("logger.") for key in config)

    logged = tensorboard(run_dir)
    assert {"train/loss", "valid/loss", "vs_train_seconds/train_loss", "hparam/valid_loss"} <= set(
        logged
    )
    assert history([first]).keys() == logged.keys()
    for tag, curve in history([first]).items():
        assert curve == pytest.approx(logged[tag]), tag

    id_file = (run_dir / "wandb.json").read_text()
    run(compose(*OVERRIDES, "trainer.max_steps=15"), run_dir)  # continued: the same W&B run
    assert (run_dir / "wandb.json").read_text() == id_file
    runs = offline_runs(wandb_dir)
    assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs)
    assert [r.run_id for r in run_records(runs[1])] == [run_id]
    assert sorted(history(runs)["train/loss"]) == [5, 10, 15]
    assert history(runs)["train/loss"] == pytest.approx(tensorboard(run_dir)["train/loss"])


def test_the_sink_gathers_a_steps_scalars_in_one_row_in_the_project_it_is_given(
    tmp_path, wandb_dir
):
    sink = WandbSink("p", "offline", "a run", {"pe.name": "rope"}, tmp_path / "wandb.json")
    for tag, value, step in [("a", 1, 5), ("b", 2, 5), ("vs_train_seconds/a", 3, 5), ("a", 4, 10)]:
        sink.add(tag, value, step)
    sink.add("a", 5, 10)  # the same tag twice at one step: a row each, the later one last
    sink.close()
    (offline_run,) = offline_runs(wandb_dir)
    (started,) = run_records(offline_run)
    assert (started.project, started.display_name) == ("p", "a run")
    assert started.run_id == json.loads((tmp_path / "wandb.json").read_text())["run_id"]
    assert [sorted(k for k in row if not k.startswith("_")) for row in rows(offline_run)] == [
        ["a", "b", WANDB_STEP],
        sorted(["vs_train_seconds/a", WANDB_SECONDS]),
        ["a", WANDB_STEP],
        ["a", WANDB_STEP],
    ]
    assert history([offline_run]) == {"a": {5: 1, 10: 5}, "b": {5: 2}, "vs_train_seconds/a": {5: 3}}


def test_logger_wandb_without_wandb_ends_in_one_line_naming_the_fix_before_training(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit):
        run(compose(*OVERRIDES, "eval.enabled=false", "logger.csv=true"), run_dir)
    message = json.loads((run_dir / "failed.json").read_text())["message"]
    assert message == (
        "logger.wandb=true needs W&B: pip install -e '.[wandb]' (or set logger.wandb=false)"
    )
    assert message in caplog.text
    assert not (run_dir / "checkpoints" / "last.pt").exists()  # no step was trained
    assert not (run_dir / "wandb.json").exists()  # no W&B run id was taken
