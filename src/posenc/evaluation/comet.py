"""COMET (Rei et al. 2020, package ``unbabel-comet``) of source, hypothesis and reference.

The model ``eval.comet.model`` names is a local folder (a downloaded model:
``checkpoints/model.ckpt`` beside its ``hparams.yaml``), a checkpoint file, or a hub name
(``Unbabel/wmt22-comet-da``) that ``comet.download_model`` fetches (into the hub's cache;
offline, from it). The package is optional and imported only when a model is named:
``unbabel-comet`` 2.2.7 (the newest on 2026-11-28) requires transformers < 5, huggingface-hub
< 1 and numpy < 2, so it lives in an environment with those versions (posenc supports
transformers >= 4.40 and numpy >= 1.24). A package or model that cannot be loaded gives a null
score and the reason in ``metrics.json``, never a failed run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from posenc.config.metrics import CometSettings

log = logging.getLogger("posenc.evaluation.comet")

#: why COMET could not run when the package is missing
NOT_INSTALLED = (
    "unbabel-comet is not installed: it requires transformers<5, huggingface-hub<1 and "
    "numpy<2, so install posenc with those versions and `pip install unbabel-comet` in an "
    "environment of its own"
)


def checkpoint_of(model: str) -> Path | None:
    """The checkpoint file of a local ``model`` (a ``.ckpt`` file, or a folder holding
    ``checkpoints/model.ckpt``); None when ``model`` is no local path (a hub name)."""
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        found = path / "checkpoints" / "model.ckpt"
        if not found.is_file():
            raise FileNotFoundError(f"{path} has no checkpoints/model.ckpt (a COMET model folder)")
        return found
    return None


class Comet:
    """One loaded COMET model reused for every split.

    Args:
        model: a local folder or checkpoint, a hub name, or None (off).
        batch_size: sentences per forward pass (None: COMET's default).
        gpus: GPUs COMET may use (0 on the CPU).
    """

    def __init__(self, model: str | None, batch_size: int | None = None, gpus: int = 0) -> None:
        self.model, self.batch_size, self.gpus = model, batch_size, gpus
        self._loaded: Any = None
        self._failure: str | None = None

    @classmethod
    def of(cls, settings: CometSettings, device: torch.device) -> Comet:
        """The scorer of ``eval.comet``, on ``device``'s GPU when it is one."""
        return cls(settings.model, settings.batch_size, int(device.type == "cuda"))

    def _load(self) -> Any:
        if self._loaded is not None or self._failure is not None:
            return self._loaded
        try:
            import comet
        except ImportError:
            self._failure = NOT_INSTALLED
            log.warning("COMET: %s", self._failure)
            return None
        try:
            checkpoint = checkpoint_of(self.model) or comet.download_model(self.model)
            self._loaded = comet.load_from_checkpoint(str(checkpoint))
        except Exception as err:  # any load failure must leave the run intact
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            self._failure = f"COMET model {self.model!r} could not be loaded: {first_line}"
            log.warning(self._failure)
        return self._loaded

    def __call__(
        self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]
    ) -> dict[str, Any]:
        """``{"comet", "comet_model", "comet_reason"}`` of one split (the system score, the
        mean of the sentence scores); empty when COMET is off."""
        if not self.model:
            return {}
        loaded = self._load()
        if loaded is None:
            return {"comet": None, "comet_model": self.model, "comet_reason": self._failure}
        data = [
            {"src": s, "mt": h, "ref": r}
            for s, h, r in zip(sources, hypotheses, references, strict=True)
        ]
        batching = {} if self.batch_size is None else {"batch_size": self.batch_size}
        output = loaded.predict(data, gpus=self.gpus, progress_bar=False, **batching)
        return {
            "comet": round(float(output.system_score), 6),
            "comet_model": self.model,
            "comet_reason": None,
        }

    score = __call__  # the scorer protocol of metrics computed by a model
