"""Encoder and decoder layers and the stacks handed to ``nn.Transformer`` as
``custom_encoder`` / ``custom_decoder``. Each stack owns its :class:`StackEncoding`, applies its
input-level part, computes its per-forward context once, and gives every layer its rule."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.model.attention import KVCache, MultiHeadAttention
from posenc.model.encodings.base import AttentionCall, StackEncoding

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


@dataclass
class LayerSpec:
    """Shape and regularisation shared by every layer of a model."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float = 0.1
    attn_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = True

    def __post_init__(self) -> None:
        if self.activation not in _ACTIVATIONS:
            raise ValueError(
                f"model.activation={self.activation!r} is unknown; "
                f"use one of {sorted(_ACTIVATIONS)}"
            )


class FeedForward(nn.Module):
    """Position-wise ``Linear -> activation -> dropout -> Linear`` on ``(B, L, d)``."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.up = nn.Linear(spec.d_model, spec.d_ff)
        self.down = nn.Linear(spec.d_ff, spec.d_model)
        self.dropout = nn.Dropout(spec.dropout)
        self.activation = _ACTIVATIONS[spec.activation]

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The two matrices, which weight decay applies to (see :mod:`posenc.training.optim`)."""
        return [self.up.weight, self.down.weight]

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(self.activation(self.up(x))))


class Residual(nn.Module):
    """A sublayer wrapped in dropout, a residual connection and pre- or post-LayerNorm."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(spec.d_model)
        self.dropout = nn.Dropout(spec.dropout)
        self.norm_first = spec.norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward on ``(B, L, d)``."""

    def __init__(self, spec: LayerSpec, encoding: StackEncoding, index: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(spec.d_model, spec.n_heads, encoding.self_rule(index))
        self.ffn = FeedForward(spec)
        self.attn_block = Residual(spec)
        self.ffn_block = Residual(spec)

    def forward(self, x: Tensor, call: AttentionCall) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, call))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the memory, feed-forward on ``(B, L, d)``."""

    def __init__(self, spec: LayerSpec, encoding: StackEncoding, index: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(spec.d_model, spec.n_heads, encoding.self_rule(index))
        self.cross_attn = MultiHeadAttention(spec.d_model, spec.n_heads, encoding.cross_rule(index))
        self.ffn = FeedForward(spec)
        self.self_block = Residual(spec)
        self.cross_block = Residual(spec)
        self.ffn_block = Residual(spec)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_call: AttentionCall,
        cross_call: AttentionCall,
        cache: dict[str, KVCache] | None = None,
    ) -> Tensor:
        self_cache = cross_cache = None
        if cache is not None:
            self_cache = cache.setdefault("self", {})
            cross_cache = cache.setdefault("cross", {})
        x = self.self_block(x, lambda h: self.self_attn(h, self_call, cache=self_cache))
        x = self.cross_block(
            x, lambda h: self.cross_attn(h, cross_call, memory=memory, cache=cross_cache)
        )
        return self.ffn_block(x, self.ffn)


@dataclass
class DecoderCache:
    """Keys/values of every decoder layer for incremental decoding; ``length`` tokens so far."""

    layers: list[dict[str, KVCache]] = field(default_factory=list)
    length: int = 0


class Encoder(nn.Module):
    """The encoder stack: input encoding, ``n_layers`` layers, final norm (pre-norm only)."""

    def __init__(self, spec: LayerSpec, encoding: StackEncoding, n_layers: int) -> None:
        super().__init__()
        self.encoding = encoding
        self.layers = nn.ModuleList(EncoderLayer(spec, encoding, i) for i in range(n_layers))
        self.dropout = nn.Dropout(spec.dropout)
        self.norm = nn.LayerNorm(spec.d_model) if spec.norm_first else nn.Identity()
        self.attn_dropout = spec.attn_dropout

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool | None = None,
    ) -> Tensor:
        """Encode embedded ``src (B, L, d)``; ``src_key_padding_mask (B, L)`` True at padding.

        ``mask``/``is_causal`` exist for ``nn.Transformer``'s call and must stay unset: position
        information comes from the encoding, never from an attention mask.
        """
        if mask is not None or is_causal:
            raise ValueError("posenc's encoder takes a padding mask only (no src_mask/is_causal)")
        positions = torch.arange(src.shape[1], device=src.device)
        x = self.dropout(self.encoding.embed(src, positions))
        call = AttentionCall(
            q_pos=positions,
            k_pos=positions,
            causal=False,
            key_padding_mask=src_key_padding_mask,
            context=self.encoding.context(positions, positions),
            dropout_p=self.attn_dropout if self.training else 0.0,
        )
        for layer in self.layers:
            x = layer(x, call)
        return self.norm(x)


class Decoder(nn.Module):
    """The decoder stack; supports incremental decoding through a :class:`DecoderCache`."""

    def __init__(self, spec: LayerSpec, encoding: StackEncoding, n_layers: int) -> None:
        super().__init__()
        self.encoding = encoding
        self.layers = nn.ModuleList(DecoderLayer(spec, encoding, i) for i in range(n_layers))
        self.dropout = nn.Dropout(spec.dropout)
        self.norm = nn.LayerNorm(spec.d_model) if spec.norm_first else nn.Identity()
        self.attn_dropout = spec.attn_dropout

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Decode embedded ``tgt (B, Lt, d)`` against ``memory (B, Ls, d)``.

        Self-attention is always causal, so target padding (which only follows real tokens)
        needs no mask. With ``cache``, ``tgt`` holds only the new tokens, which continue at
        position ``cache.length``; the cache is extended in place. Returns ``(B, Lt, d)``.
        """
        if tgt_mask is not None or memory_mask is not None:
            raise ValueError("posenc's decoder builds its own causal mask; pass padding masks only")
        offset = cache.length if cache is not None else 0
        length = tgt.shape[1]
        q_pos = torch.arange(offset, offset + length, device=tgt.device)
        k_pos = torch.arange(offset + length, device=tgt.device)
        src_pos = torch.arange(memory.shape[1], device=tgt.device)
        dropout_p = self.attn_dropout if self.training else 0.0
        self_call = AttentionCall(
            q_pos=q_pos,
            k_pos=k_pos,
            causal=True,
            context=self.encoding.context(q_pos, k_pos),
            dropout_p=dropout_p,
        )
        cross_call = AttentionCall(
            q_pos=q_pos,
            k_pos=src_pos,
            causal=False,
            key_padding_mask=memory_key_padding_mask,
            dropout_p=dropout_p,
        )
        if cache is not None and not cache.layers:
            cache.layers = [{} for _ in self.layers]
        x = self.dropout(self.encoding.embed(tgt, q_pos))
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x = layer(x, memory, self_call, cross_call, layer_cache)
        if cache is not None:
            cache.length += length
        return self.norm(x)
