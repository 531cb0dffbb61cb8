"""PaTH attention (``path``): positions as products of data-dependent Householder matrices.

Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations" (arXiv 2505.16381); reference code flash-linear-attention's
``fla/layers/path_attn.py`` and ``fla/ops/path_attn`` (its naive test reference).

Each token ``t`` of a self-attention layer makes a data-dependent Householder-like matrix
``H_t = I - beta_t w_t w_t^T`` per head, and query ``i`` scores key ``j <= i`` through the
product of those of the tokens after ``j`` up to ``i``::

    s_ij = q_i^T H_i H_(i-1) ... H_(j+1) k_j / sqrt(D)          (s_ii = q_i . k_i / sqrt(D))

``w_t`` (unit length per head) is ``l2norm(silu(conv(W_up W_down x_t)))``: a rank-32
projection of the layer's input, a causal depthwise convolution over the last three tokens
(no bias) and SiLU, as the reference's ``w_proj`` and ``ShortConvolution``; ``beta_t = 2
sigmoid(W_b x_t + b)`` per head, in (0, 2), so ``H_t`` may reflect. Parameters initialise as
the reference models initialise them: weights ``N(0, 0.02)``, the beta bias 0. The product
is the position information: nothing else marks where a token is. Everything after the
projections runs in float32 (float64 in a float64 model), also under bf16 autocast. The
reference's optional forget gate (PaTH-FoX) and QK-norm are not part of the encoding and are
left out (``pe=fox`` is the forget gate alone).

Computed exactly and in parallel as one unit lower-triangular solve over the tokens (the UT
form of a product of Householders, ``O(L^2 D + L^3)`` a head); cached decoding keeps the cached
keys transformed by every Householder so far (:meth:`PathRule.attend_cached`), as the reference's
``rank_one_update`` does. The key state cached with each token is its pre-convolution ``w`` and
its ``beta``. The derivation, and where posenc differs from the reference:
``docs/encodings/path.md``.

Encoder form (the paper is causal-only; this is posenc's own extension): a key after the query
is seen through the same Householders between them, applied from the key's side,
``s_ij = k_j^T H_j ... H_(i+1) q_i`` for ``j > i``: the causal form with the query and the key
exchanged, so each pair's logit runs through the tokens between them in their order; the
convolution stays causal.

Where it applies: encoder and decoder self-attention; cross-attention is plain (source and
target tokens share no sequence to accumulate along).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.encodings.base import (
    AttentionCall,
    AttentionRule,
    Site,
    StackEncoding,
    compute_dtype,
    masked_softmax,
)

L2_EPS = 1e-6
"""Added to the squared norm before the reciprocal square root that normalises ``w`` (the
reference's ``l2_norm``)."""


class PathRule(AttentionRule):
    """One layer's self-attention through accumulated Householder transformations.

    Args:
        d_model: input width ``d``.
        n_heads: ``H``; ``w`` and ``beta`` are per head.
        rank: inner width of the low-rank ``w`` projection (the reference's 32).
        conv_size: tokens the causal convolution of ``w`` spans (the reference's 3).
        bidirectional: the encoder form (keys after the query too) instead of the causal one.
        init_std: standard deviation of the weights at initialisation.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        rank: int,
        conv_size: int,
        bidirectional: bool,
        init_std: float,
    ) -> None:
        super().__init__()
        self.n_heads, self.conv_size = n_heads, conv_size
        self.bidirectional, self.init_std = bidirectional, init_std
        self.w_down = nn.Linear(d_model, rank, bias=False)
        self.w_up = nn.Linear(rank, d_model, bias=False)
        self.w_conv = nn.Parameter(torch.empty(d_model, 1, conv_size))
        self.beta = nn.Linear(d_model, n_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight in (self.w_down.weight, self.w_up.weight, self.w_conv, self.beta.weight):
            nn.init.normal_(weight, std=self.init_std)
        nn.init.zeros_(self.beta.bias)

    def prepare(
        self, q: Tensor, k: Tensor, x: Tensor, positions: Tensor, context: Any = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Return q, k unchanged and the key state ``(B, H, L, D + 1)``: each new token's
        pre-convolution ``w`` and its ``beta`` (float32, or float64 for a float64 model)."""
        b, length, d = x.shape
        with torch.autocast(x.device.type, enabled=False):
            dtype = compute_dtype(x)
            x = x.to(dtype)
            w = F.linear(F.linear(x, self.w_down.weight.to(dtype)), self.w_up.weight.to(dtype))
            gate = F.linear(x, self.beta.weight.to(dtype), self.beta.bias.to(dtype))
            beta = 2 * torch.sigmoid(gate)
        w = w.view(b, length, self.n_heads, d // self.n_heads).transpose(1, 2)
        return q, k, torch.cat([w, beta.transpose(1, 2)[..., None]], dim=-1)

    def householders(self, key_state: Tensor, count: int) -> tuple[Tensor, Tensor]:
        """The unit ``w (B, H, count, D)`` and ``beta (B, H, count)`` of the last ``count``
        tokens of ``key_state`` (every token so far), the convolution reading the
        ``conv_size - 1`` tokens before them (zeros before the first)."""
        b, h, length, _ = key_state.shape
        start = max(length - count - self.conv_size + 1, 0)
        pre = key_state[:, :, start:, :-1]  # (B, H, T, D)
        pre = F.pad(pre, (0, 0, count + self.conv_size - 1 - pre.shape[2], 0))
        channels = pre.permute(0, 1, 3, 2).reshape(b, -1, pre.shape[2])  # (B, H*D, T)
        conv = F.conv1d(channels, self.w_conv.to(pre.dtype), groups=channels.shape[1])
        w = F.silu(conv).view(b, h, -1, count).transpose(-1, -2)
        w = w * torch.rsqrt(w.square().sum(-1, keepdim=True) + L2_EPS)
        return w, key_state[:, :, length - count :, -1]

    @staticmethod
    def _coefficients(w: Tensor, beta: Tensor, k: Tensor, tokens: Tensor, k_pos: Tensor) -> Tensor:
        """``X (B, H, T, Lk)``: ``X_rj = w_r . x``, ``x`` key ``j`` as the Householders of the
        tokens before ``r`` (and after key ``j``) left it; 0 unless token ``r`` comes after key
        ``j``. ``w (B, H, T, D)``, ``beta (B, H, T)`` of the tokens at positions ``tokens
        (T,)``; keys ``k (B, H, Lk, D)`` at ``k_pos (Lk,)``."""
        later = tokens[:, None] > k_pos[None, :]
        overlap = (w @ w.transpose(-1, -2)) * beta[..., None, :]  # beta_s (w_r . w_s)
        system = torch.eye(w.shape[2], dtype=w.dtype, device=w.device) + overlap.tril(-1)
        return torch.linalg.solve_triangular(
            system, (w @ k.transpose(-1, -2)) * later, upper=False, unitriangular=True
        )

    @staticmethod
    def _through(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, x: Tensor, q_pos: Tensor) -> Tensor:
        """Causal logits times sqrt(D), ``q_i^T H_i ... H_(k_pos_j + 1) k_j`` ``(B, H, Lq,
        Lk)``, for queries at ``q_pos`` that are also the tokens whose Householders ``w, beta``
        apply, keys ``k`` (earlier keys already transformed up to the first query) and their
        coefficients ``x`` (:meth:`_coefficients`)."""
        within = (q_pos[None, :] <= q_pos[:, None]).to(q.dtype)  # (Lq, Lq): r <= i
        through = (q @ w.transpose(-1, -2)) * within * beta[..., None, :]
        return q @ k.transpose(-1, -2) - through @ x

    def _scores(
        self, q: Tensor, k: Tensor, key_state: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Callable[[], Tensor]]:
        """Logits ``(B, H, Lq, Lk)`` in the compute dtype, unmasked, and the keys transformed
        by this call's Householders, ``H_last ... H_(j+1) k_j`` ``(B, H, Lk, D)``, as a thunk
        (a cache's next call continues from them; training never asks for them)."""
        dtype = compute_dtype(q)
        q, k = q.to(dtype), k.to(dtype)
        w, beta = self.householders(key_state.to(dtype), q.shape[2])
        x = self._coefficients(w, beta, k, call.q_pos, call.k_pos)
        scores = self._through(q, k, w, beta, x, call.q_pos)
        if self.bidirectional:  # keys after the query: the causal form, query and key exchanged
            x_reverse = self._coefficients(w, beta, q, call.k_pos, call.q_pos)
            reverse = self._through(k, q, w, beta, x_reverse, call.k_pos)
            after = call.k_pos[None, :] > call.q_pos[:, None]
            scores = torch.where(after, reverse.transpose(-1, -2), scores)
        return scores / math.sqrt(
            q.shape[-1]
        ), lambda: k - x.transpose(-1, -2) @ (w * beta[..., None])

    def weights(
        self, q: Tensor, k: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return masked_softmax(self._scores(q, k, key_state, call)[0], call).to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return _attend(self._scores(q, k, key_state, call)[0], v, call).to(q.dtype)

    def attend_cached(
        self, q: Tensor, k: Tensor, v: Tensor, key_state: Tensor | None, call: AttentionCall
    ) -> tuple[Tensor, Tensor]:
        """The output, and the keys transformed by this call's Householders for the cache:
        one computation of the Householder terms serves both."""
        with torch.autocast(q.device.type, enabled=False):
            scores, advanced = self._scores(q, k, key_state, call)
            return _attend(scores, v, call).to(q.dtype), advanced().to(k.dtype)


def _attend(scores: Tensor, v: Tensor, call: AttentionCall) -> Tensor:
    """Softmax of ``scores (B, H, Lq, Lk)`` under the call's mask (and dropout) applied to
    ``v (B, H, Lk, D)``, in the scores' dtype."""
    attn = masked_softmax(scores, call)
    if call.dropout_p:
        attn = F.dropout(attn, call.dropout_p)
    return attn @ v.to(attn.dtype)


class PathEncoding(StackEncoding):
    """PaTH in every self-attention layer of the stack.

    Args:
        rank: inner width of each layer's low-rank ``w`` projection (the reference's 32).
        conv_size: tokens the causal convolution of ``w`` spans (the reference's 3).
        init_std: weight initialisation std (the reference models' ``initializer_range``).
    """

    applies_to = (
        "encoder and decoder self-attention (Householder products from the content); "
        "cross-attention plain"
    )
    encoder_form = "own extension: a later key through the same Householders, key side first"
    speed_target = 2.2

    def __init__(
        self,
        site: Site,
        d_model: int,
        n_heads: int,
        n_layers: int,
        rank: int = 32,
        conv_size: int = 3,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(site, d_model, n_heads, n_layers)
        self.rank, self.conv_size, self.init_std = rank, conv_size, init_std

    def self_rule(self, layer: int) -> PathRule:
        return PathRule(
            self.d_model, self.n_heads, self.rank, self.conv_size, not self.causal, self.init_std
        )
