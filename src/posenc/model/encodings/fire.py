"""FIRE, functional interpolation for relative positions (Li et al. 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers").

Every self-attention logit of head ``h`` receives a learned function of the query-key distance,
normalised by the query's position (the paper's "progressive interpolation")::

    bias[h, i, j] = f_theta(psi(i - j) / psi(max(L, i)))[h],     psi(x) = log(|c| x + 1)

* ``f_theta``: an MLP ``1 -> width -> H`` with a ReLU (the paper: width 32), one output per head;
* ``c``: learned, starts at 0.1 (the ``log`` amplifies differences between nearby positions);
* ``L``: a learned threshold, ``L = |s * L_0|`` with ``L_0 = 512`` and the learned multiplier
  ``s`` starting at 1: queries before ``L`` share the normaliser ``psi(L)`` (so short sequences
  keep a plain relative bias), later ones use their own position;
* the normaliser gets ``eps = 1e-6`` added, as in the paper's code.

These follow the PyTorch code in the paper's appendix (``|c x|`` keeps ``c`` positive, ``L`` is
learned through a multiplier, the MLP is ``nn.Linear``'s default initialisation). Since
``i - j <= i <= max(L, i)`` for every key a causal query sees, the MLP's input stays in
``[0, 1]`` at any length: a query far beyond the training length is mapped back into the
interpolated range, which is FIRE's claim for length generalisation.

Where it applies: encoder and decoder self-attention; not cross-attention (source and target
positions do not lie on one axis).

Encoder (bidirectional) form, chosen here (the paper is causal-only): the causal formula applied
to the pair in position order, with a second MLP ``g_theta`` (same shape, initialised
independently) for keys after the query::

    keys j <= i:  f_theta(psi(i - j) / psi(max(L, i)))     (exactly the paper's bias)
    keys j >  i:  g_theta(psi(j - i) / psi(max(L, j)))     (the later position normalises)

so the input stays in ``[0, 1]`` on both sides and depends on positions only (padding adds keys
after the sentence and changes nothing). Two MLPs keep left and right apart from the start, which
word order needs; one MLP on ``|i - j|`` (what the paper's code computes if the mask is dropped)
could not tell a source from its reversal.

Layer sharing (``share_layers``): by default each layer has its own FIRE (``c``, ``L`` and
MLPs), the paper's main setting; ``true`` shares one per stack, computed once per forward in
:meth:`FireEncoding.context` (the cheaper layer-shared variant the paper also evaluates, and how
T5 shares its bias).

Incremental decoding: the bias rows of the new queries at ``call.q_pos`` are rebuilt from their
absolute positions against the cached keys at ``call.k_pos``; the normaliser ``psi(max(L, i))``
depends on the query's own position only, so nothing extra is cached.

Cost: the MLP is evaluated once per distinct (side, distance, normaliser) triple rather than on
the ``(Lq, Lk)`` grid: while every position is below ``L`` (training lengths, with ``L`` starting
at 512) that is about ``2 Lk`` MLP inputs and a gather, so the extra work over ALiBi is a sort of
the ``Lq * Lk`` integer keys (``torch.unique``) per layer. The MLP and the normalisation run in
float32 (float64 in a float64 model), also under bf16 autocast; the bias, which needs a
gradient, then makes SDPA use its math kernel, as T5's and KERPLE's do.

DAPE (``dape: true``, :mod:`posenc.model.encodings.common`): each layer adjusts its FIRE bias by
an MLP of its attention scores and the bias, ``S + P + f(S, P)`` (the paper's FIRE-DAPE; FIRE's
own MLP keeps its ReLU, where the reference's FIRE-DAPE code switches it to LeakyReLU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    EncodingModule,
    Site,
    compute_dtype,
)
from posenc.model.encodings.common import BiasEncoding, SharedBias


@dataclass
class FireGrid:
    """The integer structure of one attention call's bias, from positions alone.

    Attributes:
        distance: ``(Lq, Lk)`` long, ``|i - j|`` (decoder: ``max(i - j, 0)``; future keys are
            masked whatever they get).
        span: ``(Lq, Lk)`` long, the position that normalises: ``max(i, j)`` (decoder: ``i``).
        after: ``(Lq, Lk)`` bool, True for keys after the query (encoder), or None (decoder).
    """

    distance: Tensor
    span: Tensor
    after: Tensor | None

    @classmethod
    def build(cls, q_pos: Tensor, k_pos: Tensor, causal: bool) -> FireGrid:
        """The grid of queries at ``q_pos (Lq,)`` and keys at ``k_pos (Lk,)``."""
        signed = q_pos[:, None] - k_pos[None, :]  # i - j
        if causal:
            return cls(signed.clamp(min=0), q_pos[:, None].expand_as(signed), None)
        return cls(signed.abs(), torch.maximum(q_pos[:, None], k_pos[None, :]), signed < 0)


class FireFunction(EncodingModule):
    """The learned bias of FIRE: ``c``, the threshold ``L`` and one MLP per side.

    Args:
        n_heads: ``H``, outputs of each MLP.
        sides: 1 (decoder: keys at or before the query) or 2 (encoder: and keys after it).
        width: hidden units of each MLP (paper: 32).
        c_init: initial ``c`` (paper: 0.1).
        threshold_init: ``L_0``; ``L = |s * L_0|`` with the learned ``s`` starting at 1
            (paper: 512).
        eps: added to the log-normaliser (paper: 1e-6).
    """

    def __init__(
        self,
        n_heads: int,
        sides: int,
        width: int = 32,
        c_init: float = 0.1,
        threshold_init: float = 512.0,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.c_init = c_init
        self.threshold_init = threshold_init
        self.eps = eps
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))
            for _ in range(sides)
        )
        self.c = nn.Parameter(torch.empty(()))
        self.threshold_scale = nn.Parameter(torch.empty(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.c, self.c_init)
        nn.init.ones_(self.threshold_scale)
        for mlp in self.mlps:
            for layer in mlp:
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()  # nn.Linear's default, as the paper's code

    def threshold(self) -> Tensor:
        """``L = |s * L_0|``, a 0-dim tensor."""
        return (self.threshold_scale * self.threshold_init).abs()

    def normalised(self, distance: Tensor, span: Tensor) -> Tensor:
        """``psi(distance) / (psi(max(L, span)) + eps)`` elementwise, in the parameters' compute
        dtype; ``span <= L`` (including 0) takes ``L``, which then gets the whole gradient."""
        c, threshold = self.c.abs(), self.threshold()
        dtype = compute_dtype(self.c)
        span = span.to(dtype)
        normaliser = torch.where(span > threshold, span, threshold)
        return torch.log1p(c * distance.to(dtype)) / (torch.log1p(c * normaliser) + self.eps)

    def forward(self, grid: FireGrid) -> Tensor:
        """The bias ``(1, H, Lq, Lk)`` of ``grid``.

        Entries share an MLP input exactly when they share their side and distance, and either
        their span or (spans at or below ``L``) the threshold itself. Each such triple is
        encoded as one integer ``(side * Q + distance) * P + span_or_0``, evaluated once, and
        gathered back; sorted, the keys of the side before the query come first.
        """
        p, q = int(grid.span.max()) + 1, int(grid.distance.max()) + 1
        span_or_0 = torch.where(grid.span > self.threshold().detach(), grid.span, 0)
        key = grid.distance * p + span_or_0
        if grid.after is not None:
            key = key + grid.after.long() * (q * p)
        unique, inverse = torch.unique(key, return_inverse=True)
        with torch.autocast(unique.device.type, enabled=False):
            x = self.normalised((unique // p) % q, unique % p)[:, None]  # (U, 1)
            if grid.after is None:
                out = self.mlps[0](x)
            else:
                n_before = int((unique < q * p).sum())
                before, after = self.mlps
                out = torch.cat([before(x[:n_before]), after(x[n_before:])])
        return out.t()[:, inverse][None]


class FireRule(AttentionRule):
    """A layer's self-attention with its own FIRE bias; ``call.context`` is the
    :class:`FireGrid` of the call."""

    def __init__(self, function: FireFunction) -> None:
        super().__init__()
        self.function = function

    def bias(self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall) -> Tensor:
        return self.function(call.context)


class FireEncoding(BiasEncoding):
    """FIRE biases in the self-attention of the stack, per layer or shared.

    Args:
        site, d_model, n_heads, n_layers: see :class:`StackEncoding`.
        width, c_init, threshold_init, eps: see :class:`FireFunction` (paper: 32, 0.1, 512,
            1e-6).
        share_layers: one FIRE for all layers of the stack (computed once per forward) instead of
            one per layer (the default, the paper's main setting).
        dape, dape_hidden: DAPE's MLP on the scores and this bias, one per layer
            (:class:`~posenc.model.encodings.common.BiasEncoding`; default off).
    """

    applies_to = "encoder and decoder self-attention (no bias in cross-attention)"
    encoder_form = (
        "causal formula on the pair in position order: f(psi(i-j)/psi(max(L,i))) for keys "
        "before, a second MLP g(psi(j-i)/psi(max(L,j))) for keys after"
    )
    speed_target = 1.35
    augment_modes = frozenset({"random", "scale"})

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        width: int = 32,
        c_init: float = 0.1,
        threshold_init: float = 512.0,
        eps: float = 1e-6,
        share_layers: bool = False,
        dape: bool | None = False,
        dape_hidden: int | None = None,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers, dape, dape_hidden)
        self.settings = {
            "n_heads": n_heads,
            "sides": 1 if self.causal else 2,
            "width": width,
            "c_init": c_init,
            "threshold_init": threshold_init,
            "eps": eps,
        }
        self.shared = FireFunction(**self.settings) if share_layers else None
        self.shared_rule = SharedBias() if share_layers else None

    def context(self, q_pos: Tensor, k_pos: Tensor) -> FireGrid | Tensor:
        """The :class:`FireGrid` of the call, or with ``share_layers`` the bias
        ``(1, H, Lq, Lk)`` itself."""
        grid = FireGrid.build(q_pos, k_pos, self.causal)
        return grid if self.shared is None else self.shared(grid)

    def bias_rule(self, layer: int) -> AttentionRule:
        if self.shared_rule is not None:
            return self.shared_rule
        return FireRule(FireFunction(**self.settings))
