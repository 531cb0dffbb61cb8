"""ALiBi, attention with linear biases (Press, Smith & Lewis, ICLR 2022).

No position vectors are added to the inputs. Every self-attention logit of head ``h`` receives a
fixed penalty proportional to the query-key distance::

    decoder (causal, the paper's form):  bias[h, i, j] = -m_h * (i - j)   for j <= i
    encoder (bidirectional):              bias[h, i, j] = -m_h * |i - j|

The slopes ``m_h`` are not learned: for ``n`` a power of two they are the geometric sequence
``2^(-8/n), 2^(-16/n), ..., 2^(-8)``; otherwise the first ``2^floor(log2 n)`` slopes of that
sequence followed by every other slope of the ``2^(floor(log2 n) + 1)`` sequence (the
``get_slopes`` function of the paper's repository, ofirpress/attention_with_linear_biases).

Where it applies: encoder self-attention and decoder self-attention, with the same slopes; no
bias in cross-attention (source and target positions do not lie on one axis).

Encoder forms (the paper only trains causal language models), chosen by ``encoder_bias``;
``split`` is the default, chosen by the measured comparison in docs/METHODS.md (§1: on the toy
reversal task it reaches about 69% exact matches where ``symmetric`` reaches 37% and
``asymmetric`` 23%; on the local data the three forms are within seed noise):

* ``symmetric``: ``-m_h |i - j|``, the form its authors point to for bidirectional attention
  (issue #5 of their repository; also data2vec 2.0 and Voicebox). It carries distance but not
  direction: the encoder is equivariant to reversing its input, and as cross-attention has no
  positions either, a source and its reversal give the same translation (kept as an option, for
  comparison; the guide's encodings table says it cannot see word order);
* ``asymmetric``: different slopes before and after the query, ``-m_h (i - j)`` for keys at or
  before it and ``-m_(H-1-h) (j - i)`` for keys after it: each head pairs a slope with the
  mirror slope of the geometric sequence (its steepest-left head is its gentlest-right one), so
  every head but the middle one of an odd count tells left from right, still with no parameters;
* ``split``: heads that look in opposite directions, as a bidirectional RNN does: even heads
  see the keys at or before the query (the paper's causal bias), odd heads the keys at or after
  it (its mirror), both with the paper's slopes; the other side gets the finite penalty
  ``SPLIT_PENALTY`` rather than ``-inf``, which is exactly a mask for every real query (its own
  key is always on its side) and keeps padding queries, whose side can be all padding, free of
  NaN.

Incremental decoding: the single new query sits at position ``call.q_pos``; its row of the bias
is built from the absolute positions, so cached keys need no extra state.

Speed: the bias needs no gradient, so SDPA keeps its fused kernel; it is built once per forward
in :meth:`ALiBiEncoding.context` and shared by every layer.

ALiBi on some heads (``alibi_num_heads: N``, x-transformers' option of that name): the first
``N`` heads get the slopes of an ``N``-head ALiBi, the others slope 0, no bias (NoPE heads; in
the encoder under ``split`` they still look at their side only, the form being the encoder's).

DAPE (``dape: true``, :mod:`posenc.model.encodings.common`): each layer adjusts this bias by an
MLP of its attention scores and the bias, ``S + P + f(S, P)`` (the paper's ALiBi-DAPE).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.model.encodings.base import Site
from posenc.model.encodings.common import DistanceBiasEncoding, side_distances


def alibi_slopes(n_heads: int) -> Tensor:
    """The ``(H,)`` float32 head slopes of ALiBi for any head count ``H >= 1``.

    Head ``h`` (0-based) of a power-of-two ``n`` gets ``2^(-8 (h + 1) / n)``. For other ``n``
    with ``p = 2^floor(log2 n)``: the ``p`` slopes of ``p`` heads, then the slopes of ``2p``
    heads at odd multiples of ``8 / (2p)``, i.e. every other one starting from the first.
    """
    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got n_heads={n_heads}")
    p = 2 ** math.floor(math.log2(n_heads))
    exponents = torch.arange(1, p + 1, dtype=torch.float64) * (8.0 / p)
    extra = (2 * torch.arange(n_heads - p, dtype=torch.float64) + 1) * (8.0 / (2 * p))
    return torch.pow(2.0, -torch.cat([exponents, extra])).float()


class ALiBiEncoding(DistanceBiasEncoding):
    """Fixed linear distance penalties, ``(1, H, Lq, Lk)`` per forward, in self-attention only.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        encoder_bias: the encoder form, ``split``, ``asymmetric`` or ``symmetric`` (module
            docstring); the decoder always uses the paper's causal bias.
        alibi_num_heads: the heads that get a bias, the first ones (None: all).
        dape, dape_hidden: DAPE's MLP on the scores and this bias, one per layer
            (:class:`~posenc.model.encodings.common.BiasEncoding`; default off).
    """

    speed_target = 1.10
    augment_modes = frozenset({"random", "scale"})
    option_forms = (*DistanceBiasEncoding.option_forms, {"alibi_num_heads": 1})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        encoder_bias: str = "split",
        dape: bool | None = False,
        dape_hidden: int | None = None,
        alibi_num_heads: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, encoder_bias, dape, dape_hidden)
        biased = n_heads if alibi_num_heads is None else alibi_num_heads
        if not 1 <= biased <= n_heads:
            raise ValueError(
                f"pe.alibi_num_heads={alibi_num_heads} must be from 1 to the model's {n_heads} "
                "heads, or null for every head"
            )
        slopes = alibi_slopes(biased)
        after = slopes.flip(0) if encoder_bias == "asymmetric" else slopes
        none = torch.zeros(n_heads - biased)
        self.register_buffer("slopes", torch.cat([slopes, none]), persistent=False)
        self.register_buffer("slopes_after", torch.cat([after, none]), persistent=False)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` for queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``.

        In the decoder, entries of future keys (masked later) are 0 rather than positive.
        """
        before, after = side_distances(q_pos, k_pos)
        bias_before = -self.slopes[:, None, None] * before
        if self.causal:
            return bias_before[None]
        bias_after = -self.slopes_after[:, None, None] * after
        return self.encoder_bias_of(bias_before, bias_after, q_pos, k_pos)
