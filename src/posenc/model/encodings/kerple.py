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

Where it applies: encoder and decoder self-attention (causal: ``i - j`` for ``j <= i``, the
paper's form); nothing in cross-attention. The paper is evaluated on causal language models only;
its encoder forms (``encoder_bias``, as for ALiBi, :mod:`posenc.model.encodings.alibi`; ``split`` is
the default, chosen by the comparison in docs/METHODS.md §1):

* ``symmetric``: ``-p_h log(1 + a_h |i - j|)``, the kernel's natural bidirectional form (it is
  defined on ``|m - n|``), which carries no left/right information: a source and its reversal
  give the same translation;
* ``asymmetric``: a second learned pair ``(p'_h, a'_h)`` for keys after the query,
  ``-p'_h log(1 + a'_h (j - i))``, initialised like the first and independently of it;
* ``split``: even heads see keys at or before the query, odd heads keys at or after it, both
  with the one kernel; the other side gets ``SPLIT_PENALTY`` (a mask for real queries).

The ``(1, H, Lq, Lk)`` bias is computed once per forward in :meth:`KerpleEncoding.context`;
gradients from every layer reach ``p`` and ``a`` through it. Incremental decoding builds the
single query's row from its absolute position ``call.q_pos``.

DAPE (``dape: true``, :mod:`posenc.model.encodings.common`): each layer adjusts this bias by an
MLP of its attention scores and the bias, ``S + P + f(S, P)``; ``p`` and ``a`` stay one set per
stack (the paper's KERPLE-DAPE code gives each layer its own).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import Site
from posenc.model.encodings.common import DistanceBiasEncoding, side_distances


class KerpleEncoding(DistanceBiasEncoding):
    """Learned logarithmic distance penalties ``-p_h log(1 + a_h d)``, one set per stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        p_init: ``p_h`` starts ``U(0, p_init)`` (official code: 2).
        a_init: ``a_h`` starts ``U(0, a_init)`` (official code: 1).
        eps: lower bound enforced on ``p`` and ``a`` by projection (official code: 0.01).
        encoder_bias: the encoder form, ``symmetric``, ``asymmetric`` or ``split`` (module
            docstring); the decoder always uses the paper's causal kernel.
        dape, dape_hidden: DAPE's MLP on the scores and this bias, one per layer
            (:class:`~posenc.model.encodings.common.BiasEncoding`; default off).
    """

    speed_target = 1.35
    augment_modes = frozenset({"random", "scale"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        p_init: float = 2.0,
        a_init: float = 1.0,
        eps: float = 0.01,
        encoder_bias: str = "split",
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, encoder_bias, dape, dape_hidden)
        self.p_init = p_init
        self.a_init = a_init
        self.eps = eps
        self.p = nn.Parameter(torch.empty(n_heads))
        self.a = nn.Parameter(torch.empty(n_heads))
        two_sided = encoder_bias == "asymmetric" and not self.causal
        self.p_after = nn.Parameter(torch.empty(n_heads)) if two_sided else None
        self.a_after = nn.Parameter(torch.empty(n_heads)) if two_sided else None
        self.reset_parameters()

    def _pairs(self) -> list[tuple[nn.Parameter, nn.Parameter]]:
        """The ``(p, a)`` pairs: the one for keys at or before the query, then the one for keys
        after it (``asymmetric`` encoder only)."""
        pairs = [(self.p, self.a)]
        if self.p_after is not None:
            pairs.append((self.p_after, self.a_after))
        return pairs

    def reset_parameters(self) -> None:
        for p, a in self._pairs():
            nn.init.uniform_(p, 0.0, self.p_init)
            nn.init.uniform_(a, 0.0, self.a_init)
        self.project()

    @torch.no_grad()
    def project(self) -> None:
        """Clamp every ``p`` and ``a`` up to ``eps`` in place (only when needed, so the
        parameters' version counter, which guards saved autograd graphs, changes only on a real
        edit)."""
        for pair in self._pairs():
            for param in pair:
                if bool((param < self.eps).any()):
                    param.clamp_(min=self.eps)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` for queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``.

        In the decoder, entries of future keys (masked later) use distance 0.
        """
        self.project()
        before, after = side_distances(q_pos, k_pos)
        pairs = self._pairs()
        bias_before = _kernel(*pairs[0], before)
        if self.causal:
            return bias_before[None]
        # symmetric and split use the one kernel on both sides (log1p(0) = 0 off each side)
        return self.encoder_bias_of(bias_before, _kernel(*pairs[-1], after), q_pos, k_pos)


def _kernel(p: Tensor, a: Tensor, distance: Tensor) -> Tensor:
    """``-p_h log(1 + a_h d)`` ``(H, Lq, Lk)`` for per-head ``p, a (H,)`` and ``d (Lq, Lk)``."""
    return -p[:, None, None] * torch.log1p(a[:, None, None] * distance)
