"""T5 relative position bias (Raffel et al., JMLR 2020), matching HF ``transformers``' T5.

A learned scalar per (bucket, head) is added to the self-attention logits. The signed relative
position ``key - query`` is mapped to one of ``num_buckets`` buckets: exact buckets for small
distances, logarithmically wider ones up to ``max_distance``, beyond which all distances share
the last bucket.

* Encoder (bidirectional): half of the buckets for keys to the left (or at the query), half for
  keys to the right.
* Decoder (causal): all buckets for keys at or left of the query (future keys are masked).

Where it applies: encoder and decoder self-attention; nothing in cross-attention (as in T5).
Each stack holds ONE table ``(num_buckets, H)`` shared by all its layers (T5 keeps it in the
first layer and hands the resulting ``position_bias`` to the others); the ``(1, H, Lq, Lk)`` bias
is gathered once per forward in :meth:`T5Encoding.context`, and gradients from every layer flow
into the table through it.

Deviation from T5: T5 does not scale ``q k^T`` by ``1/sqrt(D)`` (its init absorbs the factor);
posenc's attention does, for every encoding, so here the bias is added to the scaled logits.

Incremental decoding: the single new query sits at ``call.q_pos``; its bias row is gathered from
the absolute positions, so no extra state is cached.

DAPE (``dape: true``, :mod:`posenc.model.encodings.common`): each layer adjusts this bias by an
MLP of its attention scores and the bias, ``S + P + f(S, P)``; the table stays one per stack.
(The DAPE paper's code has no T5 variant; the formula is the same for any bias.)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionRule, Site
from posenc.model.encodings.common import BiasEncoding, SharedBias, relative_position_bucket


class T5Encoding(BiasEncoding):
    """Bucketed learned relative bias, one ``(num_buckets, H)`` table per stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        num_buckets: buckets of relative positions (T5: 32).
        max_distance: distance from which all positions share the last bucket (T5: 128).
        init_factor: the table is initialised ``N(0, (init_factor * d_model^-0.5)^2)``, as in
            transformers' ``T5PreTrainedModel._init_weights`` (``factor`` there, default 1.0).
        dape, dape_hidden: DAPE's MLP on the scores and this bias, one per layer
            (:class:`~posenc.model.encodings.common.BiasEncoding`; default off).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = "bidirectional buckets (half for each side); decoder: causal buckets"
    speed_target = 1.35
    augment_modes = frozenset({"random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        init_factor: float = 1.0,
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, dape, dape_hidden)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.init_factor = init_factor
        self.table = nn.Parameter(torch.empty(num_buckets, n_heads))
        self.rule = SharedBias()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table, std=self.init_factor * self.d_model**-0.5)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket indices ``(Lq, Lk)`` of queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``."""
        return relative_position_bucket(
            k_pos[None, :] - q_pos[:, None],
            bidirectional=not self.causal,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)``: ``bias[0, h, i, j] = table[bucket(k_j - q_i), h]``."""
        return self.table.t()[:, self.buckets(q_pos, k_pos)][None]

    def bias_rule(self, layer: int) -> AttentionRule:
        return self.rule
