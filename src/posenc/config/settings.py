"""A composed run config read once at the door (train.py's job, the standalone evaluation, the
API): every group typed and checked, the encoding's own settings kept as its mapping, and the
whole config as plain data for what saves or compares it. Data, training, evaluation and the
model take their typed groups from here and never read the composed config themselves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from posenc.config import (
    EvalConfig,
    LoggerConfig,
    ModelConfig,
    RunSettings,
    TrainerConfig,
    check_types,
    plain,
)
from posenc.config.data import DataConfig, TokenizerConfig, data_config, tokenizer_config


@dataclass(frozen=True)
class Settings:
    """One run's settings, parsed and checked once.

    Attributes:
        run: the top-level keys (name, seed, device, threads, ...).
        model, trainer, eval, logger: their groups, typed (:mod:`posenc.config`).
        data, tokenizer: typed by their kind (:mod:`posenc.config.data`).
        pe: the encoding's settings as its config gives them (its class reads them).
        composed: the whole config as plain, resolved data: what a run saves
            (``config.yaml``, checkpoints) and what identities compare.
    """

    run: RunSettings
    model: ModelConfig
    trainer: TrainerConfig
    eval: EvalConfig
    logger: LoggerConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    pe: Mapping[str, Any]
    composed: Mapping[str, Any]

    @classmethod
    def of(cls, cfg: Mapping) -> Settings:
        """The settings of a composed config (a DictConfig or a plain mapping), after the type
        and range checks of :mod:`posenc.config`.

        Raises:
            ValueError: one line naming a key whose value does not fit, is missing or unknown
                (:class:`~posenc.data.corpus.DataError` for the data and tokenizer groups).
        """
        values = plain(cfg)
        check_types(values)
        top = {key: values[key] for key in RunSettings.settings_names() if key in values}
        return cls(
            run=RunSettings.of(top),
            model=ModelConfig.of(values.get("model") or {}),
            trainer=TrainerConfig.of(values.get("trainer") or {}),
            eval=EvalConfig.of(values.get("eval") or {}),
            logger=LoggerConfig.of(values.get("logger") or {}),
            data=data_config(values.get("data") or {}),
            tokenizer=tokenizer_config(values.get("tokenizer") or {}),
            pe=MappingProxyType(dict(values.get("pe") or {})),
            composed=MappingProxyType(values),
        )
