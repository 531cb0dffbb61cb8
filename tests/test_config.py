"""Each config group has one typed description (``posenc.config``): every YAML of the group fits
it key for key, and it refuses what does not fit with one line."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from conftest import ROOT, compose
from omegaconf import OmegaConf

from posenc.config import (
    EvalConfig,
    LoggerConfig,
    ModelConfig,
    RunSettings,
    TrainerConfig,
    check_types,
    flatten,
    unknown_setting,
)
from posenc.config.settings import Settings
from posenc.model.encodings import SHARED_SETTINGS

GROUP_FILES = [
    (group, path)
    for group in (ModelConfig, TrainerConfig, EvalConfig)
    for path in sorted((ROOT / "configs" / group.GROUP).glob("*.yaml"))
]


@pytest.mark.parametrize(("group", "path"), GROUP_FILES, ids=lambda x: getattr(x, "stem", ""))
def test_every_yaml_of_a_group_has_exactly_the_described_keys(group, path):
    node = OmegaConf.load(path)
    assert sorted(node) == sorted(f.name for f in fields(group))
    assert group.of(node) is not None


def test_the_top_level_keys_of_train_yaml_are_described():
    top = OmegaConf.load(ROOT / "configs" / "train.yaml")
    scalars = {k for k in top if k not in ("defaults", "hydra", "logger", "pe")}
    assert scalars == {f.name for f in fields(RunSettings)}
    assert set(top.logger) == {f.name for f in fields(LoggerConfig)}
    assert tuple(top.pe) == SHARED_SETTINGS  # what every encoding accepts, under its own keys


def test_a_whole_config_is_checked_group_by_group_and_absent_keys_are_tolerated():
    """``check_types`` (run start, standalone evaluation of older runs) refuses a bad value in
    any typed group and passes over keys an older config does not have."""
    assert check_types({"model": {"d_model": 64}, "trainer": {}}) is None
    for bad, message in [
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"model": {"d_model": 1.5}}, "model.d_model=1.5 must be an integer >= 1"),
        ({"trainer": {"precision": "fp16"}}, "trainer.precision='fp16' must be one of auto"),
        ({"eval": {"checkpoint": "first"}}, "eval.checkpoint='first' must be one of best, last"),
        ({"eval": {"splits": []}}, "eval.splits=[] must be a list of at least 1 item(s)"),
    ]:
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            check_types(bad)


def test_a_group_refuses_an_unknown_a_missing_or_a_bad_value_in_one_line():
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "model" / "cpu.yaml"))
    with pytest.raises(
        ValueError,
        match=r"^model.d_modle is not among the model settings; did you mean "
        r"model.d_model\?$",
    ):
        ModelConfig.of({**node, "d_modle": 64})
    with pytest.raises(
        ValueError, match=r"^model.zzz is not among the model settings; the settings are "
    ):
        ModelConfig.of({**node, "zzz": 64})
    with pytest.raises(ValueError, match=r"^model.d_ff is missing"):
        ModelConfig.of({k: v for k, v in node.items() if k != "d_ff"})
    with pytest.raises(ValueError, match=r"^model.dropout=1.5 must be a number in \[0, 1\)$"):
        ModelConfig.of({**node, "dropout": 1.5})


def test_a_group_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match=r"^model.n_heads=0 must be an integer >= 1$"):
        ModelConfig(d_model=8, n_heads=0, d_ff=8, encoder_layers=1, decoder_layers=1, dropout=0.0)


def test_the_trainer_budget_is_steps_or_seconds_whichever_comes_first():
    default = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "trainer" / "default.yaml"))
    both = TrainerConfig.of({**default, "max_steps": 10, "max_time": 5.0})
    assert not both.budget_spent(9, 4.9)
    assert both.budget_spent(10, 0.0) and both.budget_spent(3, 5.0)
    steps_only = TrainerConfig.of({**default, "max_steps": 10, "max_time": None})
    assert not steps_only.budget_spent(9, 1e9)


def test_flatten_joins_keys_with_dots_and_keeps_lists_and_empty_mappings():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == {"a.b": 1, "a.c": [1, 2], "d": {}}


def test_an_override_of_no_typed_setting_is_named_with_the_closest_one():
    assert unknown_setting("trainer.max_stepz") == (
        "trainer.max_stepz is not among the trainer settings; did you mean trainer.max_steps?"
    )
    assert unknown_setting("+eval.beam_sise") == (
        "eval.beam_sise is not among the eval settings; did you mean eval.beam_size?"
    )
    for known in ("trainer.max_steps", "eval.bertscore.model", "data.dir", "pe.base", "seed"):
        assert unknown_setting(known) is None


def test_a_misspelt_option_of_a_group_is_named_with_the_closest_option():
    from posenc.config.options import unknown_option

    assert unknown_option("experiment", "smok").startswith(
        "experiment=smok is no option of experiment; did you mean experiment=smoke?"
    )
    assert unknown_option("pe", "rope,alibbi").startswith("pe=alibbi is no option of pe")
    for group, value in (("pe", "rope,alibi"), ("experiment", "null"), ("pe", "choice(rope)")):
        assert unknown_option(group, value) is None
    assert unknown_option("seed", "smok") is None  # no group


def test_a_key_no_option_of_an_untyped_group_has_is_named_with_the_closest_one():
    from posenc.config.options import unknown_key

    assert unknown_key("pe.bas") == (
        "pe.bas is not among the pe settings of any pe option; did you mean pe.base?"
    )
    assert unknown_key("data.holdout.tatoeba.sise") is None  # a nested key of a known one
    for known in ("pe.off_layers", "pe.encoder_bias", "data.dir", "tokenizer.vocab_size"):
        assert unknown_key(known) is None
    assert unknown_key("+pe.my_own") is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('pe.base=${oc.decode:"[1,2"}', r'^pe.base=\$\{oc.decode:"\[1,2"\} cannot be resolved'),
        ("trainer.lr=${nope.x}", r"^trainer.lr=\$\{nope.x\} cannot be resolved \(Interpolation"),
    ],
)
def test_an_interpolation_that_cannot_be_resolved_is_one_line_naming_its_key(override, message):
    from posenc.training.setup import check_config

    with pytest.raises(ValueError, match=message) as refused:
        check_config(Settings.of(compose("experiment=smoke", override)))
    assert "\n" not in str(refused.value) and str(refused.value).endswith("give a plain value")
