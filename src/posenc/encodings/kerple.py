"""KERPLE, logarithmic variant (Chi, Fan, Ramadge & Rudnicky, NeurIPS 2022).

Every self-attention logit of head ``h`` receives the conditionally positive definite kernel
bias::

    bias[h, i, j] = -p_h * log(1 + a_h * |i - j|),     p_h, a_h > 0 learned per head.

Matching the official code (chijames/KERPLE, ``ParallelKerpleLog`` in ``megatron/mpu/layers.py``):

* one ``(p, a)`` pair per head, in ONE module per stack shared by all its layers (the official
  GPT-2 builds a single ``ParallelKerpleLog`` and passes it to every layer);
* init ``p_h ~ U(0, 2)``, ``a_h ~ U(0, 1)``;
* positivity by projection: before each use, values below ``eps = 0.01`` are clamped up to
  ``eps`` in place (the official code assigns ``param.data = param.data.clamp(min=eps)`` in every
  forward). The clamp is outside autograd, so the gradient of the clamped value still reaches the
  parameter and can move it back up, unlike a clamp inside the graph;
* the bias is added after the ``1/sqrt(D)`` scaling of ``q k^T``, as posenc's attention does.

Where it applies: encoder self-attention (symmetric ``|i - j|``) and decoder self-attention
(causal: ``i - j`` for ``j <= i``, the paper's form); nothing in cross-attention. The paper is
evaluated on causal language models only; the symmetric kernel is its natural bidirectional form
(the kernel is defined on ``|m - n|``), at the cost of carrying no left/right information.

The ``(1, H, Lq, Lk)`` bias is computed once per forward in :meth:`KerpleEncoding.context`;
gradients from every layer reach ``p`` and ``a`` through it. Incremental decoding builds the
single query's row from its absolute position ``call.q_pos``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.encodings.alibi import SharedBias
from posenc.encodings.base import AttentionRule, Site, StackEncoding


class KerpleEncoding(StackEncoding):
    """Learned logarithmic distance penalties ``-p_h log(1 + a_h d)``, one set per stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        p_init: ``p_h`` starts ``U(0, p_init)`` (official code: 2).
        a_init: ``a_h`` starts ``U(0, a_init)`` (official code: 1).
        eps: lower bound enforced on ``p`` and ``a`` by projection (official code: 0.01).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = "symmetric -p log(1 + a|i-j|) (paper is causal-only)"

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        p_init: float = 2.0,
        a_init: float = 1.0,
        eps: float = 0.01,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.p_init = p_init
        self.a_init = a_init
        self.eps = eps
        self.p = nn.Parameter(torch.empty(n_heads))
        self.a = nn.Parameter(torch.empty(n_heads))
        self.rule = SharedBias()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.p, 0.0, self.p_init)
        nn.init.uniform_(self.a, 0.0, self.a_init)
        self.project()

    @torch.no_grad()
    def project(self) -> None:
        """Clamp ``p`` and ``a`` up to ``eps`` in place (only when needed, so the parameters'
        version counter, which guards saved autograd graphs, changes only on a real edit)."""
        for param in (self.p, self.a):
            if bool((param < self.eps).any()):
                param.clamp_(min=self.eps)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` for queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``.

        In the decoder, entries of future keys (masked later) use distance 0.
        """
        self.project()
        distance = q_pos[:, None] - k_pos[None, :]
        distance = (distance.clamp(min=0) if self.causal else distance.abs()).float()
        p, a = self.p[:, None, None], self.a[:, None, None]
        return (-p * torch.log1p(a * distance))[None]

    def self_rule(self, layer: int) -> AttentionRule:
        return self.rule
