"""Dynamic position bias: a learned MLP of the signed query-key distance, one output per head,
added to the self-attention logits (x-transformers' ``DynamicPositionBias``; the MLP-generated
bias of CrossFormer, Wang et al. 2021, over log-spaced distances as SwinV2's continuous
position bias, Liu et al. 2022)::

    bias[h, i, j] = MLP(phi(i - j))[h],    phi(x) = sign(x) * log(|x| + 1)   (log_distance)
                                           phi(x) = x                        (otherwise)

    MLP = Linear(1, w) -> [LayerNorm] -> SiLU -> (depth - 1) x (Linear(w, w) -> [LayerNorm] ->
          SiLU) -> Linear(w, H)

with ``w`` the width (default ``d_model / 4``, as x-transformers), ``depth`` 2 and no
LayerNorm by default (x-transformers' defaults), ``nn.Linear``'s default initialisation. One MLP
per stack, shared by its layers, as x-transformers' one per attention stack. The log distance
is on by default here (x-transformers' default is the plain distance): its inputs grow slowly
with the distance, which is the claim made for extrapolation past the training length.

Where it applies: encoder and decoder self-attention; not cross-attention (source and target
positions do not lie on one axis).

Encoder form: the same MLP on the signed distance, so a key after the query reads a negative
``i - j`` and left and right differ from the start (bidirectional by construction; x-transformers
uses it in encoders as it is). In the decoder keys after the query are masked, so their
distances are clamped to 0 (any value would do).

Incremental decoding: the rows of the new queries at ``call.q_pos`` against the cached keys at
``call.k_pos`` are rebuilt from absolute positions; nothing extra is cached.

Cost: the MLP is evaluated once per distinct distance (at most ``Lq + Lk - 1`` of them, found by
``torch.unique``) and gathered onto the ``(Lq, Lk)`` grid, once per forward for all layers, in
float32 (float64 in a float64 model) also under bf16 autocast. The bias needs a gradient, so
SDPA uses its math kernel, as with T5's bias.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import Site, compute_dtype
from posenc.model.encodings.common import BiasEncoding, SharedBias


def signed_log(x: Tensor) -> Tensor:
    """``sign(x) * log(|x| + 1)`` elementwise."""
    return torch.sign(x) * torch.log1p(x.abs())


class DynamicPositionBiasEncoding(BiasEncoding):
    """An MLP of the signed distance as the self-attention bias, one per stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        width: hidden units of the MLP (None: ``d_model // 4``, x-transformers' choice).
        depth: hidden layers of the MLP, at least 1 (x-transformers: 2).
        log_distance: the MLP reads ``sign(x) log(|x| + 1)`` rather than ``x`` (module
            docstring).
        norm: a LayerNorm after each hidden linear layer (x-transformers: off).
        dape, dape_hidden: DAPE's MLP on the scores and this bias, one per layer
            (:class:`~posenc.model.encodings.common.BiasEncoding`; default off).

    Raises:
        ValueError: a width or depth below 1 (one line).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = "the same MLP of the signed distance i-j: keys after the query read i-j < 0"
    speed_target = 1.30
    augment_modes = frozenset({"random", "scale"})
    option_forms = (*BiasEncoding.option_forms, {"log_distance": False, "norm": True})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        width: int | None = None,
        depth: int = 2,
        log_distance: bool = True,
        norm: bool = False,
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, dape, dape_hidden)
        width = max(d_model // 4, 1) if width is None else width
        if width < 1 or depth < 1:
            raise ValueError(
                f"dpb: width={width} and depth={depth} must each be at least 1; set pe.width "
                "(null: d_model/4) and pe.depth (x-transformers: 2)"
            )
        self.log_distance = log_distance
        layers: list[nn.Module] = []
        for index in range(depth):
            layers.append(nn.Linear(1 if index == 0 else width, width))
            if norm:
                layers.append(nn.LayerNorm(width))
            layers.append(nn.SiLU())
        layers.append(nn.Linear(width, n_heads))
        self.mlp = nn.Sequential(*layers)
        self.rule = SharedBias()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s and ``nn.LayerNorm``'s default initialisation, as x-transformers."""
        for layer in self.mlp:
            if isinstance(layer, nn.Linear | nn.LayerNorm):
                layer.reset_parameters()

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` of queries at ``q_pos (Lq,)`` and keys at ``k_pos
        (Lk,)``, the MLP run once per distinct distance."""
        signed = q_pos[:, None] - k_pos[None, :]  # i - j
        if self.causal:
            signed = signed.clamp(min=0)  # later keys are masked
        distances, inverse = torch.unique(signed, return_inverse=True)
        weight = self.mlp[0].weight
        with torch.autocast(weight.device.type, enabled=False):
            x = distances.to(compute_dtype(weight))[:, None]  # (U, 1)
            out = self.mlp(signed_log(x) if self.log_distance else x)  # (U, H)
        return out.t()[:, inverse][None]

    def bias_rule(self, layer: int) -> SharedBias:
        return self.rule
