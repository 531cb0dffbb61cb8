"""Transformer-XL relative attention (Dai et al., ACL 2019), ``pe=xl``.

No position is added to the inputs. Query ``i`` scores key ``j`` with the paper's four terms
(its eq. in section 3.3, ``E`` the layer's input, ``R`` the sinusoid table of Vaswani et al.
evaluated at the relative distance, never learned)::

    A_ij = q_i . k_j                  (a) content
         + q_i . W_R R_{i-j}          (b) content-dependent position
         + u   . k_j                  (c) global content bias
         + v   . W_R R_{i-j}          (d) global position bias

    = ((q_i + u) . k_j + (q_i + v) . W_R R_{i-j}) / sqrt(D)     (per head, scaled as the code)

with ``q_i = W_q E_i``, ``k_j = W_{k,E} E_j`` the layer's own projections, ``W_R = W_{k,R}`` a
learned ``d -> H*D`` projection per layer (no bias, the official ``r_net``), and ``u, v`` learned
``(H, D)`` vectors per head shared by every layer of the stack (the official code's
``r_w_bias``/``r_r_bias`` with ``untie_r=False``). Initialisation: ``u, v ~ N(0, 0.02^2)`` as in
the official code; ``W_R`` as posenc initialises the content key projection it parallels
(Xavier-uniform; the official code initialises both with one ``N(0, 0.02^2)``).

Where it applies:

* decoder self-attention: the paper's causal form, distances ``i - j >= 0``;
* encoder self-attention: the bidirectional form takes the same formula at signed distances
  ``i - j`` in ``[-(L-1), L-1]`` (as XLNet's bidirectional attention does); the sinusoid is odd
  in its sine half, so ``R_{-d} != R_d`` and the encoder tells left from right;
* cross-attention: plain content attention (the paper has none; source and target positions
  share no axis).

Layout: posenc's sinusoid table interleaves sin/cos dims where the official code concatenates
them; ``W_R`` is learned, so the two differ by a fixed permutation of its input columns (the
tests compare against transformers' XLNet relative attention with the columns permuted).

Fast path: ``R`` is evaluated once per forward in :meth:`TransformerXLEncoding.context`, only at
the distances present (``2L - 1`` in the encoder, ``L`` in the decoder), and shared by every
layer; each layer projects it (``n x d x d`` multiply-adds, independent of the batch), takes
``(q + v) . W_R R`` for every query and distance (``(B, H, Lq, n)``, as many multiply-adds as
``q k^T`` times ``n / Lk``) and gathers it into the ``(B, H, Lq, Lk)`` logits with the
``(Lq, Lk)`` row index: this is the paper's relative-shift trick done as a gather, which also
serves queries that do not start at the first key. The terms enter through
:meth:`AttentionRule.bias`; the bias depends on q and k, so SDPA runs its non-fused path, as for
every learned bias.

Incremental decoding: the cache holds plain keys and values (the position term is not part of
``k``), so cached keys play the role of the paper's memory segment; each decoder call builds the
rows of the distances from its queries at ``call.q_pos`` to every cached key. A step at position
``t`` projects ``t + 1`` rows per layer (as the official code's ``r_net`` does on its ``klen``
rows).

Left out of the paper: the segment-level recurrence (a training scheme for language models
beyond a fixed length; translation batches are whole sentence pairs, and the decoder cache is
its inference-time analogue) and the dropout the official code applies to ``R``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionCall, AttentionRule, Site, StackEncoding
from posenc.model.encodings.common import gather_rows, sinusoidal_table, used_rows


@dataclass
class RelativeSinusoids:
    """What every layer of a stack shares in one forward pass.

    Attributes:
        sinusoids: ``(n, d)`` the table ``R`` at the distances present, in the parameters' dtype.
        index: ``(Lq, Lk)`` long, the row of ``sinusoids`` holding ``R_{i-j}``.
        u: ``(H, D)`` the global content bias.
        v: ``(H, D)`` the global position bias.
    """

    sinusoids: Tensor
    index: Tensor
    u: Tensor
    v: Tensor


class RelativeXLRule(AttentionRule):
    """One layer's terms (b), (c) and (d) as a logit bias; (a) is the plain ``q k^T``.

    Args:
        d_model: width ``d`` of ``R`` and of the projection ``W_R`` (``d -> d = H*D``).

    ``call.context`` must be the stack's :class:`RelativeSinusoids`.
    """

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.position_proj = nn.Linear(d_model, d_model, bias=False)  # W_{k,R}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.position_proj.weight)

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        """``((q_i + v) . W_R R_{i-j} + u . k_j) / sqrt(D)``, ``(B, H, Lq, Lk)``."""
        context: RelativeSinusoids = call.context
        _, heads, _, dim = q.shape
        rows = context.sinusoids.shape[0]
        relative = self.position_proj(context.sinusoids).view(rows, heads, dim)  # W_R R
        position = (q + context.v[:, None, :]) @ relative.permute(1, 2, 0)  # (B, H, Lq, n)
        content = (k @ context.u[:, :, None]).transpose(-1, -2)  # (B, H, 1, Lk)
        return (gather_rows(position, context.index) + content) * (1.0 / math.sqrt(dim))


class TransformerXLEncoding(StackEncoding):
    """Transformer-XL relative attention in every self-attention layer of the stack.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        base: the sinusoid's base (paper: 10000).
        init_std: ``u`` and ``v`` start ``N(0, init_std^2)`` (official code: 0.02).
    """

    applies_to = "encoder and decoder self-attention (terms a+b+c+d); plain cross-attention"
    encoder_form = "the same terms at signed distances i-j in [-(L-1), L-1] (as XLNet)"
    speed_target = 1.35
    augment_modes = frozenset({"random"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        base: float = 10000.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.base = base
        self.init_std = init_std
        head_dim = d_model // n_heads
        self.u = nn.Parameter(torch.empty(n_heads, head_dim))
        self.v = nn.Parameter(torch.empty(n_heads, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.u, std=self.init_std)
        nn.init.normal_(self.v, std=self.init_std)

    def context(self, q_pos: Tensor, k_pos: Tensor) -> RelativeSinusoids:
        """``R`` at the distances ``q_pos[i] - k_pos[j]`` present (the decoder's future keys,
        masked later, take distance 0), computed in float64 and cast to the parameters' dtype."""
        distance = q_pos[:, None] - k_pos[None, :]
        if self.causal:
            distance = distance.clamp(min=0)
        distances, index = used_rows(distance)
        table = sinusoidal_table(distances, self.d_model, self.base, torch.float64)
        return RelativeSinusoids(table.to(self.u.dtype), index, self.u, self.v)

    def self_rule(self, layer: int) -> RelativeXLRule:
        return RelativeXLRule(self.d_model)
