"""Encodings are known by their configs and classes alone: adding one is a module in
``posenc.model.encodings``, a ``configs/pe/NAME.yaml`` and a test file. The tools take from the
encoding classes what they need (the benchmark's speed targets, the plots' panels), the catalog
puts the configured reference encoding first, and the sweeping presets cover every config.

The fake encodings below are named nowhere else: what the tools do with them, they do for any
new encoding."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import PE_NAMES, ROOT
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from hydra.utils import get_class
from omegaconf import OmegaConf
from torch import Tensor

from posenc.analysis import plot_pe
from posenc.analysis.bench import render
from posenc.analysis.bench import runner as bench
from posenc.config import ModelConfig, plain, reference_encoding
from posenc.model.encodings.base import AttentionCall, AttentionRule, StackEncoding
from posenc.model.encodings.rotary import RotaryEncoding
from posenc.model.encodings.rotation import RotaryRule
from posenc.model.factory import build_model, encoding_names

CONFIGS = ROOT / "configs"
LENGTH = 12


def encoding_class(name: str) -> type[StackEncoding]:
    """The class that ``configs/pe/NAME.yaml`` builds."""
    return get_class(OmegaConf.load(CONFIGS / "pe" / f"{name}.yaml")._target_)


def fake_catalog(tmp_path, reference: str, encodings: dict[str, str]):
    """A config directory whose ``train.yaml`` sets ``reference_pe`` and whose ``pe/`` holds
    ``{name: class path}``."""
    (tmp_path / "pe").mkdir()
    (tmp_path / "train.yaml").write_text(f"reference_pe: {reference}\n")
    for name, target in encodings.items():
        (tmp_path / "pe" / f"{name}.yaml").write_text(f"name: {name}\n_target_: {target}\n")
    return tmp_path


# ---------------------------------------------------------------- the benchmark's speed targets


class CheapEncoding(StackEncoding):
    """An encoding the benchmark has never heard of, with its own speed target."""

    speed_target = 1.23


def test_every_encoding_but_the_reference_declares_its_speed_target():
    reference = reference_encoding()
    for name in PE_NAMES:
        target = encoding_class(name).speed_target
        if name == reference:
            assert target is None, f"{name} is the reference: it has no target of its own"
        else:
            assert isinstance(target, float) and target >= 1.0, name


def test_the_benchmark_reads_each_target_from_the_encoding_class(tmp_path):
    catalog = fake_catalog(
        tmp_path,
        "plain",
        {
            "plain": "posenc.model.encodings.base.StackEncoding",
            "cheap": f"{__name__}.CheapEncoding",
        },
    )
    assert bench.speed_target("cheap", catalog) == 1.23
    assert bench.speed_target("plain", catalog) is None
    assert bench.speed_target("absent", catalog) is None
    for name in PE_NAMES:
        assert bench.speed_target(name) == encoding_class(name).speed_target


def test_the_benchmark_measures_against_the_configured_reference_and_prints_its_name():
    assert bench.BenchSettings(encodings=[]).reference == reference_encoding()
    settings = bench.BenchSettings(encodings=["cheap"], reference="plain")
    assert settings.encodings == ["plain", "cheap"]  # the reference is always measured

    samples = {"train": {"plain": {"128": [1.0, 2.0]}, "cheap": {"128": [1.2, 2.4]}}}
    summary = bench.summarise(samples, "plain")
    assert summary["train"]["cheap"]["128"]["ratio"] == pytest.approx(1.2)
    result = {
        "settings": {
            "reference": "plain",
            "lengths": [128],
            "model": "tiny",
            "vocab_size": 50,
            "tokens": 128,
            "decode_batch": 2,
            "repeats": 2,
            "warmup": 1,
        },
        "machine": {"torch": "x", "torch_threads": 1, "cpus_available": 1, "load_average": None},
        "parameters": {"plain": 1000, "cheap": 1000},
        "targets": {"max_ratio": {"cheap": 1.23}},
        "summary": summary,
        "memory_mb": None,
        "errors": {},
    }
    report = render.markdown(result)
    assert "(1,000 parameters with plain)" in report
    assert "ratio to plain measured in the same run" in report
    assert re.search(r"\| cheap \| [\d.]+ \(1\.20\) \| <= 1\.23 \| pass \|", report)
    assert re.search(r"\| plain \| [\d.]+ \(1\.00\) \| - \| - \|", report)


# ---------------------------------------------------------------- the catalog's order


def test_the_catalog_lists_the_configured_reference_first_then_alphabetically(tmp_path):
    target = "posenc.model.encodings.base.StackEncoding"
    catalog = fake_catalog(tmp_path, "middle", dict.fromkeys(["zeta", "middle", "alpha"], target))
    assert encoding_names(catalog) == ["middle", "alpha", "zeta"]
    (catalog / "train.yaml").write_text("reference_pe: zeta\n")
    assert encoding_names(catalog) == ["zeta", "alpha", "middle"]
    assert encoding_names()[0] == reference_encoding()


# ---------------------------------------------------------------- the plots' panels


class DeclaresRotation(AttentionRule):
    """Not a rotary rule by class, but it declares that it rotates q and k."""

    rotates_qk = True


class DeclaresRotationEncoding(StackEncoding):
    def self_rule(self, layer: int) -> AttentionRule:
        return DeclaresRotation()


class SilentRotaryRule(RotaryRule):
    """A rotary rule by class that declares no rotation."""

    rotates_qk = False


class SilentRotaryEncoding(RotaryEncoding):
    def self_rule(self, layer: int) -> AttentionRule:
        return SilentRotaryRule()


class SidedBias(AttentionRule):
    """A bias of ``-(i - j)`` on keys at or before the query, and the declared mask -100 on the
    keys after it."""

    masking_bias = -100.0

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        distance = (call.q_pos[:, None] - call.k_pos[None, :]).float()
        return torch.where(distance >= 0, -distance, torch.full_like(distance, -100.0))[None, None]


class SidedBiasEncoding(StackEncoding):
    def self_rule(self, layer: int) -> AttentionRule:
        return SidedBias()


def plotted(encoding: type[StackEncoding]) -> dict[str, np.ndarray]:
    """The arrays ``plot_pe`` draws for a tiny model with ``encoding``."""
    cfg = OmegaConf.create(
        {
            "model": OmegaConf.load(CONFIGS / "model" / "tiny.yaml"),
            "pe": {"name": "fake", "_target_": f"{encoding.__module__}.{encoding.__qualname__}"},
        }
    )
    model = build_model(ModelConfig.of(cfg.model), plain(cfg.pe), 40, 0, 1, 2)
    return plot_pe.encoding_view("fake", LENGTH, model).arrays()


def test_the_rotary_panel_follows_the_rules_declaration_not_its_class():
    declared = plotted(DeclaresRotationEncoding)
    for site in ("encoder", "decoder"):
        assert declared[f"{site}_rotary_score"].shape == (LENGTH,)
        assert declared[f"{site}_rotary_mean"].shape == (LENGTH,)
    silent = plotted(SilentRotaryEncoding)
    assert not any("rotary" in key for key in silent)
    assert not any("rotary" in key for key in plotted(StackEncoding))


def test_the_bias_panel_leaves_out_what_the_rule_declares_a_mask():
    bias = plotted(SidedBiasEncoding)["encoder_bias"]  # query LENGTH // 2
    distance = LENGTH // 2 - np.arange(LENGTH)
    np.testing.assert_allclose(bias[:, distance >= 0], -np.tile(distance[distance >= 0], (4, 1)))
    assert np.isnan(bias[:, distance < 0]).all()


# ---------------------------------------------------------------- the presets' sweeps


def sweep_jobs(*overrides: str) -> list[dict[str, str]]:
    """The jobs ``python train.py -m OVERRIDES`` launches with Hydra's basic sweeper (the
    preset's ``hydra.sweeper.params`` first, the command line replacing them key by key), each
    as ``{key: value}`` of its sweep overrides."""
    import posenc.job  # noqa: F401  (registers the config resolvers)

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        cfg = loader.load_configuration("train", list(overrides), RunMode.MULTIRUN)
        params = [f"{key}={value}" for key, value in (cfg.hydra.sweeper.params or {}).items()]
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(
            params + list(overrides)
        )
        jobs = BasicSweeper.split_arguments(parsed, None)[0]
    return [dict(item.split("=", 1) for item in job) for job in jobs]


@pytest.mark.parametrize("preset", ["compare", "extrapolation"])
def test_presets_that_compare_every_encoding_sweep_every_config(preset):
    jobs = sweep_jobs(f"experiment={preset}")
    assert sorted({job["pe"] for job in jobs}) == PE_NAMES


@pytest.mark.parametrize("preset", ["demo", "demo_toy", "compare_long", "seed_report"])
def test_presets_with_a_subset_sweep_configured_encodings_with_the_reference(preset):
    swept = {job["pe"] for job in sweep_jobs(f"experiment={preset}")}
    assert swept <= set(PE_NAMES) and reference_encoding() in swept


def test_a_command_line_pe_list_replaces_the_presets():
    chosen = PE_NAMES[:2]
    for preset in ("demo_toy", "demo", "compare_long"):
        jobs = sweep_jobs(f"experiment={preset}", "pe=" + ",".join(chosen))
        assert sorted(job["pe"] for job in jobs if job.get("seed", "0") == "0") == chosen


def test_the_makefile_and_the_study_script_name_no_encoding():
    names = re.compile(r"\b(" + "|".join(map(re.escape, PE_NAMES)) + r")\b")
    for path in (ROOT / "Makefile", ROOT / "scripts" / "run_study.sh"):
        assert not names.findall(path.read_text()), path
