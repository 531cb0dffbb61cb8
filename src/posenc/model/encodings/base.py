"""The interface every positional encoding implements.

An encoding is built once per stack (encoder, decoder) as a :class:`StackEncoding`. It may

1. add absolute positions to the stack's input (:meth:`StackEncoding.embed`),
2. compute once per forward pass what all layers of the stack share
   (:meth:`StackEncoding.context`: a bias table, slopes, cos/sin), and
3. give each layer an :class:`AttentionRule` for its self-attention and its cross-attention,
   which decides how a query scores a key (rotate q/k, add a bias, add key/value terms,
   replace the softmax).

The base classes are the "no position information" case (``nonepe``): identity embedding,
no context, and plain scaled dot-product attention through
:func:`torch.nn.functional.scaled_dot_product_attention`.

Shapes: ``B`` batch, ``H`` heads, ``L``/``Lq``/``Lk`` lengths, ``D`` head dim, ``d`` d_model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

if TYPE_CHECKING:
    from posenc.model.positions import PositionAugmentation
    from posenc.model.sinks import Sinks
    from posenc.model.temperature import Temperature


class Site(str, Enum):  # noqa: UP042  (StrEnum would change str(Site.ENCODER))
    """Which stack an encoding is built for."""

    ENCODER = "encoder"
    DECODER = "decoder"


@dataclass
class AttentionCall:
    """Everything an attention rule needs beyond q, k, v for one attention call.

    Attributes:
        q_pos: ``(Lq,)`` long, absolute positions of the queries.
        k_pos: ``(Lk,)`` long, absolute positions of the keys.
        causal: whether query i may only see keys at positions ``<= q_pos[i]``.
            With a single query (cached decoding) that query is the newest token, so every
            cached key is allowed and no mask is built.
        key_padding_mask: ``(B, Lk)`` bool, True marks padding keys; or None.
        context: what the stack's encoding computed once for this forward pass.
        dropout_p: attention-weight dropout probability (0 in eval).
    """

    q_pos: Tensor
    k_pos: Tensor
    causal: bool
    key_padding_mask: Tensor | None = None
    context: Any = None
    dropout_p: float = 0.0

    @property
    def needs_causal_mask(self) -> bool:
        return self.causal and self.q_pos.shape[0] > 1

    @property
    def sdpa_is_causal(self) -> bool:
        """Whether SDPA's ``is_causal=True`` is exactly this call's mask.

        SDPA aligns that mask top-left (query ``i`` sees keys ``0..i``), which is right only
        when queries and keys are the same positions: a causal call without padding whose
        queries start at the first key. Several new tokens on a non-empty cache
        (``Lq < Lk``) need the explicit mask of :meth:`allowed`.
        """
        return (
            self.needs_causal_mask
            and self.key_padding_mask is None
            and self.q_pos.shape[0] == self.k_pos.shape[0]
        )

    def allowed(self) -> Tensor | None:
        """Bool mask ``(B|1, 1, Lq, Lk)``, True where query i may attend key j; None if all may."""
        mask = None
        if self.needs_causal_mask:
            mask = (self.k_pos[None, :] <= self.q_pos[:, None])[None, None]
        if self.key_padding_mask is not None:
            keep = ~self.key_padding_mask[:, None, None, :]
            mask = keep if mask is None else mask & keep
        return mask


def additive_mask(bias: Tensor | None, call: AttentionCall, dtype: torch.dtype) -> Tensor | None:
    """Bias ``(B|1, H|1, Lq, Lk)`` with disallowed positions set to -inf, in ``dtype``.

    Returns a bool mask when there is no bias (SDPA keeps its fused kernel for those), and None
    when nothing is masked.
    """
    allowed = call.allowed()
    if bias is None:
        return allowed
    bias = bias.to(dtype)
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
    return bias


#: The SDPA kernels an attention with an additive mask (a position bias) may use when a backward
#: pass follows on a GPU: all but cuDNN's. With a mask, cuDNN's backward on H100/H200 (torch 2.11
#: on) returns NaN in the query gradient when a row's log-sum-exp is below -88.7 (its exp(-lse)
#: overflows float32) and the key length is 64 modulo 128 (pytorch/pytorch#196678): a bias
#: reaches that (ALiBi's padded encoder rows far from every real key: docs/METHODS.md, §9); a bool
#: mask alone needs scores that large, and keeps cuDNN's kernels.
BIASED_BACKWARD_KERNELS = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    scale: float | None,
    is_causal: bool = False,
) -> Tensor:
    """:func:`~torch.nn.functional.scaled_dot_product_attention` of ``q (B, H, Lq, D)``,
    ``k (B, H, Lk, D)``, ``v (B, H, Lk, Dv)`` with ``mask (B|1, H|1, Lq, Lk)`` (bool, or
    additive), ``(B, H, Lq, Dv)``; an additive mask on a GPU whose backward will run is held to
    :data:`BIASED_BACKWARD_KERNELS`."""
    biased = mask is not None and mask.dtype != torch.bool
    needs_backward = q.requires_grad or k.requires_grad or v.requires_grad
    if not (biased and q.is_cuda and needs_backward):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    with sdpa_kernel(BIASED_BACKWARD_KERNELS):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of numerically sensitive steps (gates, cumulative sums, softmax): float32 for
    half-precision inputs, the input's own dtype for float32 and float64."""
    return torch.promote_types(x.dtype, torch.float32)


def masked_softmax(scores: Tensor, call: AttentionCall) -> Tensor:
    """Softmax over the last dim of ``scores (B, H, Lq, Lk)`` with the call's mask applied."""
    allowed = call.allowed()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores.to(compute_dtype(scores)), dim=-1).to(scores.dtype)


class EncodingModule(nn.Module):
    """Base of every module an encoding owns (its stack encodings and attention rules).

    An encoding initialises its own parameters as its paper prescribes, in its constructor; the
    model's Xavier initialisation of the layers (:mod:`posenc.model.transformer`) leaves them
    alone, and weight decay does not apply to them (:mod:`posenc.training.optim`).
    """

    def reset_parameters(self) -> None:
        """Initialise this module's own parameters (default: nothing to do); constructors of
        modules with parameters call it."""


class AttentionRule(EncodingModule):
    """How one attention layer turns q, k, v into outputs. Default: plain softmax attention.

    Subclasses override the narrowest hook that expresses their encoding:

    * :meth:`prepare` to transform new q/k before they are cached (RoPE, xPos) or to compute a
      per-key state that is cached with k (FoX's log forget gates);
    * :meth:`bias` to add a ``(B|1, H|1, Lq, Lk)`` term to the logits (ALiBi, T5, KERPLE, FoX);
    * :meth:`forward` to replace the attention computation (Shaw, CoPE, stick-breaking, PaTH);
    * :meth:`attend_cached` when a new token changes how the cached keys are seen (PaTH);
    * :meth:`after_feedforward` to read the layer's feed-forward output (TAPE's position
      states, carried from layer to layer);
    * :meth:`head_counts` when the rule attends with other heads than q, k and v are projected to
      (RoPE++'s imaginary heads).

    Two declarations tell the diagnostic plots (:mod:`posenc.analysis.plot_pe`) what suits the
    rule: :attr:`rotates_qk` and :attr:`masking_bias`.
    """

    rotates_qk: ClassVar[bool] = False
    """True when :meth:`prepare` rotates q and k by their positions, so that ``q_i . k_j``
    depends on the distance through the rotation alone; the plots then draw the rotated
    ``q . k`` of one vector against distance."""

    masking_bias: ClassVar[float | None] = None
    """A finite bias that masks rather than biases: entries of :meth:`bias` at or below it are
    keys the head does not look at, left out of the plotted bias. None: every entry is a bias."""

    def head_counts(self, n_heads: int) -> tuple[int, int]:
        """``(projected, attended)`` for a layer of ``n_heads`` heads of ``D = d / n_heads``: the
        heads q, k and v are projected to (and cached), and the heads the rule's output holds
        (the output projection's input is ``attended * D``). Default: ``n_heads`` both."""
        return n_heads, n_heads

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Transform the new tokens' ``q, k (B, H, L, D)`` given their input ``x (B, L, d)``.

        Called for self-attention only, on the tokens of this call (before the k/v cache is
        extended), at absolute ``positions (L,)``; ``context`` is the call's ``call.context``
        (what the stack computed once for this forward, e.g. RoPE's cos/sin). Returns
        ``(q, k, key_state)``; a non-None ``key_state (B, H, L)`` is cached and concatenated
        like k.
        """
        return q, k, None

    def bias(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor | None:
        """Additive logit bias ``(B|1, H|1, Lq, Lk)``, or None."""
        return None

    def score_scale(self, q: Tensor) -> float | None:
        """The factor of ``q k^T`` in the logits; None: ``1/sqrt(D)`` of ``q``'s last dim (for
        a rule whose :meth:`prepare` changes the width of q and k, as PoPE doubles it)."""
        return None

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """Attention weights ``(B, H, Lq, Lk)`` that :meth:`forward` applies to the values.

        Used by plots, reports and tests, never on the training path. The default is
        ``softmax(q k^T / sqrt(D) + bias)`` under the call's mask; rules that override
        :meth:`forward` override this too.
        """
        scale = self.score_scale(q)
        if scale is None:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        else:
            scores = q @ k.transpose(-1, -2) * scale
        bias = self.bias(q, k, key_state, call)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return masked_softmax(scores, call)

    def attend_cached(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> tuple[Tensor, Tensor]:
        """Self-attention with a cache: the output (as :meth:`forward`) and the keys
        ``(B, H, Lk, D)`` the cache keeps for the next call's new tokens to extend: ``k``
        itself, unless later tokens change how earlier keys are seen (PaTH's Householder
        products transform every cached key)."""
        return self(q, k, v, key_state, call), k

    def after_feedforward(self, y: Tensor, call: AttentionCall) -> None:
        """See the feed-forward output ``y (B, Lq, d)`` of this rule's layer (before dropout and
        the residual) for the same new tokens as ``call``; the default ignores it."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        """Attention output ``(B, H, Lq, D)`` from ``q (B, H, Lq, D)``, ``k, v (B, H, Lk, D)``."""
        bias, scale = self.bias(q, k, key_state, call), self.score_scale(q)
        if bias is None and call.sdpa_is_causal:
            return sdpa(q, k, v, None, call.dropout_p, scale, is_causal=True)
        return sdpa(q, k, v, additive_mask(bias, call, q.dtype), call.dropout_p, scale)


class StackEncoding(EncodingModule):
    """A positional encoding for one stack; the base class adds no position information.

    Args:
        site: the stack this instance serves (encoder or decoder).
        d_model: model width ``d``.
        n_heads: attention heads ``H``.
        n_layers: layers in the stack.

    ``applies_to`` and ``encoder_form`` are one-line statements shown in the guide's encodings
    table: where the encoding acts, and what the encoder (bidirectional) form is.
    ``sees_source_order`` states whether the encoder tells a source from its reversal (the
    generic tests check it); an encoding whose encoder form is chosen by a setting sets the last
    two per instance.
    """

    applies_to: str = "nowhere (no position information)"
    encoder_form: str = "-"
    sees_source_order: bool = True

    speed_target: ClassVar[float | None] = None
    """Training step at length 128 as a ratio to the reference encoding's, at most; checked by
    ``scripts/bench.py`` (None: no target, as for the reference itself)."""

    augment_modes: ClassVar[frozenset[str]] = frozenset()
    """The ``pe.augment`` modes (:mod:`posenc.model.positions`) that change what this encoding
    computes: ``shift`` for absolute positions, ``random`` for any that reads position indices
    (distances included), ``scale`` for those that take real-valued positions. Empty: it reads
    no position indices (or, for relative ones, none of the modes would change it)."""

    option_forms: ClassVar[tuple[dict[str, Any], ...]] = ()
    """The forms a config may choose between that the generic suite
    (``tests/test_every_encoding.py``) runs besides the config's own: each a dict of overrides
    ``{KEY: value}`` of the ``configs/pe/*.yaml`` settings (constructor arguments) that builds
    this class. Declared here, with the encoding, so that an encoding with options touches only
    its module, its YAML and its own test (empty: the config's form alone)."""

    former_paths: ClassVar[tuple[str, ...]] = ()
    """``"module.Class"`` paths this class had before it moved: a run directory's config names
    the class where it was when the run was made, so the catalogue knows it there too."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass defined by code that runs joins :data:`CATALOGUE`: the only classes a
        config's ``_target_`` may name."""
        super().__init_subclass__(**kwargs)
        CATALOGUE[f"{cls.__module__}.{cls.__qualname__}"] = cls
        for path in cls.__dict__.get("former_paths", ()):
            CATALOGUE[path] = cls  # the runs made before the class moved name it there

    def __init__(self, site: Site, d_model: int, n_heads: int, n_layers: int) -> None:
        super().__init__()
        self.site = Site(site)
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.off_layers: frozenset[int] = frozenset()
        """Layers (0-based, in this stack) whose attention is plain: the encoding switched off
        there (``pe.off_layers``, e.g. RoPE/NoPE interleaving); see :meth:`switch_off`."""
        self.augmentation: PositionAugmentation | None = None
        """Training-time positions (``pe.augment``); see :meth:`augment`."""
        self.sinks: Sinks | None = None
        """Learned attention sinks in every attention (``pe.sinks``), or None."""
        self.temperature: Temperature | None = None
        """The queries' temperature of some self-attention layers (``pe.temperature``); see
        :meth:`temper`."""

    def add_sinks(self, sinks: Sinks | None) -> None:
        """Give every attention of this stack learned sinks (``pe.sinks``,
        :mod:`posenc.model.sinks`; None: none); call before the stack builds its layers."""
        self.sinks = sinks

    def temper(self, temperature: Temperature | None) -> None:
        """Scale the self-attention queries of the layers ``temperature`` applies to (None:
        none); call before the stack builds its layers.

        Raises:
            ValueError: it lists a layer the stack does not have (one line).
        """
        if temperature is not None:
            temperature.check_layers(self.n_layers, self.site.value)
        self.temperature = temperature

    def augment(self, augmentation: PositionAugmentation | None, name: str = "?") -> None:
        """Draw this stack's positions with ``augmentation`` in training (None: never).

        Raises:
            ValueError: the mode changes nothing this encoding computes (one line naming the
                modes it accepts).
        """
        if augmentation is not None and augmentation.mode not in self.augment_modes:
            accepted = ", ".join(sorted(self.augment_modes)) or "none"
            raise ValueError(
                f"pe={name}: pe.augment={augmentation.mode} would change nothing it computes "
                f"(modes it accepts: {accepted}); the guide's encodings table says which "
                "encoding accepts which"
            )
        self.augmentation = augmentation

    def positions(self, length: int, device: torch.device) -> Tensor:
        """The positions ``(length,)`` of a stack call that starts at 0: ``arange(length)``, or
        drawn by :attr:`augmentation` while training."""
        if self.training and self.augmentation is not None:
            return self.augmentation(length, device)
        return torch.arange(length, device=device)

    @property
    def acts_in_attention(self) -> bool:
        """Whether this encoding gives its layers their own attention rules (False for those
        that only add positions to the stack input)."""
        return type(self).self_rule is not StackEncoding.self_rule

    def switch_off(self, layers: Iterable[int], name: str = "?") -> None:
        """Make the attention of ``layers`` plain (self- and cross-attention); call before the
        stack builds its layers. An input-level part (:meth:`embed`) stays on.

        Raises:
            ValueError: a layer is not an int of this stack, or the encoding has no
                attention rules to switch off (one line).
        """
        layers = list(layers)
        if not self.acts_in_attention:
            raise ValueError(
                f"pe={name}: pe.off_layers={layers} has nothing to switch off: this encoding adds "
                "positions to the stack input, not per layer; use it with an encoding that acts "
                "in attention (the guide's encodings table says where each acts)"
            )
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise ValueError(f"pe.off_layers={layers}: {layer!r} is not a layer index (int)")
            if not 0 <= layer < self.n_layers:
                raise ValueError(
                    f"pe.off_layers={layers}: the {self.site.value} has {self.n_layers} layers "
                    f"(0 to {self.n_layers - 1}), so layer {layer} does not exist"
                )
        self.off_layers = frozenset(layers)

    def layer_rule(self, layer: int, cross: bool = False) -> AttentionRule:
        """The rule layer ``layer`` attends with: :meth:`self_rule` (or :meth:`cross_rule`),
        plain attention on the layers of :attr:`off_layers`, with learned sinks (:attr:`sinks`),
        self-attention with its queries scaled where :attr:`temperature` applies."""
        if cross:
            rule = AttentionRule() if layer in self.off_layers else self.cross_rule(layer)
            return rule if self.sinks is None else self.sinks.wrap(rule, self.n_heads)
        rule = AttentionRule() if layer in self.off_layers else self.self_rule(layer)
        if self.sinks is not None:  # inside the temperature, which scales its queries
            rule = self.sinks.wrap(rule, self.n_heads)
        if self.temperature is not None and self.temperature.applies(layer, self.off_layers):
            return self.temperature.wrap(rule, self.n_heads)
        return rule

    @property
    def causal(self) -> bool:
        """True for the decoder stack, whose self-attention never looks ahead."""
        return self.site is Site.DECODER

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Add absolute position information to the stack input ``x (B, L, d)``."""
        return x

    @property
    def max_positions(self) -> int | None:
        """The most positions this stack can embed (positions ``0 .. n - 1``); None: any."""
        return None

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Any:
        """Per-forward precomputation shared by every layer's self-attention rule."""
        return None

    def self_rule(self, layer: int) -> AttentionRule:
        """The self-attention rule of layer ``layer`` (0-based)."""
        return AttentionRule()

    def cross_rule(self, layer: int) -> AttentionRule:
        """The cross-attention rule of decoder layer ``layer``: plain attention by default, since
        source and target positions do not lie on one axis."""
        return AttentionRule()


#: ``"module.Class"`` -> every :class:`StackEncoding` subclass defined so far (posenc's own, once
#: :mod:`posenc.model.encodings` has imported its modules, and any a program defines itself)
CATALOGUE: dict[str, type[StackEncoding]] = {
    f"{StackEncoding.__module__}.{StackEncoding.__qualname__}": StackEncoding
}


class NoPositions(StackEncoding):
    """``nonepe``, the control: no position information anywhere, so the model sees a source
    as a bag of tokens."""

    sees_source_order = False
