"""Length-robust attention temperatures (``pe.temperature``): a layer's self-attention queries
scaled by a factor that grows with the context, for layers without positions and for any
encoding.

* ``llama4`` — Llama 4's attention temperature on its layers without RoPE (transformers'
  ``Llama4TextAttention``, ``attn_temperature_tuning``): the query at absolute position ``p``
  is multiplied by ``log(floor((p + 1) / floor_scale) + 1) * scale + 1``, ``floor_scale``
  8192 and ``scale`` 0.1 by default (Llama 4's). At lengths under ``floor_scale`` the factor
  is exactly 1, so at posenc's sentence lengths it changes nothing unless ``floor_scale`` is
  set near the training length.
* ``ssmax`` — Scalable-Softmax (Nakanishi 2025): ``softmax((s log n) z)``, computed as queries
  times ``s log n``, with ``n`` the number of keys the query attends to (``p + 1`` in the
  decoder, the source's length without padding in the encoder) and ``s`` learned per layer
  and head, starting at ``scale`` (0.43 by default, the value of the paper's Figure 1).

Where it applies (``pe.temperature_layers``): the layers of ``pe.off_layers`` when those are set
(Llama 4's use: its layers without positions), otherwise every layer; or the layers listed.
Self-attention only (encoder and decoder), never cross-attention. Scaling the queries scales
every logit the query makes, content and query-position terms alike; an additive bias that does
not come from the query (ALiBi's, T5's) is not scaled.

Incremental decoding: the factor of a query depends on its own position and the keys it sees,
both known to the call, so cached decoding equals teacher forcing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionCall, AttentionRule
from posenc.model.encodings.wrapping import WrapperRule, overrides

TEMPERATURES = ("llama4", "ssmax")
#: the defaults of the settings each temperature reads: ``scale`` and (Llama 4) ``floor_scale``
DEFAULTS = {"llama4": {"scale": 0.1, "floor_scale": 8192.0}, "ssmax": {"scale": 0.43}}


@dataclass(frozen=True)
class Temperature:
    """``pe.temperature`` and its settings.

    Attributes:
        kind: ``llama4`` or ``ssmax`` (module docstring).
        layers: the layers it applies to, or None (the off layers when there are, else all).
        scale: Llama 4's ``attn_scale``, or SSMax's initial ``s``.
        floor_scale: Llama 4's ``floor_scale`` (None for SSMax).
    """

    kind: str
    layers: tuple[int, ...] | None
    scale: float
    floor_scale: float | None

    @classmethod
    def of(cls, kind: Any, layers: Any, scale: Any, floor_scale: Any) -> Temperature | None:
        """The temperature of the ``pe.temperature*`` settings (None for ``kind`` null).

        Raises:
            ValueError: an unknown kind, a setting without a kind or that the kind does not
                read, or a value out of range (one line naming the setting and the fix).
        """
        if kind is None:
            given = [
                n
                for n, v in (("layers", layers), ("scale", scale), ("floor_scale", floor_scale))
                if v is not None
            ]
            if given:
                raise ValueError(
                    f"pe.temperature_{given[0]} without pe.temperature: set pe.temperature to "
                    f"one of {', '.join(TEMPERATURES)}, or leave pe.temperature_{given[0]} null"
                )
            return None
        if kind not in TEMPERATURES:
            raise ValueError(
                f"pe.temperature={kind!r} is unknown; use one of {', '.join(TEMPERATURES)} or null"
            )
        if floor_scale is not None and kind != "llama4":
            raise ValueError(
                f"pe.temperature_floor_scale={floor_scale} does nothing with pe.temperature="
                f"{kind}; leave it null (it is Llama 4's)"
            )
        defaults = DEFAULTS[kind]
        scale = defaults["scale"] if scale is None else scale
        floor_scale = defaults.get("floor_scale") if floor_scale is None else floor_scale
        for name, value in (("scale", scale), ("floor_scale", floor_scale)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise ValueError(f"pe.temperature_{name}={value!r} must be a positive number")
        if layers is not None and (
            not isinstance(layers, Sequence)
            or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
        ):
            raise ValueError(f"pe.temperature_layers={layers!r} must be a list of layer indices")
        return cls(
            kind,
            None if layers is None else tuple(layers),
            float(scale),
            None if floor_scale is None else float(floor_scale),
        )

    def applies(self, layer: int, off_layers: frozenset[int]) -> bool:
        """Whether self-attention layer ``layer`` gets the temperature."""
        if self.layers is not None:
            return layer in self.layers
        return layer in off_layers if off_layers else True

    def check_layers(self, n_layers: int, site: str) -> None:
        """Refuse listed layers that the stack does not have (one line)."""
        for layer in self.layers or ():
            if not 0 <= layer < n_layers:
                raise ValueError(
                    f"pe.temperature_layers={list(self.layers or ())}: the {site} has "
                    f"{n_layers} layers (0 to {n_layers - 1}), so layer {layer} does not exist"
                )

    def wrap(self, rule: AttentionRule, n_heads: int) -> TemperedRule:
        """``rule`` with its queries scaled by this temperature."""
        return TemperedRule(rule, self, n_heads)


class TemperedRule(WrapperRule):
    """An attention rule whose queries are scaled by :class:`Temperature` before ``inner``
    attends with them (every other hook is ``inner``'s, :class:`WrapperRule`).

    Attributes:
        s: ``(h,)`` SSMax's learned scales (ssmax only), one per head of the queries it scales:
            the heads ``inner`` projects (:meth:`~AttentionRule.head_counts`; RoPE++'s real and
            imaginary heads share their query's).
    """

    def __init__(self, inner: AttentionRule, temperature: Temperature, n_heads: int) -> None:
        if temperature.kind == "ssmax" and overrides(inner, "bias"):
            raise ValueError(
                "pe.temperature=ssmax with a position bias: Scalable-Softmax scales the whole "
                "softmax input (Nakanishi 2025), posenc the queries only, which would leave the "
                "bias unscaled; use it with an encoding without a bias, or only on layers without "
                "one (pe.off_layers, pe.temperature_layers)"
            )
        super().__init__(inner)
        self.temperature = temperature
        self.s = (
            nn.Parameter(torch.full((inner.head_counts(n_heads)[0],), temperature.scale))
            if temperature.kind == "ssmax"
            else None
        )

    def factor(self, call: AttentionCall, dtype: torch.dtype) -> Tensor:
        """The query factor ``(B|1, H|1, Lq, 1)`` of the call."""
        t = self.temperature
        if self.s is None:  # llama4
            p = call.q_pos.to(torch.float64)
            f = torch.log(torch.floor((p + 1) / t.floor_scale) + 1) * t.scale + 1
            return f.to(dtype)[None, None, :, None]
        allowed = call.allowed()
        if allowed is None:
            n = torch.full(
                (1, 1, call.q_pos.shape[0], 1), call.k_pos.shape[0], device=call.q_pos.device
            )
        else:
            n = allowed.sum(-1, keepdim=True)
        return self.s.to(dtype)[None, :, None, None] * torch.log(n.to(dtype).clamp(min=1))

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return self.inner.weights(q * self.factor(call, q.dtype), k, key_state, call)

    def attend_cached(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> tuple[Tensor, Tensor]:
        return self.inner.attend_cached(q * self.factor(call, q.dtype), k, v, key_state, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return self.inner(q * self.factor(call, q.dtype), k, v, key_state, call)
