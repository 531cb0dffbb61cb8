"""Models built by name from ``configs/``: the tools (benchmark, plots) use every encoding that
has a ``configs/pe/*.yaml``, so a new encoding appears in them without code changes."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from posenc.config import CONFIG_DIR, ModelConfig, plain, reference_encoding
from posenc.config.identity import differences
from posenc.config.settings import Settings
from posenc.config.variants import encoding_config, known_encodings
from posenc.data.tokenizer import Tokenizer, load_tokenizer
from posenc.model.encodings import encoding_factory
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime import averaging, checkpoint
from posenc.runtime.rundir import RunDir

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def encoding_names(config_dir: Path = CONFIG_DIR) -> list[str]:
    """Names of every ``configs/pe/*.yaml``: the reference encoding (``reference_pe`` in
    ``configs/train.yaml``, what cost ratios are measured against) first, then alphabetical."""
    reference = reference_encoding(config_dir)
    return sorted(known_encodings(config_dir), key=lambda name: name != reference)


def select_encodings(spec: str | None, config_dir: Path = CONFIG_DIR) -> list[str]:
    """The names in a comma-separated ``spec`` (all encodings when None, empty or ``all``).

    Raises:
        ValueError: a name has no ``configs/pe/NAME.yaml``.
    """
    available = encoding_names(config_dir)
    if not spec or spec == "all":
        return available
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"unknown encoding(s) {unknown}; configs/pe has {available}")
    return list(dict.fromkeys(names))


def model_config(
    pe: str,
    model: str = "small",
    config_dir: Path = CONFIG_DIR,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{model: configs/model/MODEL.yaml, pe: encoding_config(PE)}`` as plain data, with
    ``options`` (``{"pe.KEY": value}``, as :func:`parse_variant` gives) applied."""
    path = config_dir / "model" / f"{model}.yaml"
    if not path.exists():
        raise ValueError(f"no model config {path}")
    cfg = OmegaConf.create({"model": OmegaConf.load(path), "pe": encoding_config(pe, config_dir)})
    for key, value in (options or {}).items():
        OmegaConf.update(cfg, key, value)
    return plain(cfg)


def build_named_model(
    pe: str,
    model: str = "small",
    vocab_size: int = 8000,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> Seq2Seq:
    """The Seq2Seq of ``configs/model/MODEL.yaml`` with encoding ``PE`` and its ``options``
    (:func:`model_config`), initialised from ``seed`` (pad 0, bos 1, eos 2), through the
    training code's own ``build_model``."""
    torch.manual_seed(seed)
    cfg = model_config(pe, model, options=options)
    return build_model(ModelConfig.of(cfg["model"]), cfg["pe"], vocab_size, PAD_ID, BOS_ID, EOS_ID)


def build_model(
    model: ModelConfig,
    pe: Mapping[str, Any],
    vocab_size: int,
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Seq2Seq:
    """The Seq2Seq of ``model`` with the encoding of the ``pe`` settings, once
    :func:`check_fits` has found that it fits in this machine's memory."""
    factory = encoding_factory(dict(pe))
    check_fits(lambda: Seq2Seq(vocab_size, pad_id, bos_id, eos_id, model, factory))
    return Seq2Seq(vocab_size, pad_id, bos_id, eos_id, model, factory)


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def token_ids(tokenizer: Tokenizer) -> tuple[int, int, int, int]:
    """``(vocab_size, pad_id, bos_id, eos_id)`` of ``tokenizer``, as :func:`build_model` takes
    them after the settings."""
    return tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id


def check_fits(build: Callable[[], torch.nn.Module], memory: int | None = None) -> None:
    """Build the model on the ``meta`` device (nothing allocated) and refuse, in one line, one
    whose parameters and buffers in float32 exceed ``memory`` (default: this machine's): a
    ``model.d_model`` or ``pe.max_len`` of a hundred million would otherwise allocate for a
    minute and die. An encoding that reads its own tensors while it is built cannot be built on
    ``meta``; its model is not estimated."""
    memory = physical_memory() if memory is None else memory
    try:
        with torch.device("meta"):
            model = build()
    except (NotImplementedError, RuntimeError):
        return
    count = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
    if memory and count * 4 > memory:
        raise ValueError(
            f"the model would hold {count:,} parameters and buffers ({count * 4 / 2**30:,.1f} "
            f"GiB in float32, before gradients and optimizer state), more than this machine's "
            f"{memory / 2**30:,.1f} GiB: lower model.d_model, model.d_ff, the layers or the "
            "encoding's table sizes (pe.max_len)"
        )


def checkpoint_path(run_dir: Path, which: str) -> Path:
    """``RUN/checkpoints/{which}.pt``; for ``best``, the checkpoint that holds the best step
    (:func:`posenc.runtime.checkpoint.best_checkpoint`: ``best.pt``, or ``last.pt``).

    Raises:
        CheckpointError: ``best.pt`` is stale and no checkpoint holds the best step (one line).
    """
    if which == "best":
        return checkpoint.best_checkpoint(RunDir(run_dir).checkpoints)
    return RunDir(run_dir).checkpoints / f"{which}.pt"


def load_run_model(
    run_dir: Path,
    settings: Settings,
    which: str,
    device: torch.device,
    average_last: int = 1,
    ema: bool = False,
):
    """The tokenizer, the model, its step and its checkpoint's path, for a run directory at its
    ``best`` or ``last`` checkpoint; with ``average_last`` > 1, the weights averaged over its
    newest ``average_last`` step checkpoints instead (the step and path are the newest one's);
    with ``ema``, the EMA of the weights (``trainer.ema_decay``) that those checkpoints hold.

    Raises:
        CheckpointError: a checkpoint is missing or unreadable, was trained with other ``pe``,
            ``model`` or ``tokenizer`` settings than ``cfg``'s, holds no EMA when ``ema``, or
            its weights do not fit (one line).
    """
    tokenizer = load_tokenizer(RunDir(run_dir).tokenizer)
    if average_last > 1:
        paths = averaging.last_step_checkpoints(RunDir(run_dir).checkpoints, average_last)
        path, weights = paths[-1], averaging.averaged_weights(paths, ema)
        payload = checkpoint.load(path)
    else:
        path = checkpoint_path(run_dir, which)
        payload = checkpoint.load(path)
        weights = checkpoint.model_weights(payload, path, ema)
    step = int(payload["state"]["step"])
    _check_trained_as(path, payload, settings.composed)
    model = build_model(settings.model, settings.pe, *token_ids(tokenizer))
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        detail = (str(err).strip().splitlines() or [""])[-1].strip()
        raise checkpoint.CheckpointError(
            f"checkpoint {path} does not fit the model of its run's config ({detail[:200]}); "
            "is config.yaml the run's own?"
        ) from None
    return tokenizer, model.to(device).eval(), step, path


def _check_trained_as(path: Path, payload: dict[str, Any], composed: Mapping[str, Any]) -> None:
    """Refuse (one line) a checkpoint whose stored ``pe``, ``model`` or ``tokenizer`` settings
    differ from the ``composed`` config's: its weights loaded into another model would be scored
    without a word (``model.n_heads`` changes no weight's shape for most encodings). A
    checkpoint saved before it stored them passes."""
    stored = payload.get("config")
    changed = differences(stored, dict(composed)) if isinstance(stored, dict) else []
    if changed:
        raise checkpoint.CheckpointError(
            f"checkpoint {path} was trained with {'; '.join(changed[:3])}; a trained model is "
            "scored with its own settings (a test-time change of pe goes in eval.pe_variants)"
        )


def variant_model(
    settings: Settings,
    overrides: Mapping[str, Any],
    model: Seq2Seq,
    tokenizer: Tokenizer,
    device: torch.device,
) -> Seq2Seq:
    """The trained ``model`` rebuilt with ``pe`` settings changed at test time (e.g. a RoPE
    scaling: ``{scaling: yarn, factor: 4}``); its weights are the trained ones."""
    pe = plain(OmegaConf.merge(dict(settings.pe), plain(overrides)))
    variant = build_model(settings.model, pe, *token_ids(tokenizer))
    variant.load_state_dict(model.state_dict())
    return variant.to(device).eval()
