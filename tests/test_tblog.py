"""TensorBoard logs of a resumed run read as one curve: no step twice, none missing, in order."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posenc.runtime.tblog import RunLogger, truncate_events


def steps_as_read(log_dir: Path, tag: str = "train/loss") -> list[int]:
    """The steps of ``tag`` in the order TensorBoard reads them."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def log_steps(logger: RunLogger, steps: range) -> None:
    for step in steps:
        logger.scalars(step, {"train/loss": 1.0 / step})
    logger.close()


def test_a_resumed_run_drops_the_steps_after_its_checkpoint(tmp_path):
    log_steps(RunLogger(tmp_path), range(1, 9))
    log_steps(RunLogger(tmp_path, resume_step=5, resume_seconds=0.0), range(6, 11))
    assert steps_as_read(tmp_path) == list(range(1, 11))


def test_a_run_resumed_within_the_second_it_started_is_read_after_it(tmp_path):
    log_steps(RunLogger(tmp_path), range(1, 6))
    # the killed run opened its file this very second, in a process whose id sorts last
    (first,) = tmp_path.glob("events.out.tfevents.*")
    same_second = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.99999999.0"
    first.rename(tmp_path / same_second)
    log_steps(RunLogger(tmp_path, resume_step=5, resume_seconds=0.0), range(6, 11))
    assert steps_as_read(tmp_path) == list(range(1, 11))


def test_time_tags_keep_one_point_per_training_second_across_a_resume(tmp_path):
    logger = RunLogger(tmp_path)
    for seconds in (0.2, 0.7, 1.1, 2.5, 3.9):
        logger.against_time("train_loss", 1.0, seconds)
    logger.close()
    resumed = RunLogger(tmp_path, resume_step=3, resume_seconds=2.5)
    for seconds in (2.9, 3.2, 4.0):
        resumed.against_time("train_loss", 1.0, seconds)
    resumed.close()
    assert steps_as_read(tmp_path, "vs_train_seconds/train_loss") == [0, 1, 2, 3, 4]


def values_as_read(log_dir: Path, tag: str) -> dict[int, float]:
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_a_time_point_is_the_token_weighted_mean_of_every_step_since_the_last(tmp_path):
    logger = RunLogger(tmp_path)
    # (seconds, loss, tokens): the steps ending in the second after point 0 are all counted, the
    # slow last one (the one that crosses into second 1) no more than its tokens say
    for seconds, loss, tokens in (
        (0.1, 9.0, 100),
        (0.4, 4.0, 100),
        (0.6, 2.0, 300),
        (1.5, 6.0, 100),
        (2.2, 3.0, 50),
        (2.3, 5.0, 150),
    ):
        logger.against_time("train_loss", loss, seconds, tokens)
    logger.close()
    points = values_as_read(tmp_path, "vs_train_seconds/train_loss")
    assert list(points) == [0, 1, 2]
    assert points[0] == 9.0
    assert abs(points[1] - (4.0 * 100 + 2.0 * 300 + 6.0 * 100) / 500) < 1e-6
    assert abs(points[2] - 3.0) < 1e-6  # 2.3 waits for the next point, which never comes


def test_event_files_with_nothing_to_drop_are_only_read(tmp_path):
    log_steps(RunLogger(tmp_path), range(1, 6))
    (first,) = tmp_path.glob("events.out.tfevents.*")
    before = first.stat()
    assert truncate_events(tmp_path, max_step=10, max_seconds=10) == 0
    after = first.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_record_cut_short_by_a_kill_is_removed(tmp_path):
    log_steps(RunLogger(tmp_path), range(1, 6))
    (first,) = tmp_path.glob("events.out.tfevents.*")
    whole = first.stat().st_size
    with open(first, "ab") as handle:
        handle.write(b"\x2a\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # a record's first bytes
    assert truncate_events(tmp_path, max_step=10, max_seconds=10) == 0
    assert first.stat().st_size == whole
    assert steps_as_read(tmp_path) == list(range(1, 6))
