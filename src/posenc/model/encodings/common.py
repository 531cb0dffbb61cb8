"""What two or more encodings share, in one place: every encoding module imports only
:mod:`~posenc.model.encodings.base` and this module, never another encoding's module
(``tests/test_layout.py`` checks it), so each family reads and changes on its own.

* :func:`sinusoidal_table`: the sinusoids of Vaswani et al. (sinpe; Transformer-XL's ``R``;
  FLOATER's initial positions);
* :func:`relative_position_bucket`: T5's buckets of relative positions (T5; TUPE-R);
* :func:`used_rows`, :func:`gather_rows`: a relative table evaluated only at the rows a call
  uses, and its per-row scores gathered back to the ``(Lq, Lk)`` pairs (Transformer-XL;
  DeBERTa);
* :class:`SharedBias`: the rule that adds a stack's per-forward bias (ALiBi, KERPLE, T5, FIRE
  with ``share_layers``);
* :class:`BiasEncoding` with :class:`DapeRule`: an encoding that adds a positional bias to the
  self-attention logits, and DAPE as its option ``dape`` (ALiBi, KERPLE, FIRE, T5);
* :class:`DistanceBiasEncoding` with :data:`SPLIT_PENALTY`, :func:`side_distances` and
  :func:`split_blocked`: a bias decaying with distance and its encoder forms (ALiBi, KERPLE).

DAPE (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding for Length
Extrapolation", arXiv 2405.14722; the paper's ``A = QK^T + B + f(QK^T, B)``), ``dape: true``:
the bias ``P (H, Lq, Lk)`` of a bias encoding is adjusted by the content of each query-key pair::

    logits = S + P + f(S, P),        S = q k^T / sqrt(D)   (B, H, Lq, Lk)

where ``f`` is an MLP applied to every pair ``(b, i, j)`` over the head axis: input the ``2H``
values ``[S[b, :, i, j] (the H heads' scores), P[:, i, j] (their biases)]``, a hidden layer of
``dape_hidden`` units (paper: 32) with LeakyReLU (negative slope 0.01), output ``H`` values.

The reference code it was checked against, what it follows and where posenc differs (and why):
``docs/encodings/dape.md``.

Shapes: ``B`` batch, ``H`` heads, ``L``/``Lq``/``Lk`` lengths, ``D`` head dim, ``d`` d_model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
)
from posenc.model.encodings.wrapping import WrapperRule


def sinusoidal_table(
    positions: Tensor, d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Sinusoidal encodings ``(L, d)`` of ``positions (L,)`` in ``dtype``; even dims sin, odd
    dims cos."""
    if d_model % 2:
        raise ValueError(f"sinpe needs an even d_model, got {d_model}")
    steps = torch.arange(0, d_model, 2, device=positions.device, dtype=dtype)
    inv_freq = base ** (-steps / d_model)
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]
    table = torch.empty(positions.shape[0], d_model, device=positions.device, dtype=dtype)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's bucket (long, same shape) of each ``relative_position = key_pos - query_pos``.

    Bidirectional: buckets ``[0, n/2)`` for ``key <= query``, ``[n/2, n)`` for ``key > query``.
    Causal: ``[0, n)`` by how far the key lies to the left; future keys fall in bucket 0. Within
    a half of ``m`` buckets, distances below ``m/2`` are exact and the rest are binned
    logarithmically up to ``max_distance``, clipped to the last bucket.
    """
    if bidirectional:
        num_buckets //= 2
        offset = (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    # Same operation order as T5, so float rounding picks the same bucket at bin edges.
    log_bucket = (
        torch.log(distance.clamp(min=1).float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = (max_exact + log_bucket).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < max_exact, distance, large)


def used_rows(index: Tensor) -> tuple[Tensor, Tensor]:
    """The table rows that the ``(Lq, Lk)`` long ``index`` refers to, as the contiguous range
    ``arange(lo, hi + 1)`` ``(n,)``, and ``index - lo`` (each entry's row in that range)."""
    lo, hi = torch.aminmax(index)
    lo, hi = int(lo), int(hi)
    return torch.arange(lo, hi + 1, device=index.device), index - lo


def gather_rows(per_row: Tensor, index: Tensor) -> Tensor:
    """``out[..., i, j] = per_row[..., i, index[i, j]]``: ``(B, H, L1, n)`` scores per table row
    into ``(B, H, L1, L2)`` scores per pair, for an ``(L1, L2)`` long ``index``."""
    b, h, rows, _ = per_row.shape
    return per_row.gather(-1, index.expand(b, h, rows, index.shape[-1]))


SPLIT_PENALTY = -1.0e4
"""The bias of keys on the side a ``split`` head does not look at: ``exp(-1e4)`` is exactly 0
in float32 and bfloat16, so for a real query (whose own key scores 0) it is a mask."""


def side_distances(q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
    """Float ``(Lq, Lk)`` distances ``i - j`` of keys before the query and ``j - i`` of keys
    after it, each 0 on the other side (and at ``j = i``)."""
    signed = (k_pos[None, :] - q_pos[:, None]).float()  # j - i
    return (-signed).clamp(min=0), signed.clamp(min=0)


def split_blocked(n_heads: int, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Bool ``(H, Lq, Lk)``, True where a ``split`` head does not look: keys after the query
    for even heads, keys before it for odd heads."""
    signed = k_pos[None, :] - q_pos[:, None]
    looks_forward = (torch.arange(n_heads, device=q_pos.device) % 2).bool()[:, None, None]
    return torch.where(looks_forward, signed[None] < 0, signed[None] > 0)


class SharedBias(AttentionRule):
    """Adds the stack's per-forward bias ``call.context`` (``(1, H, Lq, Lk)``) to the logits.

    The rule of every bias encoding whose bias is the same in all layers of a stack (ALiBi, T5,
    KERPLE): the stack computes it once in ``context``; each layer only reads it. Entries at
    :data:`SPLIT_PENALTY` are the side a ``split`` head does not look at (a mask).
    """

    masking_bias = SPLIT_PENALTY

    def bias(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor | None:
        return call.context


class DapeRule(WrapperRule):
    """A bias rule with DAPE: the bias ``P`` of ``inner`` becomes ``P + f(S, P)`` (module
    docstring), with this layer's own MLP ``f`` (``2H -> hidden -> H``, LeakyReLU). Attention
    itself (:meth:`forward`, :meth:`weights`, :meth:`attend_cached`) is the default rule's with
    that bias; every other hook is ``inner``'s (:class:`WrapperRule`).

    Args:
        inner: the encoding's rule of this layer; its :meth:`~AttentionRule.bias` gives
            ``P (1, H, Lq, Lk)``.
        n_heads: ``H``.
        hidden: hidden units of ``f`` (paper: 32).
        blocked: ``(q_pos (Lq,), k_pos (Lk,)) -> (H, Lq, Lk)`` bool, True at the keys a head
            does not look at (the ``split`` encoder form), or None. There ``f`` reads a bias of
            0 and adds nothing, so ``P``'s penalty stays a mask.
    """

    def __init__(
        self,
        inner: AttentionRule,
        n_heads: int,
        hidden: int,
        blocked: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__(inner)
        self.n_heads = n_heads
        self.blocked = blocked
        self.hidden = nn.Linear(2 * n_heads, hidden)
        self.out = nn.Linear(hidden, n_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.hidden, self.out):
            layer.reset_parameters()  # nn.Linear's default, as the reference code

    # attention with this rule's own bias, not inner's
    forward, weights = AttentionRule.forward, AttentionRule.weights
    attend_cached = AttentionRule.attend_cached

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """``P + f(S, P)`` ``(B, H, Lq, Lk)`` with ``S = q k^T / sqrt(D)`` before any mask, both
        in the compute dtype of ``q`` (float32 under bf16 autocast)."""
        bias = self.inner.bias(q, k, key_state, call)
        blocked = None if self.blocked is None else self.blocked(call.q_pos, call.k_pos)
        dtype = compute_dtype(q)
        with torch.autocast(q.device.type, enabled=False):
            scores = q.to(dtype) @ k.to(dtype).transpose(-1, -2) / math.sqrt(q.shape[-1])
            bias = bias.to(dtype)
            return bias + self.adjustment(scores, bias, blocked)

    def adjustment(self, scores: Tensor, bias: Tensor, blocked: Tensor | None = None) -> Tensor:
        """``f(S, P)`` ``(B, H, Lq, Lk)`` from ``scores (B, H, Lq, Lk)`` and ``bias
        (1|B, H, Lq, Lk)`` of one dtype, which it is computed in; ``blocked (H, Lq, Lk)``
        entries read a bias of 0 and get 0."""
        if blocked is not None:
            bias = bias.masked_fill(blocked, 0.0)
        dtype = scores.dtype
        w_scores, w_bias = self.hidden.weight.to(dtype).split(self.n_heads, dim=1)
        hidden = (
            torch.einsum("bhqk,nh->bqkn", scores, w_scores)
            + torch.einsum("bhqk,nh->bqkn", bias, w_bias)  # once, broadcast over the batch
            + self.hidden.bias.to(dtype)
        )
        out = F.linear(F.leaky_relu(hidden), self.out.weight.to(dtype), self.out.bias.to(dtype))
        out = out.permute(0, 3, 1, 2)
        return out if blocked is None else out.masked_fill(blocked, 0.0)


DAPE_HIDDEN = 32
"""Hidden units of DAPE's MLP when ``dape_hidden`` is null: the paper's width."""


class BiasEncoding(StackEncoding):
    """An encoding that adds a positional bias ``P (1, H, Lq, Lk)`` to the self-attention logits
    through the rule of :meth:`bias_rule` (ALiBi, KERPLE, FIRE, T5), with DAPE as an option.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        dape: true adjusts the bias by DAPE's MLP of the scores and the bias, one MLP per layer
            (:class:`DapeRule`); false or None (the YAMLs' null, which keeps the run identity of
            runs from before the setting): the encoding alone.
        dape_hidden: hidden units of that MLP; None: :data:`DAPE_HIDDEN` (the paper's 32).

    Raises:
        ValueError: ``dape`` is not a boolean or null, ``dape_hidden`` not a positive int or
            null, or ``dape_hidden`` is set without ``dape`` (one line).
    """

    option_forms: ClassVar[tuple[dict[str, Any], ...]] = ({"dape": True},)

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        name = type(self).__name__
        if dape is not None and not isinstance(dape, bool):
            raise ValueError(f"{name}: dape={dape!r} is not a boolean; use pe.dape=true or false")
        if dape_hidden is not None and (
            isinstance(dape_hidden, bool) or not isinstance(dape_hidden, int) or dape_hidden < 1
        ):
            raise ValueError(
                f"{name}: dape_hidden={dape_hidden!r} must be a positive int (hidden units of "
                f"DAPE's MLP); set pe.dape_hidden={DAPE_HIDDEN}, the paper's width, or null"
            )
        if dape_hidden is not None and not dape:
            raise ValueError(
                f"{name}: dape_hidden={dape_hidden} does nothing with dape off; "
                "set pe.dape=true as well, or leave pe.dape_hidden null"
            )
        self.dape = bool(dape)
        self.dape_hidden = DAPE_HIDDEN if dape_hidden is None else dape_hidden

    def bias_rule(self, layer: int) -> AttentionRule:
        """The rule that adds this encoding's bias in layer ``layer``, without DAPE."""
        raise NotImplementedError

    def blocked_keys(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """``(q_pos, k_pos) -> (H, Lq, Lk)`` bool, True at the keys a head does not look at
        (their bias is a mask), or None when every head may look at every key."""
        return None

    def self_rule(self, layer: int) -> AttentionRule:
        """:meth:`bias_rule`, wrapped in a :class:`DapeRule` of its own with ``dape``."""
        rule = self.bias_rule(layer)
        if not self.dape:
            return rule
        return DapeRule(rule, self.n_heads, self.dape_hidden, self.blocked_keys())


class DistanceBiasEncoding(BiasEncoding):
    """A bias that decays with the query-key distance (ALiBi, KERPLE), shared by every layer of
    the stack through :class:`SharedBias`, with the encoder forms of ``encoder_bias``.

    Subclasses give the bias of each side in :meth:`context` and combine them with
    :meth:`encoder_bias_of`; the decoder uses the "before" side alone (the papers' causal form).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    FORMS = {
        "split": "split (half the heads look left, half right)",
        "asymmetric": "asymmetric (slopes before/after the query differ)",
        "symmetric": "symmetric in |i-j| (no word order)",
    }
    option_forms = (
        *({"encoder_bias": form} for form in FORMS),
        *BiasEncoding.option_forms,
    )

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        encoder_bias: str,
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, dape, dape_hidden)
        if encoder_bias not in self.FORMS:
            raise ValueError(
                f"{type(self).__name__}: encoder_bias={encoder_bias!r} is unknown; use one of "
                f"{list(self.FORMS)}"
            )
        self.encoder_bias = encoder_bias
        others = ", ".join(text for form, text in self.FORMS.items() if form != encoder_bias)
        self.encoder_form = f"{self.FORMS[encoder_bias]}; options: {others}"
        self.sees_source_order = encoder_bias != "symmetric"
        self.rule = SharedBias()

    def encoder_bias_of(
        self, before: Tensor, after: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> Tensor:
        """The encoder's ``(1, H, Lq, Lk)`` bias from the ``(H, Lq, Lk)`` biases of keys before
        and after the query (each 0 on the other side); ``split`` heads get
        :data:`SPLIT_PENALTY` on the side they do not look at."""
        bias = before + after
        if self.encoder_bias == "split":
            bias = bias.masked_fill(split_blocked(self.n_heads, q_pos, k_pos), SPLIT_PENALTY)
        return bias[None]

    def bias_rule(self, layer: int) -> AttentionRule:
        return self.rule

    def blocked_keys(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        if self.causal or self.encoder_bias != "split":
            return None
        return functools.partial(split_blocked, self.n_heads)
