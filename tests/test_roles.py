"""Each setting's role is declared once (:mod:`posenc.config.roles`): the lists of keys that
identity, reports and run directory names use are derived from it, and Hydra's own list of keys
left out of directory names is the same set."""

from __future__ import annotations

from conftest import ROOT, compose
from omegaconf import OmegaConf

from posenc.config import RUN_CONTROL_KEYS, UNREPORTED_KEYS, flatten, plain
from posenc.config.identity import BUDGET_KEYS, FILE_SETTINGS, training_identity
from posenc.config.roles import ROLES, Role, keys_with


def test_hydras_exclude_keys_are_read_from_the_roles():
    train = OmegaConf.load(ROOT / "configs" / "train.yaml")
    excluded = train.hydra.job.config.override_dirname.exclude_keys
    assert list(excluded) == sorted(keys_with(Role.NAMELESS)) and "trainer.max_steps" in excluded


def test_every_declared_setting_exists():
    settings = set(flatten(plain(compose()))) | set(flatten(plain(compose("tokenizer=mbert"))))
    hydra_choices = {"experiment"}  # a config group chosen on the command line, not a setting
    assert sorted(set(ROLES) - settings - hydra_choices) == []


def test_the_lists_are_the_declared_roles():
    assert keys_with(Role.RUN_CONTROL) == RUN_CONTROL_KEYS and "seed" in RUN_CONTROL_KEYS
    assert "data.dir" in UNREPORTED_KEYS & FILE_SETTINGS
    assert "trainer.max_steps" in BUDGET_KEYS


def test_a_budget_or_run_control_setting_leaves_a_runs_identity_as_it_was():
    base = plain(compose())
    changed = plain(compose("trainer.max_steps=7", "threads=3", "trainer.progress=false"))
    assert training_identity(changed) == training_identity(base)
    assert training_identity(plain(compose("trainer.lr=0.5"))) != training_identity(base)
