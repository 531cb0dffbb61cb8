"""RoPE (RoFormer, Su et al. 2021): q and k rotated by position-dependent angles before the
dot product. Pair ``i`` of a head's rotated dims turns by the angle ``m * theta_i`` at position
``m``, ``theta_i = base^(-2i/r)`` (``r`` rotated dims), so ``q_m . k_n`` depends on the
positions only through ``m - n``.

Context-extension scalings for test inputs longer than training (``scaling``), one function each
in :data:`SCALINGS` (as transformers' ``ROPE_INIT_FUNCTIONS``): ``linear`` (position
interpolation), ``ntk`` (NTK-aware base), ``yarn`` (YaRN's per-frequency ramp and temperature)
and ``dynamic_ntk`` (the NTK base following the length) and ``llama3`` (Llama 3.1's banded
interpolation); their inverse frequencies equal ``transformers.modeling_rope_utils``'. p-RoPE
(``rope_proportion = p``, transformers' ``"proportional"``): the ``floor(p D / 2)`` highest
frequencies of the whole head kept, the lower ones set to 0. Dynamic NTK rotates each decoder
position ``m`` once, before caching, at the base of the length ``m + 1``, and an encoder source
at the base of its own length.

Layout: the rotated dims are the first ``r = rotary_fraction * D`` of each head; pair ``i`` is
the adjacent pair ``(2i, 2i+1)``, as in the paper; the other ``D - r`` dims pass through.

Where it applies: self-attention, keys rotated once at their own position before the cache
(dynamic NTK's encoder at attention time), the table ``e^(i m theta)`` made once per forward in
``context``; cross-attention too with ``cross_attention=rotated`` (x-transformers'
``context_pos``). Formulas, dynamic NTK's cache and the pair layout against "rotate half":
``docs/encodings/rope.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site
from posenc.model.encodings.rope_scaling import SCALINGS, ScalingSettings, scaling_settings
from posenc.model.encodings.rotation import (
    RotaryRule,
    RotaryStack,
    RotaryTables,
    rope_frequencies,
    rotate_heads,
    rotation_table,
    slow_bands,
)

if TYPE_CHECKING:
    from posenc.model.positions import PositionAugmentation

CROSS_ATTENTION = ("plain", "rotated")


def rotary_dim(head_dim: int, rotary_fraction: float) -> int:
    """The number ``r`` of rotated dims per head; ValueError unless it is even and positive."""
    if not 0.0 < rotary_fraction <= 1.0:
        raise ValueError(f"rope: rotary_fraction={rotary_fraction} must lie in (0, 1]")
    r = int(head_dim * rotary_fraction)
    if r == 0 or r % 2:
        raise ValueError(
            f"rope: rotary_fraction={rotary_fraction} of head dim {head_dim} rotates {r} dims; "
            "rotation needs an even, positive number of dims (pairs)"
        )
    return r


def proportional_frequencies(inv_freq: Tensor, rope_proportion: float) -> Tensor:
    """p-RoPE: ``inv_freq (D/2,)``, a whole head's frequencies from highest to lowest, with all
    but the ``floor(p D / 2)`` highest set to 0 (a new tensor), ``p = rope_proportion``.

    ValueError unless ``p`` is a number in (0, 1] that keeps at least one frequency.
    """
    pairs = inv_freq.shape[-1]
    if isinstance(rope_proportion, bool) or not isinstance(rope_proportion, int | float):
        raise ValueError(
            f"rope: rope_proportion={rope_proportion!r} must be a number in (0, 1] "
            "(the fraction of frequencies kept) or null (plain RoPE)"
        )
    if not 0.0 < rope_proportion <= 1.0:
        raise ValueError(
            f"rope: rope_proportion={rope_proportion} must lie in (0, 1] "
            "(the fraction of frequencies kept), or be null for plain RoPE"
        )
    kept = int(rope_proportion * pairs)
    if kept == 0:
        raise ValueError(
            f"rope: rope_proportion={rope_proportion} keeps none of the {pairs} frequencies of "
            f"head dim {2 * pairs}; raise it to keep one (rope_proportion >= 1/{pairs})"
        )
    out = inv_freq.clone()
    out[kept:] = 0.0
    return out


#: the share of a head's pairs the clipped RoPE clips when ``clipped_pairs`` is null: its
#: paper's 20 of Llama's 64
CLIPPED_SHARE = 20 / 64
SLOW_BANDS = ("hope", "soft_clip", "hard_clip")


def slow_band_frequencies(
    inv_freq: Tensor,
    kind: str,
    training_length: int,
    clipped_pairs: int | None,
    unscaled: Tensor,
) -> Tensor:
    """RoPE's slow bands changed, ``inv_freq (D/2,)`` highest first (a new tensor). Which
    bands are slow is read from RoPE's own frequencies ``unscaled (D/2,)``, so
    a test-time scaling of ``inv_freq`` changes the same bands as training did:

    * ``hope`` (HoPE, Chen et al. 2025, in the statement of Levy et al. 2026, "RoPE is dead,
      long live RoPE"): a band whose wavelength exceeds the training length ``L``,
      ``theta_j < 2 pi / L``, does not rotate (``theta_j = 0``); the faster ones are RoPE's;
    * ``soft_clip`` (clipped RoPE, Li, Ren, Yuille and Wang 2026, arXiv 2602.05258, its code's
      ``use_cope``): the lowest ``n = clipped_pairs`` frequencies multiplied by ``0.5 (1 + cos
      t)``, ``t`` from 0 at the fastest of them to ``pi`` at the slowest, evenly spaced;
    * ``hard_clip`` (the same paper's HardClip): those ``n`` set to 0.

    ``clipped_pairs`` null: :data:`CLIPPED_SHARE` of the pairs, rounded.

    Raises:
        ValueError: an unknown kind, or a count that clips none or every pair (one line).
    """
    pairs = inv_freq.shape[-1]
    out = inv_freq.clone()
    if kind == "hope":
        if training_length <= 0:
            raise ValueError(
                "rope: slow_bands=hope needs original_max_len > 0 (the training length L), "
                f"got {training_length}"
            )
        out[slow_bands(unscaled, training_length)] = 0.0
        return out
    if kind not in SLOW_BANDS:
        raise ValueError(
            f"rope: slow_bands={kind!r} is unknown; use one of {', '.join(SLOW_BANDS)} "
            "(null: RoPE's)"
        )
    n = round(CLIPPED_SHARE * pairs) if clipped_pairs is None else clipped_pairs
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < pairs:
        raise ValueError(
            f"rope: clipped_pairs={clipped_pairs} must clip from 1 to {pairs - 1} of the "
            f"{pairs} pairs (null: {CLIPPED_SHARE:.3g} of them)"
        )
    if kind == "hard_clip":
        out[pairs - n :] = 0.0
    else:
        t = torch.linspace(0.0, math.pi, n, dtype=torch.float64)
        out[pairs - n :] = (inv_freq[pairs - n :].double() * 0.5 * (1.0 + torch.cos(t))).to(
            out.dtype
        )
    return out


@dataclass
class LengthTables:
    """What an encoder call rotates with when the frequencies follow the sequence length
    (dynamic NTK, LongRoPE): its positions, the frequencies up to the training length, the
    scaling and its temperature. :meth:`table` builds the rotation for the sources' lengths
    once per call (the first layer builds it, the others reuse it)."""

    positions: Tensor
    inv_freq: Tensor
    scaling: str
    settings: ScalingSettings
    scale: float = 1.0
    _built: tuple[Tensor | None, Tensor] | None = field(default=None, repr=False)

    def lengths(self, key_padding_mask: Tensor | None) -> Tensor:
        """The lengths ``L`` that set the base: ``(B,)`` non-padding keys per source, or
        ``(1,)`` all positions without a mask."""
        if key_padding_mask is None:
            return torch.tensor([len(self.positions)], device=self.positions.device)
        return (~key_padding_mask).sum(-1)

    def table(self, key_padding_mask: Tensor | None) -> Tensor:
        """The complex rotation ``(L, r/2)``, or ``(B, 1, L, r/2)`` when the sources of the
        batch have different bases."""
        if self._built is not None and self._built[0] is key_padding_mask:
            return self._built[1]
        lengths = self.lengths(key_padding_mask)
        if bool((lengths <= self.settings.original_max_len).all()):
            table = rotation_table(self.positions, self.inv_freq, self.scale)
        elif bool((lengths == lengths[0]).all()):
            table = rotation_table(self.positions, self.scaled(lengths[:1])[0], self.scale)
        else:
            scaled = self.scaled(lengths)[:, None]
            table = rotation_table(self.positions, scaled, self.scale)[:, None]
        self._built = (key_padding_mask, table)
        return table

    def scaled(self, lengths: Tensor) -> Tensor:
        """The inverse frequencies ``(S, r/2)`` at ``lengths (S,)``."""
        return SCALINGS[self.scaling].at_lengths(self.inv_freq, self.settings, lengths)


class RotateAtAttention(AttentionRule):
    """A rule that rotates q and k when it attends (:meth:`rotated`) rather than before they
    are cached; attention is then the base class's."""

    def rotated(self, q: Tensor, k: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
        """``q (B, H, Lq, D)`` and ``k (B, H, Lk, D)`` rotated for ``call``."""
        raise NotImplementedError

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return super().weights(*self.rotated(q, k, call), key_state, call)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        return super().forward(*self.rotated(q, k, call), v, key_state, call)


class LengthEncoderRule(RotateAtAttention):
    """A length-following scaling in the encoder (dynamic NTK, LongRoPE): q and k are rotated
    at attention time, where the padding mask tells each source's length
    (:class:`LengthTables`); the encoder caches nothing, so this costs what rotating in
    :meth:`prepare` would.

    :attr:`rotates_qk` stays False: :meth:`prepare` does not rotate, so the plots' rotary panel,
    which rotates through it, would draw no rotation. ``heads``: rotate the last this many heads
    only (None: every head).
    """

    def __init__(self, heads: int | None = None) -> None:
        super().__init__()
        self.heads = heads

    def rotated(self, q: Tensor, k: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
        """``q, k (B, H, L, D)`` rotated with the frequencies of each source's length."""
        if not isinstance(call.context, LengthTables):
            raise ValueError("a length-following encoder rule needs the stack's LengthTables")
        table = call.context.table(call.key_padding_mask)
        return rotate_heads(q, table, self.heads), rotate_heads(k, table, self.heads)


class CrossRotaryRule(RotateAtAttention):
    """Cross-attention with RoPE at both sides' own positions (x-transformers' ``context_pos``):
    queries rotated at their target positions ``call.q_pos``, memory keys at their source
    positions ``call.k_pos``, so ``q_t . k_s`` depends on ``t - s``. Keys are rotated at
    attention time (the cross-attention cache holds the memory's keys as projected).

    Args:
        inv_freq: ``theta (r/2,)``.
        attention_factor: multiplies cos and sin (YaRN's temperature; 1 otherwise).
        heads: rotate the last this many heads only (None: every head).
    """

    def __init__(
        self, inv_freq: Tensor, attention_factor: float = 1.0, heads: int | None = None
    ) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor
        self.heads = heads

    def rotated(self, q: Tensor, k: Tensor, call: AttentionCall) -> tuple[Tensor, Tensor]:
        """``q (B, H, Lq, D)`` and ``k (B, H, Lk, D)`` rotated at their own positions."""
        q_table = rotation_table(call.q_pos, self.inv_freq, self.attention_factor)
        k_table = rotation_table(call.k_pos, self.inv_freq, self.attention_factor)
        return rotate_heads(q, q_table, self.heads), rotate_heads(k, k_table, self.heads)


class RotaryEncoding(RotaryStack):
    """RoPE (Su et al.) on encoder and decoder self-attention, with optional context extension
    and p-RoPE's zeroed lowest frequencies.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: the wavelength base (10000 in the paper).
        rotary_fraction: fraction of each head's dims that is rotated (the rest pass through);
            the rotated count must be even.
        scaling: ``none``, ``linear`` (position interpolation), ``ntk`` (NTK-aware base),
            ``yarn`` or ``dynamic_ntk`` (NTK-aware base following the length); meant to be
            switched on when testing on inputs longer than training.
        factor: the context-extension factor (>= 1); ignored with ``scaling=none``.
        original_max_len: the training length (YaRN's ramp bounds depend on it, and dynamic
            NTK scales only longer sequences).
        rope_proportion: p-RoPE's fraction ``p`` of frequencies kept: the ``floor(p D / 2)``
            highest of the whole head, the lower ones set to 0 (those pairs are not rotated);
            ``None`` (the default) is plain RoPE. Needs ``rotary_fraction = 1``.
        cross_attention: ``plain`` (or ``None``, the default: source and target positions share
            no axis) or ``rotated`` (:class:`CrossRotaryRule`, x-transformers' ``context_pos``).
        rotate_num_heads: rotate only the last this many heads of every layer, the others
            without positions (x-transformers' ``rotate_num_heads``); ``None``: every head.
        slow_bands: ``hope``, ``soft_clip`` or ``hard_clip`` (:func:`slow_band_frequencies`,
            from training on); ``None``: RoPE's frequencies.
        clipped_pairs: how many of the lowest pairs the clips change (``None``: the paper's
            share, :data:`CLIPPED_SHARE`).
        **scaling_parameters: the scalings' own parameters, read by :data:`SCALINGS`' entry
            of ``scaling`` (``low_freq_factor``/``high_freq_factor``: llama3's bands;
            ``mscale``/``mscale_all_dim``: YaRN's temperature; ``short_factor``/``long_factor``:
            LongRoPE's divisors); those of another scaling must be null.
    """

    applies_to = "encoder and decoder self-attention (q, k rotated); cross-attention plain"
    encoder_form = "same rotation as the decoder (RoPE is bidirectional by construction)"
    speed_target = 1.10
    augment_modes = frozenset({"random", "scale"})
    option_forms = (
        {"rope_proportion": 0.75},
        {"cross_attention": "rotated"},
        {"rotate_num_heads": 1},
        {"slow_bands": "hard_clip"},
    )

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        rotary_fraction: float = 1.0,
        scaling: str = "none",
        factor: float = 1.0,
        original_max_len: int = 256,
        rope_proportion: float | None = None,
        cross_attention: str | None = None,
        rotate_num_heads: int | None = None,
        slow_bands: str | None = None,
        clipped_pairs: int | None = None,
        **scaling_parameters: Any,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        if rotate_num_heads is not None and not 0 < rotate_num_heads <= n_heads:
            raise ValueError(
                f"rope: rotate_num_heads={rotate_num_heads} must be a number of heads from 1 to "
                f"n_heads={n_heads} (null: every head)"
            )
        self.rotate_num_heads = rotate_num_heads
        if cross_attention is not None and cross_attention not in CROSS_ATTENTION:
            raise ValueError(
                f"rope: cross_attention={cross_attention!r} is unknown; "
                f"use one of {CROSS_ATTENTION} (null: plain)"
            )
        if cross_attention == "rotated" and getattr(SCALINGS.get(scaling), "at_lengths", None):
            raise ValueError(
                f"rope: cross_attention=rotated with scaling={scaling}: the frequencies of a "
                "source's and a target's lengths differ; use another scaling or "
                "cross_attention=plain"
            )
        dim = rotary_dim(d_model // n_heads, rotary_fraction)
        if rope_proportion is not None and rotary_fraction != 1.0:
            raise ValueError(
                f"rope: rope_proportion={rope_proportion} with rotary_fraction={rotary_fraction} "
                "leaves dims unrotated twice; set rotary_fraction=1.0 for p-RoPE"
            )
        self.scaling = scaling
        self.settings = scaling_settings(
            scaling, dim, base, factor, original_max_len, scaling_parameters
        )
        entry = SCALINGS[scaling]
        inv_freq, self.attention_factor = entry.frequencies(self.settings)
        if rope_proportion is not None:
            inv_freq = proportional_frequencies(inv_freq, rope_proportion)
        if slow_bands is not None:  # after p-RoPE's, when both are set
            unscaled = rope_frequencies(dim, base)
            inv_freq = slow_band_frequencies(
                inv_freq, slow_bands, original_max_len, clipped_pairs, unscaled
            )
        elif clipped_pairs is not None:
            raise ValueError(
                "rope: clipped_pairs is the clipped RoPE's; set slow_bands=soft_clip or "
                "hard_clip, or leave it null"
            )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.dynamic = entry.at_lengths is not None
        self.cross_rotated = cross_attention == "rotated"
        if self.cross_rotated:
            self.applies_to = (
                "encoder and decoder self-attention and cross-attention (q at target, k at "
                "source positions)"
            )

    def self_rule(self, layer: int) -> AttentionRule:
        if self.dynamic and not self.causal:
            return LengthEncoderRule(self.rotate_num_heads)
        return RotaryRule(self.rotate_num_heads)

    def cross_rule(self, layer: int) -> AttentionRule:
        if self.cross_rotated:
            return CrossRotaryRule(self.inv_freq, self.attention_factor, self.rotate_num_heads)
        return AttentionRule()

    def augment(self, augmentation: PositionAugmentation | None, name: str = "?") -> None:
        """As :meth:`StackEncoding.augment`; refused with rotated cross-attention, whose source
        positions are the encoder's true ones."""
        if augmentation is not None and self.cross_rotated:
            raise ValueError(
                f"pe={name}: pe.augment={augmentation.mode} with pe.cross_attention=rotated: "
                "cross-attention would see augmented target but true source positions; "
                "use one or the other"
            )
        super().augment(augmentation, name)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> RotaryTables | LengthTables:
        """The ``(Lq, r/2)`` table of the call's new tokens (keys share the queries' positions);
        with a length-following scaling, each decoder position at the frequencies of the length
        it completes, and what the encoder's rule needs to rotate at each source's length."""
        if self.dynamic and not self.causal:
            return LengthTables(
                q_pos, self.inv_freq, self.scaling, self.settings, self.attention_factor
            )
        inv_freq = self.inv_freq
        if self.dynamic:  # (Lq, r/2): position m at the frequencies of length m + 1
            inv_freq = SCALINGS[self.scaling].at_lengths(inv_freq, self.settings, q_pos + 1)
        table = rotation_table(q_pos, inv_freq, self.attention_factor)
        return RotaryTables(table, table)
