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

Encoder form: the paper only trains causal language models. For bidirectional attention its
authors point to the symmetric ``-m_h * |i - j|`` (issue #5 of their repository; also used by
data2vec 2.0 and Voicebox), which keeps ALiBi's parameter-free recency prior. Its known cost: the
bias carries distance but not direction, so the encoder is equivariant to reversing its input, and
since cross-attention has no position information either, a source and its reversal give the
decoder the same memory up to key order (see ``tests/test_alibi.py``).

Incremental decoding: the single new query sits at position ``call.q_pos``; its row of the bias
is built from the absolute positions, so cached keys need no extra state.

Speed: the bias needs no gradient, so SDPA keeps its fused kernel; it is built once per forward
in :meth:`ALiBiEncoding.context` and shared by every layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.encodings.base import AttentionCall, AttentionRule, Site, StackEncoding


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


class SharedBias(AttentionRule):
    """Adds the stack's per-forward bias ``call.context`` (``(1, H, Lq, Lk)``) to the logits.

    The rule of every bias encoding whose bias is the same in all layers of a stack (ALiBi, T5,
    KERPLE): the stack computes it once in ``context``; each layer only reads it.
    """

    def bias(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor | None:
        return call.context


class ALiBiEncoding(StackEncoding):
    """Fixed linear distance penalties, ``(1, H, Lq, Lk)`` per forward, in self-attention only.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = "symmetric -m|i-j| (paper is causal-only; authors' repo issue #5)"

    def __init__(self, site: Site, d_model: int, n_heads: int, n_layers: int) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self.rule = SharedBias()

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` for queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``.

        In the decoder, entries of future keys (masked later) are 0 rather than positive.
        """
        distance = q_pos[:, None] - k_pos[None, :]
        distance = distance.clamp(min=0) if self.causal else distance.abs()
        return (-self.slopes[:, None, None] * distance.float())[None]

    def self_rule(self, layer: int) -> AttentionRule:
        return self.rule
