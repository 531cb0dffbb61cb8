"""Input-level (absolute) encodings: a vector per position added to each token embedding.

* ``sinpe`` — Vaswani et al. 2017, as in the seed report:
  ``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))``; with
  ``learned_scale``, times one learned scalar per stack initialised to ``d^-1/2``
  (x-transformers' ``ScaledSinusoidalEmbedding``, its ``scaled_sinu_pos_emb``).
* ``learned`` — a trained table of ``max_len`` positions (Gehring et al. 2017; GPT-2).

Both act on the input of the encoder and of the decoder (each stack has its own instance; the
decoder's positions continue from the cache length during incremental decoding). Attention is
left unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import Site, StackEncoding, compute_dtype
from posenc.model.encodings.common import sinusoidal_table


class SinusoidalEncoding(StackEncoding):
    """Fixed sinusoidal absolute positions added to the stack input ``(B, L, d)``, optionally
    scaled by a learned scalar ``s`` (``x + s PE``, ``s`` starting at ``d^-1/2``)."""

    applies_to = "encoder and decoder inputs"
    encoder_form = "same table as the decoder"
    speed_target = 1.10
    augment_modes = frozenset({"shift", "random", "scale"})
    option_forms = ({"learned_scale": True},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        learned_scale: bool | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.base = base
        self.scale = nn.Parameter(torch.tensor(d_model**-0.5)) if learned_scale else None

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        table = sinusoidal_table(positions, self.d_model, self.base, compute_dtype(x))
        if self.scale is not None:
            table = table * self.scale.to(table.dtype)
        return x + table.to(x.dtype)


class LearnedEncoding(StackEncoding):
    """A learned table of ``max_len`` absolute positions added to the stack input ``(B, L, d)``.

    A position ``>= max_len`` raises a ValueError unless ``clamp=True``, which reuses the last
    row for every longer position.
    """

    applies_to = "encoder and decoder inputs"
    encoder_form = "its own table per stack"
    speed_target = 1.10
    augment_modes = frozenset({"shift", "random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        max_len: int = 256,
        clamp: bool = False,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.max_len = max_len
        self.clamp = clamp
        self.table = nn.Embedding(max_len, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, std=1.0 / math.sqrt(self.d_model))

    @property
    def max_positions(self) -> int | None:
        """The table's rows, unless ``clamp`` reuses the last one for longer inputs."""
        return None if self.clamp else self.max_len

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if positions.numel() and int(positions.max()) >= self.max_len:
            if not self.clamp:
                raise ValueError(
                    f"learned positions: the {self.site.value} input reaches position "
                    f"{int(positions.max())} but the table has pe.max_len={self.max_len}; "
                    "raise pe.max_len or set pe.clamp=true"
                )
            positions = positions.clamp(max=self.max_len - 1)
        return x + self.table(positions).to(x.dtype)
