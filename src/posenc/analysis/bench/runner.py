"""Every encoding's workload timed interleaved and probed for memory, as ratios to the
reference encoding. A workload is a seeded model and AdamW; each ratio is checked against its
class's speed target; what is
timed and how the timing stays fair is in the package's docstring (:mod:`posenc.analysis.bench`)."""

from __future__ import annotations

import gc
import logging
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, Self

import torch
from omegaconf import OmegaConf
from torch import nn

from posenc.analysis.bench.efficiency import ceiling_verdict, step_efficiency
from posenc.analysis.bench.measure import (
    machine_info,
    map_large_allocations,
    matmul_ceiling,
    proc_status_kib,
    random_tokens,
    reset_peak_rss,
    timed,
)
from posenc.config import CONFIG_DIR, reference_encoding
from posenc.config.variants import parse_variant, variant_label
from posenc.model.encodings import encoding_class
from posenc.model.factory import PAD_ID, build_named_model
from posenc.model.seq2seq import Seq2Seq, count_parameters
from posenc.runtime.device import autocast_dtype, keep_freed_memory, resolve_device
from posenc.training.losses import summed_losses
from posenc.training.optim import make_optimizer

log = logging.getLogger("posenc.analysis.bench")

KINDS = {"train": "Training step (forward + backward + AdamW)", "decode": "Cached greedy decoding"}
TARGET_LENGTH = 128
MATMUL_SIZE = {"cpu": 2048, "cuda": 8192}
"""The side of the matmul whose speed is the ceiling on each device type (:mod:`.efficiency`)."""
"""The length at which training steps are held to their encodings' speed targets."""


@dataclass
class BenchSettings:
    """What the benchmark measures; every field is recorded in the JSON output."""

    encodings: list[str]
    lengths: list[int] = field(default_factory=lambda: [64, 128, 256])
    tokens: int = 4096
    repeats: int = 5
    warmup: int = 1
    decode_batch: int = 8
    model: str = "small"
    vocab_size: int = 8000
    seed: int = 0
    memory: bool = True
    reference: str = field(default_factory=reference_encoding)
    variants: list[str] = field(default_factory=list)
    """encodings with options, each a sweep's overrides (``"alibi pe.dape=true"``), measured
    under the report's name for them (``alibi (pe.dape=True)``) after the encodings"""
    device: str = "auto"
    """as the run setting ``device``; replaced by the device it resolves to (``cpu``, ``cuda``)"""
    precision: str = "auto"
    """of the training step, as ``trainer.precision`` (``auto``: bf16 autocast on CUDA);
    replaced by what it resolves to (``fp32``, ``bf16``). Decoding runs in the model's dtype, as
    evaluation does"""
    compile: bool = False
    """the training step calls ``torch.compile`` of the model, as ``trainer.compile=true`` does
    (decoding stays eager, as evaluation's)"""

    def __post_init__(self) -> None:
        device = resolve_device(self.device)
        self.device = str(device)
        self.precision = "fp32" if autocast_dtype(self.precision, device) is None else "bf16"
        if self.reference not in self.encodings:
            self.encodings = [self.reference, *self.encodings]
        parsed = [parse_variant(text) for text in self.variants]
        self._options = {variant_label(pe, options): (pe, options) for pe, options in parsed}
        self.encodings += [name for name in self._options if name not in self.encodings]
        if min(self.lengths) < 1 or self.tokens < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError("lengths, tokens and repeats must be positive and warmup >= 0")
        if self.decode_batch < 1:
            raise ValueError(f"decode_batch={self.decode_batch} must be positive")

    def subject(self, name: str) -> tuple[str, dict[str, Any]]:
        """The encoding and options (``{"pe.KEY": value}``) measured under ``name``."""
        return self._options.get(name, (name, {}))

    @property
    def torch_device(self) -> torch.device:
        """The device everything is built and timed on."""
        return torch.device(self.device)

    @property
    def amp(self) -> torch.dtype | None:
        """The training step's autocast dtype, None for fp32."""
        return torch.bfloat16 if self.precision == "bf16" else None


@dataclass
class Trainer:
    """A model's optimizer step as the training loop takes it; the model only needs
    ``model(src, tgt_in) -> logits``, so peers (:mod:`.peers`) share it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    smoothing: float
    clip_norm: float
    amp: torch.dtype | None = None
    """the forward pass's autocast dtype (None: the model's own), as the training loop's"""
    compiled: bool = False
    """the step calls ``torch.compile(model)``, as the training loop with ``trainer.compile``"""

    forward: nn.Module = field(init=False)
    """what the step calls: the model, or its compiled form"""
    losses: Callable[..., tuple[torch.Tensor, torch.Tensor]] = field(init=False)
    """the summed loss and NLL of ``(forward, batch, pad_id, smoothing)``:
    :func:`~posenc.training.losses.summed_losses`, or a compiled form of it"""

    def __post_init__(self) -> None:
        self.forward = torch.compile(self.model) if self.compiled else self.model
        self.losses = summed_losses

    @classmethod
    def default(cls, model: nn.Module, *args: Any) -> Self:
        """``cls(model, AdamW, smoothing, clip, *args)`` with ``configs/trainer/default.yaml``'s
        settings; weight decay goes to what the model's modules declare (``make_optimizer``)."""
        trainer = OmegaConf.load(CONFIG_DIR / "trainer" / "default.yaml")
        optimizer = make_optimizer(model, trainer.lr, trainer.betas, trainer.weight_decay)
        return cls(model, optimizer, trainer.label_smoothing, trainer.clip_norm, *args)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """One optimizer step on ``batch = (src, tgt_in, tgt_out)``, as the training loop does."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        device_type = batch[0].device.type
        with torch.autocast(device_type, dtype=self.amp or torch.float32, enabled=bool(self.amp)):
            loss, _ = self.losses(self.forward, batch, PAD_ID, self.smoothing)
        (loss / batch[2].ne(PAD_ID).sum()).backward()
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()


@dataclass
class Workload(Trainer):
    """One encoding's model and optimizer, built once and reused at every length."""

    model: Seq2Seq

    def decode(self, src: torch.Tensor, length: int) -> None:
        """Greedy decoding of ``src (B, Ls)``, exactly ``length`` decoder steps per call."""
        with never_eos(self.model):
            self.model.generate(src, max_len_a=0.0, max_len_b=length)


@contextmanager
def never_eos(model: Seq2Seq) -> Iterator[None]:
    """For the duration, the model's EOS id is ``-1``, which argmax never returns: no row ends
    early, and generation runs until its length limit (where it writes the ``-1`` and stops)."""
    eos = model.eos_id
    model.eos_id = -1
    try:
        yield
    finally:
        model.eos_id = eos


def build_workload(name: str, settings: BenchSettings, model: str | None = None) -> Workload:
    """Model (seeded) and AdamW of encoding or variant ``name`` (:meth:`BenchSettings.subject`)
    with the default trainer settings, at
    ``configs/model/MODEL.yaml`` (default: the benchmark's ``settings.model``)."""
    pe, options = settings.subject(name)
    model = model or settings.model
    built = build_named_model(pe, model, settings.vocab_size, settings.seed, options=options)
    return Workload.default(built.to(settings.torch_device), settings.amp, settings.compile)


def training_batch(
    batch_size: int, length: int, settings: BenchSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(src, tgt_in, tgt_out)``, each ``(batch_size, length)``, the same for every encoding,
    on the benchmark's device."""
    src = random_tokens((batch_size, length), settings.vocab_size, settings.seed)
    tgt = random_tokens((batch_size, length + 1), settings.vocab_size, settings.seed + 1)
    batch = src, tgt[:, :-1].contiguous(), tgt[:, 1:].contiguous()
    return tuple(tensor.to(settings.torch_device) for tensor in batch)


def count_decoder_calls(work: Workload, src: torch.Tensor, length: int) -> int:
    """How many decoder passes one :meth:`Workload.decode` makes (the fairness check)."""
    calls = 0

    def hook(module: torch.nn.Module, args: Any) -> None:
        nonlocal calls
        calls += 1

    handle = work.model.decoder.register_forward_pre_hook(hook)
    try:
        work.decode(src, length)
    finally:
        handle.remove()
    return calls


Unit = list[tuple[Callable[[], None], list[float]]]
"""One slot of a repetition: calls timed one after the other, each with the list that its
seconds go to (an encoding's slot: its training step, then its decoding)."""


class PeerSet(Protocol):
    """Workloads timed in the encodings' repetitions (:class:`.peers.Peers`)."""

    def units(self, length: int, batch: tuple[torch.Tensor, ...]) -> list[Unit]:
        """Warm up at ``length`` and return the slots to time in each repetition."""
        ...

    def result(self, samples: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
        """The JSON section, given the encodings' samples and summary."""
        ...


def run_timing(
    settings: BenchSettings, peers: PeerSet | None = None
) -> tuple[dict[str, Workload], dict[str, dict[str, dict[str, list[float]]]], dict[str, str]]:
    """Build every encoding and time it at every length, interleaved (with ``peers``' slots,
    which take their place in the rotated order like the encodings).

    Returns the workloads, the raw samples ``{kind: {encoding: {length: [seconds]}}}`` and the
    errors of encodings that failed (they are left out from then on).
    """
    workloads: dict[str, Workload] = {}
    errors: dict[str, str] = {}
    for name in settings.encodings:
        try:
            workloads[name] = build_workload(name, settings)
        except Exception as err:  # one broken encoding must not stop the others
            errors[name] = f"build: {type(err).__name__}: {err}"
            log.warning("pe=%s cannot be built: %s", name, err)
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        kind: {name: {} for name in workloads} for kind in KINDS
    }
    for length in settings.lengths:
        batch_size = max(1, settings.tokens // length)
        batch = training_batch(batch_size, length, settings)
        sources = random_tokens(
            (settings.decode_batch, length), settings.vocab_size, settings.seed + 2
        ).to(settings.torch_device)
        log.info("L=%d: batch %d x %d tokens, warm-up", length, batch_size, length)
        for name in list(workloads):
            work = workloads[name]
            try:
                for _ in range(settings.warmup):
                    work.train_step(batch)
                    work.decode(sources, length)
                steps = count_decoder_calls(work, sources, length)
                if steps != length:
                    raise RuntimeError(f"decoding ran {steps} decoder steps, expected {length}")
            except Exception as err:  # idem: report it and go on
                errors[name] = f"L={length}: {type(err).__name__}: {err}"
                log.warning("pe=%s fails at L=%d: %s", name, length, err)
                del workloads[name]
                continue
            for kind in KINDS:
                samples[kind][name][str(length)] = []
        units: list[Unit] = [
            [
                (partial(work.train_step, batch), samples["train"][name][str(length)]),
                (partial(work.decode, sources, length), samples["decode"][name][str(length)]),
            ]
            for name, work in workloads.items()
        ]
        if peers is not None:
            units += peers.units(length, batch)
        for rep in range(settings.repeats):
            shift = rep % len(units) if units else 0
            for unit in units[shift:] + units[:shift]:
                for call, times in unit:
                    times.append(timed(call))
            log.info("L=%d: repetition %d/%d done", length, rep + 1, settings.repeats)
    return workloads, samples, errors


def run_memory(
    settings: BenchSettings, workloads: dict[str, Workload]
) -> dict[str, dict[str, float]] | None:
    """Extra memory (MB) of one training step per encoding and length: resident memory on the
    CPU, or None where its peak cannot be measured (see the package docstring); on a GPU the
    CUDA allocator's peak during the step over what was allocated before it."""
    if settings.torch_device.type == "cuda":
        return cuda_step_memory(settings, workloads)
    if proc_status_kib("VmHWM") is None or not map_large_allocations():
        return None
    memory: dict[str, dict[str, float]] = {name: {} for name in workloads}
    for length in settings.lengths:
        batch_size = max(1, settings.tokens // length)
        batch = training_batch(batch_size, length, settings)
        for name, work in workloads.items():
            work.train_step(batch)  # settles glibc's heap under the thresholds just set
            gc.collect()
            map_large_allocations()
            before = proc_status_kib("VmRSS")
            if before is None or not reset_peak_rss():
                return None
            work.train_step(batch)
            peak = proc_status_kib("VmHWM")
            if peak is None:
                return None
            memory[name][str(length)] = round(max(0, peak - before) / 1024, 1)
    return memory


def cuda_step_memory(
    settings: BenchSettings, workloads: dict[str, Workload]
) -> dict[str, dict[str, float]]:
    """:func:`run_memory` on a GPU: the allocator's peak during one training step (after a
    settling step) minus what was allocated before it, in MB."""
    device = settings.torch_device
    memory: dict[str, dict[str, float]] = {name: {} for name in workloads}
    for length in settings.lengths:
        batch = training_batch(max(1, settings.tokens // length), length, settings)
        for name, work in workloads.items():
            work.train_step(batch)
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            work.train_step(batch)
            torch.cuda.synchronize(device)
            extra = torch.cuda.max_memory_allocated(device) - before
            memory[name][str(length)] = round(max(0, extra) / 2**20, 1)
    return memory


def summarise(
    samples: dict[str, dict[str, dict[str, list[float]]]], reference_name: str
) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """Medians and ratios to the reference: ``{kind: {encoding: {length: figures}}}``.

    ``ratio`` is the median over the reference's median; ``ratio_paired`` the median over
    repetitions of each repetition's ratio (both ran in the same round).
    """
    summary: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    for kind, per_encoding in samples.items():
        reference = per_encoding.get(reference_name, {})
        summary[kind] = {}
        for name, per_length in per_encoding.items():
            summary[kind][name] = {}
            for length, times in per_length.items():
                if not times:
                    continue
                median = statistics.median(times)
                ref = reference.get(length)
                ratio = paired = None
                if ref:
                    ratio = median / statistics.median(ref)
                    paired = statistics.median(t / r for t, r in zip(times, ref, strict=False))
                summary[kind][name][length] = {
                    "median_s": median,
                    "ratio": ratio,
                    "ratio_paired": paired,
                }
    return summary


def speed_target(name: str, config_dir: Path = CONFIG_DIR) -> float | None:
    """The :attr:`StackEncoding.speed_target` of the class ``configs/pe/NAME.yaml`` builds (None:
    no target, or no such config)."""
    path = config_dir / "pe" / f"{name}.yaml"
    if not path.exists():
        return None
    return encoding_class(OmegaConf.load(path)._target_, name).speed_target


def target_verdict(
    name: str, summary: dict[str, Any], targets: dict[str, float] | None = None
) -> tuple[float | None, str]:
    """``(target, 'pass'|'miss'|'-')`` of the training step at :data:`TARGET_LENGTH`; the
    target is looked up in ``targets``, else read from the encoding's class."""
    target = targets.get(name) if targets is not None else speed_target(name)
    figures = summary.get("train", {}).get(name, {}).get(str(TARGET_LENGTH))
    if target is None or figures is None or figures["ratio"] is None:
        return target, "-"
    return target, "pass" if figures["ratio"] <= target else "miss"


def run(settings: BenchSettings, peers: PeerSet | None = None) -> dict[str, Any]:
    """Run the benchmark; the result holds machine, settings, raw samples, summary, memory and
    the ``peers`` section (None without peers)."""
    keep_freed_memory()  # as training does (see there); run_memory changes it afterwards
    device = settings.torch_device
    machine = machine_info(device)
    matmul = partial(
        matmul_ceiling,
        MATMUL_SIZE[device.type],
        device=device,
        dtype=settings.amp or torch.float32,
    )
    ceiling = matmul()
    workloads, samples, errors = run_timing(settings, peers)
    memory = run_memory(settings, workloads) if settings.memory else None
    targets = {name: speed_target(name) for name in settings.encodings}
    summary = summarise(samples, settings.reference)
    train_efficiency = step_efficiency(
        settings.lengths,
        lambda length: training_batch(max(1, settings.tokens // length), length, settings),
        {name: work.train_step for name, work in workloads.items()},
        summary,
        ceiling,
    )
    efficiency = {
        "matmul_size": MATMUL_SIZE[device.type],
        "matmul_dtype": settings.precision,
        "ceiling_flop_s": ceiling,
        "ceiling_end_flop_s": matmul(),
        "train": train_efficiency,
        "verdict": ceiling_verdict(settings.reference, train_efficiency, device.type),
    }
    machine["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "machine": machine,
        "settings": asdict(settings),
        "parameters": {name: count_parameters(work.model) for name, work in workloads.items()},
        "targets": {"length": TARGET_LENGTH, "kind": "train", "max_ratio": targets},
        "samples_s": samples,
        "summary": summary,
        "memory_mb": memory,
        "errors": errors,
        "peers": peers.result(samples, summary) if peers is not None else None,
        "efficiency": efficiency,
    }
