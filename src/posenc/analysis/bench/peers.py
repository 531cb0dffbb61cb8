"""Peers of the benchmark (``scripts/bench.py --peers``): other implementations timed in the
encodings' own repetitions, each slot rotated with the encodings' (:func:`.runner.run_timing`),
warmed up first and timed with garbage collection off, like them.

What each peer is, and which encodings it is compared with (``configs/bench/peers.yaml``):

* **torch**: a plain ``torch.nn.Transformer`` of the ``--model`` shape
  (:class:`.peer_models.TorchTransformer`), its training step on the same batches at every
  length; every encoding's training step is given as a ratio to it (the target: at most
  ``torch.max_ratio``);
* **seed**: the seed report's approach at its own setting (:mod:`.seed_model`: model
  ``seed.model``, batches of ``seed.batch`` sentences of ``seed.length`` tokens), each of its
  variants beside posenc's encoding that ``seed.compare`` names, built at the same setting: the
  training step (posenc's as a ratio to the seed's) and greedy decoding of the same sources into
  ``seed.length`` tokens, the seed's re-running the whole prefix per token, posenc's cached; the
  decoding speed-up is the seed's time over posenc's (target: at least
  ``seed.min_decode_speedup``). Both are timed in every repetition of every length;
* **x_transformers** (when installed): ``x_transformers.XTransformer`` of the ``--model`` shape
  with the options ``x_transformers.variants`` gives each encoding
  (:class:`.peer_models.XTransformerPeer`), its training step on the same batches; posenc's
  step is given as a ratio to it (target: at most ``x_transformers.max_ratio``). When it is not
  installed, one line says how to install it.

Every peer model is seeded with ``--seed`` and trained by posenc's own step
(:class:`.runner.Trainer`: label smoothing, clipping and AdamW of
``configs/trainer/default.yaml``).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from omegaconf import OmegaConf

from posenc.analysis.bench.measure import random_tokens
from posenc.analysis.bench.peer_models import (
    XT_INSTALL,
    TorchTransformer,
    XTransformerPeer,
    xt_options,
    xt_version,
)
from posenc.analysis.bench.runner import (
    BenchSettings,
    Trainer,
    Unit,
    Workload,
    build_workload,
    count_decoder_calls,
    training_batch,
)
from posenc.analysis.bench.seed_model import SeedTransformer
from posenc.config import CONFIG_DIR, ModelConfig
from posenc.model.factory import BOS_ID, PAD_ID
from posenc.model.seq2seq import count_parameters

log = logging.getLogger("posenc.analysis.bench")

PEERS_CONFIG = CONFIG_DIR / "bench" / "peers.yaml"
TORCH_DIFFERENCES = (
    "same parameters as posenc's model of the shape (reference encoding), except 4 * d_model "
    "more with norm_first: false (nn.Transformer's final LayerNorm per stack); attention "
    "projections in one packed matrix instead of q and kv; same loss, clipping and AdamW"
)


def load_spec(path=PEERS_CONFIG) -> dict[str, Any]:
    """``configs/bench/peers.yaml`` as plain Python."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def model_config(name: str) -> ModelConfig:
    """``configs/model/NAME.yaml``, checked."""
    return ModelConfig.of(OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml"))


@dataclass
class SeedWorkload(Trainer):
    """The seed re-implementation's training step and uncached greedy decoding."""

    model: SeedTransformer

    def decode(self, src: torch.Tensor, length: int) -> None:
        """Exactly ``length`` greedy tokens per row, each re-running the whole prefix."""
        produced = self.model.greedy(src, length, BOS_ID).shape[1]
        if produced != length:
            raise RuntimeError(f"the seed decoder produced {produced} tokens, expected {length}")


def compare(mine: list[float], peer: list[float]) -> dict[str, float | None]:
    """``ratio`` of medians and ``ratio_paired`` (median of the same repetitions' ratios)."""
    if not mine or not peer:
        return {"ratio": None, "ratio_paired": None}
    return {
        "ratio": statistics.median(mine) / statistics.median(peer),
        "ratio_paired": statistics.median(m / p for m, p in zip(mine, peer, strict=False)),
    }


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {key: statistics.median(times) for key, times in samples.items() if times}


def jsonable(options: dict[str, Any]) -> dict[str, Any]:
    """Options with non-JSON values (modules) written as their repr."""
    plain = (bool, int, float, str, type(None))
    return {k: v if isinstance(v, plain) else repr(v) for k, v in options.items()}


class Peers:
    """The peers' workloads, their slots in each repetition, and their JSON section."""

    def __init__(self, settings: BenchSettings, spec: dict[str, Any] | None = None) -> None:
        self.settings, self.spec = settings, spec if spec is not None else load_spec()
        self.config = model_config(settings.model)
        self.errors: dict[str, str] = {}
        self.samples: dict[str, Any] = {"torch": {}, "x_transformers": {}, "seed": {}}
        self.torch = self._build("torch", self._torch_workload)
        self.xt_version = xt_version()
        self.xt: dict[str, Trainer] = {}
        variants = self.spec["x_transformers"]["variants"]
        if self.xt_version is None:
            log.warning(XT_INSTALL)
        else:
            for name in settings.encodings:
                if name in variants:
                    work = self._build(f"x_transformers {name}", partial(self._xt_workload, name))
                    if work is not None:
                        self.xt[name] = work
                        self.samples["x_transformers"][name] = {}
        seed = self.spec["seed"]
        self.seed_config = model_config(seed["model"])
        self.seed_batch = training_batch(seed["batch"], seed["length"], settings)
        self.seed_sources = random_tokens(
            (seed["batch"], seed["length"]), settings.vocab_size, settings.seed + 2
        )
        self.seed_works: dict[str, SeedWorkload | Workload] = {}
        self.seed_pairs: dict[str, tuple[str, str]] = {}
        for variant, name in seed["compare"].items():
            pair = (f"seed {variant}", f"posenc {name}")
            builds = (
                partial(self._seed_workload, variant),
                partial(build_workload, name, settings, seed["model"]),
            )
            built = [self._build(key, build) for key, build in zip(pair, builds, strict=True)]
            if all(work is not None for work in built):
                self.seed_works.update(zip(pair, built, strict=True))
                self.seed_pairs[variant] = pair
        self.seed_warm = False

    # ------------------------------------------------------------------ building
    def _build(self, key: str, build: Callable[[], Any]) -> Any:
        try:
            return build()
        except Exception as err:  # a broken peer must not stop the benchmark
            self.errors[key] = f"build: {type(err).__name__}: {err}"
            log.warning("peer %s cannot be built: %s", key, err)
            return None

    def _torch_workload(self) -> Trainer:
        torch.manual_seed(self.settings.seed)
        positions = self.spec["torch"]["positions"] != "none"
        model = TorchTransformer(self.config, self.settings.vocab_size, PAD_ID, positions)
        return Trainer.default(model)

    def _xt_options(self, name: str) -> dict[str, Any]:
        spec = self.spec["x_transformers"]
        max_len = max(spec["max_seq_len"], *self.settings.lengths)
        return xt_options(
            self.config,
            self.settings.vocab_size,
            PAD_ID,
            max_len,
            spec["common"],
            spec["variants"][name],
        )

    def _xt_workload(self, name: str) -> Trainer:
        torch.manual_seed(self.settings.seed)
        return Trainer.default(XTransformerPeer(self._xt_options(name), self.config.tie_output))

    def _seed_workload(self, variant: str) -> SeedWorkload:
        torch.manual_seed(self.settings.seed)
        model = SeedTransformer(self.seed_config, self.settings.vocab_size, variant, PAD_ID)
        return SeedWorkload.default(model)

    # ------------------------------------------------------------------ timing
    def _warm(self, key: str, calls: list[Callable[[], None]], check=None) -> bool:
        """Run ``calls`` ``warmup`` times and ``check``; False (error recorded) on failure."""
        try:
            for _ in range(self.settings.warmup):
                for call in calls:
                    call()
            if check is not None:
                check()
        except Exception as err:  # idem
            self.errors[key] = f"{type(err).__name__}: {err}"
            log.warning("peer %s fails: %s", key, err)
            return False
        return True

    def _check_cached_steps(self, work: Workload) -> None:
        length = self.spec["seed"]["length"]
        steps = count_decoder_calls(work, self.seed_sources, length)
        if steps != length:
            raise RuntimeError(f"decoding ran {steps} decoder steps, expected {length}")

    def units(self, length: int, batch: tuple[torch.Tensor, ...]) -> list[Unit]:
        """Warm up at ``length`` and return the peers' slots for each repetition there."""
        units: list[Unit] = []
        trainers = [("torch", self.torch, self.samples["torch"].setdefault("train", {}))]
        for name, work in self.xt.items():
            trainers.append((f"x_transformers {name}", work, self.samples["x_transformers"][name]))
        for key, work, store in trainers:
            if work is not None and self._warm(key, [partial(work.train_step, batch)]):
                train = partial(work.train_step, batch)
                units.append([(train, store.setdefault(str(length), []))])
        if not self.seed_warm:
            for pair in list(self.seed_pairs.values()):
                seed_key, posenc_key = pair
                posenc = self.seed_works[posenc_key]
                checked = partial(self._check_cached_steps, posenc)
                if not (
                    self._warm(seed_key, self._seed_calls(self.seed_works[seed_key]))
                    and self._warm(posenc_key, self._seed_calls(posenc), checked)
                ):
                    for key in pair:  # a comparison needs both sides
                        del self.seed_works[key]
            self.seed_warm = True
        for key, work in self.seed_works.items():
            calls = self._seed_calls(work)
            stores = [self.samples["seed"].setdefault(kind, {}) for kind in ("train", "decode")]
            units.append([(c, s.setdefault(key, [])) for c, s in zip(calls, stores, strict=True)])
        return units

    def _seed_calls(self, work: SeedWorkload | Workload) -> list[Callable[[], None]]:
        length = self.spec["seed"]["length"]
        return [
            partial(work.train_step, self.seed_batch),
            partial(work.decode, self.seed_sources, length),
        ]

    # ------------------------------------------------------------------ the JSON section
    def result(self, samples: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        """The ``peers`` section: shapes, parameters, samples, medians, ratios and verdicts."""
        return {
            "torch": self._torch_result(samples["train"]),
            "x_transformers": self._xt_result(samples["train"]),
            "seed": self._seed_result(),
            "errors": self.errors,
        }

    def _torch_result(self, train: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
        spec, peer = self.spec["torch"], self.samples["torch"].get("train", {})
        ratios = {
            name: {
                length: _verdict(compare(times, peer.get(length, [])), spec["max_ratio"])
                for length, times in per_length.items()
            }
            for name, per_length in train.items()
        }
        return {
            "model": self.settings.model,
            "shape": asdict(self.config),
            "positions": spec["positions"],
            "parameters": count_parameters(self.torch.model) if self.torch else None,
            "differences": TORCH_DIFFERENCES,
            "samples_s": {"train": peer},
            "median_s": {"train": medians(peer)},
            "max_ratio": spec["max_ratio"],
            "ratios": ratios,
        }

    def _xt_result(self, train: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
        spec = self.spec["x_transformers"]
        if self.xt_version is None:
            return {"installed": False, "version": None, "message": XT_INSTALL}
        peer = self.samples["x_transformers"]
        ratios = {
            name: {
                length: _verdict(
                    compare(train.get(name, {}).get(length, []), times), spec["max_ratio"]
                )
                for length, times in per_length.items()
            }
            for name, per_length in peer.items()
        }
        return {
            "installed": True,
            "version": self.xt_version,
            "model": self.settings.model,
            "shape": asdict(self.config),
            "options": {name: jsonable(self._xt_options(name)) for name in self.xt},
            "parameters": {name: count_parameters(w.model) for name, w in self.xt.items()},
            "samples_s": {"train": peer},
            "median_s": {"train": {name: medians(times) for name, times in peer.items()}},
            "max_ratio": spec["max_ratio"],
            "ratios": ratios,
        }

    def _seed_result(self) -> dict[str, Any]:
        spec, samples = self.spec["seed"], self.samples["seed"]
        train, decode = samples.get("train", {}), samples.get("decode", {})
        ratios = {}
        for variant, name in spec["compare"].items():
            seed_key, posenc_key = f"seed {variant}", f"posenc {name}"
            if seed_key not in train or posenc_key not in train:
                continue
            speedup = compare(decode[seed_key], decode[posenc_key])
            ratios[name] = {
                "seed_variant": variant,
                "train": compare(train[posenc_key], train[seed_key]),
                "decode_speedup": {
                    **speedup,
                    "verdict": "-"
                    if speedup["ratio"] is None
                    else ("pass" if speedup["ratio"] >= spec["min_decode_speedup"] else "miss"),
                },
            }
        return {
            "setting": {
                "model": spec["model"],
                "shape": asdict(self.seed_config),
                "batch": spec["batch"],
                "length": spec["length"],
                "vocab_size": self.settings.vocab_size,
            },
            "compare": spec["compare"],
            "parameters": {key: count_parameters(w.model) for key, w in self.seed_works.items()},
            "samples_s": samples,
            "median_s": {kind: medians(per_key) for kind, per_key in samples.items()},
            "min_decode_speedup": spec["min_decode_speedup"],
            "ratios": ratios,
        }


def _verdict(figures: dict[str, Any], max_ratio: float | None) -> dict[str, Any]:
    """``figures`` with ``verdict``: pass when the ratio is at most ``max_ratio``."""
    ratio = figures["ratio"]
    if ratio is None or max_ratio is None:
        figures["verdict"] = "-"
    else:
        figures["verdict"] = "pass" if ratio <= max_ratio else "miss"
    return figures
