"""The seed report's approach, re-implemented from its description, as a peer of the benchmark
(:mod:`.peers`).

What the seed report describes, and what this module does:

* an encoder-decoder in ``nn.Transformer``'s mould: post-norm layers (LayerNorm after each
  residual sum, ReLU feed-forward, dropout on sublayer outputs, the feed-forward's hidden layer
  and the attention weights), a final LayerNorm per stack, separate source and target embedding
  tables (no scaling, no positions added to them) and an output layer with a bias;
* its own multi-head attention, with separate q/k/v projections and the attention written out
  (scores, mask, softmax, dropout, weighted sum), in every attention of both stacks; the report's
  position code takes queries and keys of different lengths, so cross-attention gets positions
  too (target position ``i`` against source position ``j``);
* ``relative`` (Shaw et al. 2018): two learned tables per attention layer, ``a^K`` and ``a^V`` of
  ``2k + 1`` rows of the head width ``D``, indexed by the clipped distance
  ``clip(j - i, -k, k)``; looked up as an ``(Lq, Lk, D)`` tensor, ``a^K`` is multiplied with the
  queries and added to the scores, ``a^V`` is weighted by the attention and added to the output:
  ``e_ij = q_i . (k_j + a^K_ij) / sqrt(D)``, ``z_i = sum_j softmax(e)_ij (v_j + a^V_ij)``; the
  window is the report's code default, ``k = 512``;
* ``rotary`` (RoFormer): queries and keys of each head rotated by ``pos * theta_m``,
  ``theta_m = 10000^(-2m/D)``, on *interleaved* pairs ``(x_2m, x_2m+1)``, from sine and cosine
  tables computed once;
* greedy decoding without a cache: the source is encoded once, then every new token re-runs the
  decoder over the whole prefix and keeps the last position's argmax.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.config import ModelConfig

RELATIVE, ROTARY = "relative", "rotary"
VARIANTS = (RELATIVE, ROTARY)
MAX_RELATIVE = 512
"""The clipping window ``k`` of the relative variant (the report's code default)."""
TABLE_LENGTH = 512
"""Positions covered by the rotary sine/cosine tables (the report's code default); longer
inputs extend them."""


def relative_index(lq: int, lk: int, k: int, device: torch.device | None = None) -> Tensor:
    """Rows ``clip(j - i, -k, k) + k`` of the relative tables, ``(lq, lk)``."""
    distance = torch.arange(lk, device=device)[None, :] - torch.arange(lq, device=device)[:, None]
    return distance.clamp(-k, k) + k


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table_k: Tensor,
    table_v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``z = softmax((q k^T + q . a^K) / sqrt(D) + mask) (v + a^V)`` with the ``(Lq, Lk, D)``
    tensors ``table_k``, ``table_v``; ``q (B, H, Lq, D)``, ``k, v (B, H, Lk, D)``; ``mask`` is
    True where a query must not see a key (broadcast to ``(B, H, Lq, Lk)``)."""
    scores = q @ k.transpose(-1, -2) + torch.einsum("bhqd,qkd->bhqk", q, table_k)
    scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), dropout_p)
    return weights @ v + torch.einsum("bhqk,qkd->bhqd", weights, table_v)


def rotary_tables(length: int, dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """Cosine and sine of ``pos * base^(-2m/dim)``, ``(length, dim / 2)``."""
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * theta[None, :]
    return angles.cos(), angles.sin()


def rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the interleaved pairs ``(x_2m, x_2m+1)`` of ``x (..., L, D)`` by the angles whose
    cosines and sines are ``cos, sin (L, D/2)``."""
    pairs = x.unflatten(-1, (x.shape[-1] // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class SeedAttention(nn.Module):
    """The seed's multi-head attention with its position variant."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, variant: str) -> None:
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is not one of {VARIANTS}")
        self.variant, self.n_heads, self.dropout = variant, n_heads, dropout
        self.head_dim = d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4)
        )
        if variant == RELATIVE:
            self.table_k = nn.Embedding(2 * MAX_RELATIVE + 1, self.head_dim)
            self.table_v = nn.Embedding(2 * MAX_RELATIVE + 1, self.head_dim)
        else:
            cos, sin = rotary_tables(TABLE_LENGTH, self.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def _split(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def _rotate(self, x: Tensor) -> Tensor:
        length = x.shape[-2]
        if length > self.cos.shape[0]:
            self.cos, self.sin = (t.to(x.device) for t in rotary_tables(length, self.head_dim))
        return rotate_interleaved(x, self.cos[:length], self.sin[:length])

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        """Attend from ``x (B, Lq, d)`` to ``memory (B, Lk, d)``; ``mask`` as in
        :func:`relative_attention`."""
        q, k = self._split(self.q_proj(x)), self._split(self.k_proj(memory))
        v = self._split(self.v_proj(memory))
        dropout_p = self.dropout if self.training else 0.0
        if self.variant == RELATIVE:
            index = relative_index(q.shape[2], k.shape[2], MAX_RELATIVE, x.device)
            out = relative_attention(
                q, k, v, self.table_k(index), self.table_v(index), mask, dropout_p
            )
        else:
            q, k = self._rotate(q), self._rotate(k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            out = F.dropout(scores.softmax(dim=-1), dropout_p) @ v
        return self.out_proj(out.transpose(1, 2).flatten(2))


class SeedLayer(nn.Module):
    """A post-norm layer: self-attention, cross-attention (decoder only), feed-forward."""

    def __init__(self, config: ModelConfig, variant: str, cross: bool) -> None:
        super().__init__()
        d, heads = config.d_model, config.n_heads
        self.self_attn = SeedAttention(d, heads, config.attn_dropout, variant)
        self.cross_attn = SeedAttention(d, heads, config.attn_dropout, variant) if cross else None
        self.up, self.down = nn.Linear(d, config.d_ff), nn.Linear(config.d_ff, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(3 if cross else 2))
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, self_mask: Tensor, memory: Tensor | None, memory_mask: Tensor | None
    ) -> Tensor:
        x = self.norms[0](x + self.dropout(self.self_attn(x, x, self_mask)))
        if self.cross_attn is not None:
            x = self.norms[1](x + self.dropout(self.cross_attn(x, memory, memory_mask)))
        ffn = self.down(self.dropout(F.relu(self.up(x))))
        return self.norms[-1](x + self.dropout(ffn))


class SeedTransformer(nn.Module):
    """The seed's encoder-decoder with the ``relative`` or ``rotary`` variant, of the shape,
    depth and dropout of ``config`` (its other switches are the seed's own: separate tables, no
    embedding scale, untied output with a bias, post-norm)."""

    def __init__(self, config: ModelConfig, vocab_size: int, variant: str, pad_id: int) -> None:
        super().__init__()
        d = config.d_model
        self.pad_id = pad_id
        self.src_embed, self.tgt_embed = nn.Embedding(vocab_size, d), nn.Embedding(vocab_size, d)
        self.encoder = nn.ModuleList(
            SeedLayer(config, variant, cross=False) for _ in range(config.encoder_layers)
        )
        self.decoder = nn.ModuleList(
            SeedLayer(config, variant, cross=True) for _ in range(config.decoder_layers)
        )
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.output = nn.Linear(d, vocab_size)

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The layers' matrices (not the embeddings, the output layer or the position tables),
        as posenc's weight-decay rule (:mod:`posenc.training.optim`)."""
        return [
            m.weight
            for stack in (self.encoder, self.decoder)
            for m in stack.modules()
            if isinstance(m, nn.Linear)
        ]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Memory ``(B, Ls, d)`` and key mask ``(B, 1, 1, Ls)`` (True at padding)."""
        pad = src.eq(self.pad_id)[:, None, None, :]
        x = self.src_embed(src)
        for layer in self.encoder:
            x = layer(x, pad, None, None)
        return self.encoder_norm(x), pad

    def decode(self, tgt: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Logits ``(B, Lt, V)`` of the whole prefix ``tgt (B, Lt)``."""
        length = tgt.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=tgt.device).triu(1)
        x = self.tgt_embed(tgt)
        for layer in self.decoder:
            x = layer(x, causal, memory, memory_mask)
        return self.output(self.decoder_norm(x))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, Lt, V)``."""
        memory, pad = self.encode(src)
        return self.decode(tgt_in, memory, pad)

    @torch.no_grad()
    def greedy(self, src: Tensor, steps: int, bos_id: int) -> Tensor:
        """``steps`` greedy tokens per row ``(B, steps)``, each from a decoder pass over the whole
        prefix (no cache, no early stop: the benchmark times a fixed number of steps)."""
        was_training = self.training
        self.eval()
        memory, pad = self.encode(src)
        tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        for _ in range(steps):
            next_token = self.decode(tokens, memory, pad)[:, -1].argmax(dim=-1)
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        self.train(was_training)
        return tokens[:, 1:]
