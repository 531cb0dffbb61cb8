"""A run retrained from its own saved settings (``scripts/rerun.py RUN NEW``) trains what the
run trained: the same logged losses and validation losses."""

from __future__ import annotations

import csv

import pytest
from conftest import SMOKE, compose, run_script

from posenc.job import run

TRAIN = (*SMOKE, "pe=rope", "trainer.max_steps=10", "eval.enabled=false", "logger.csv=true")


def losses(run_dir) -> list[tuple[str, str, str]]:
    """The logged losses against steps, ``(tag, step, value)`` (``scalars.csv``'s ``train/loss``,
    ``train/nll`` and validation rows; times and speeds differ from run to run)."""
    with (run_dir / "scalars.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    wanted = ("train/loss", "train/nll", "valid/")
    return [(r["tag"], r["step"], r["value"]) for r in rows if r["tag"].startswith(wanted)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rerun") / "pe=rope"
    run(compose(*TRAIN), run_dir)
    return run_dir


def test_a_rerun_trains_what_the_run_trained(trained, tmp_path):
    done = run_script("rerun", trained, tmp_path / "again")
    assert done.returncode == 0, done.stderr
    assert losses(trained) and losses(tmp_path / "again") == losses(trained)
    assert "step 10/10" in (tmp_path / "again" / "train.log").read_text()


def test_a_rerun_over_its_own_run_or_with_an_unknown_key_is_one_line(trained, tmp_path):
    itself = run_script("rerun", trained, trained)
    assert itself.returncode != 0
    assert itself.stderr.strip() == f"rerun: NEW_DIR is {trained} itself; give a new folder"
    typo = run_script("rerun", trained, tmp_path / "typo", "trainer.max_stepz=3")
    assert typo.returncode != 0 and len(typo.stderr.strip().splitlines()) == 1
    assert "max_stepz" in typo.stderr
    assert run_script("rerun", tmp_path / "nothing", tmp_path / "new").returncode != 0
