"""Encoder and decoder layers and the stacks that :mod:`posenc.model.transformer` places inside
``nn.Transformer``. Each stack owns its :class:`StackEncoding`, applies its
input-level part, computes its per-forward context once, and gives every layer its rule."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.config import ModelConfig
from posenc.model.attention import KVCache, MultiHeadAttention
from posenc.model.dropout import Dropout
from posenc.model.encodings.base import AttentionCall, StackEncoding


class FeedForward(nn.Module):
    """Position-wise ``Linear -> activation -> dropout -> Linear`` on ``(B, L, d)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.d_ff)
        self.down = nn.Linear(config.d_ff, config.d_model)
        self.dropout = Dropout(config.dropout)
        self.activation = getattr(F, config.activation)  # relu or gelu (see ModelConfig)

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The two matrices, which weight decay applies to (see :mod:`posenc.training.optim`)."""
        return [self.up.weight, self.down.weight]

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(self.activation(self.up(x))))


def feedforward(
    ffn: FeedForward, self_attn: MultiHeadAttention, h: Tensor, call: AttentionCall
) -> Tensor:
    """``ffn(h)`` for ``h (B, L, d)``, shown to the layer's self-attention rule
    (:meth:`AttentionRule.after_feedforward`) before it is returned."""
    y = ffn(h)
    self_attn.rule.after_feedforward(y, call)
    return y


class Residual(nn.Module):
    """A sublayer wrapped in dropout, a residual connection and pre- or post-LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward on ``(B, L, d)``."""

    def __init__(self, config: ModelConfig, encoding: StackEncoding, index: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, encoding.layer_rule(index)
        )
        self.ffn = FeedForward(config)
        self.attn_block = Residual(config)
        self.ffn_block = Residual(config)

    def forward(self, x: Tensor, call: AttentionCall) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, call))
        return self.ffn_block(x, lambda h: feedforward(self.ffn, self.self_attn, h, call))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the memory, feed-forward on ``(B, L, d)``."""

    def __init__(self, config: ModelConfig, encoding: StackEncoding, index: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            config.d_model, config.n_heads, encoding.layer_rule(index)
        )
        self.cross_attn = MultiHeadAttention(
            config.d_model, config.n_heads, encoding.layer_rule(index, cross=True)
        )
        self.ffn = FeedForward(config)
        self.self_block = Residual(config)
        self.cross_block = Residual(config)
        self.ffn_block = Residual(config)

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
        return self.ffn_block(x, lambda h: feedforward(self.ffn, self.self_attn, h, self_call))


@dataclass
class DecoderCache:
    """Keys/values of every decoder layer for incremental decoding; ``length`` tokens so far."""

    layers: list[dict[str, KVCache]] = field(default_factory=list)
    length: int = 0

    def reorder(self, index: Tensor) -> None:
        """Keep, in place, the rows ``index (B',)`` of every cached tensor (keys and values
        ``(B, H, L, D)``, key states ``(B, H, L)``): beam search follows its surviving
        hypotheses this way, and drops the rows of finished sentences."""
        for layer in self.layers:
            for entry in layer.values():
                for name, tensor in entry.items():
                    if tensor is not None:
                        entry[name] = tensor.index_select(0, index)


class Stack(nn.Module):
    """A stack: its encoding, one layer per ``encoding.n_layers``, input dropout and a final norm
    (pre-norm only)."""

    layer_class: type[nn.Module]

    def __init__(self, config: ModelConfig, encoding: StackEncoding) -> None:
        super().__init__()
        self.encoding = encoding
        self.layers = nn.ModuleList(
            self.layer_class(config, encoding, i) for i in range(encoding.n_layers)
        )
        self.dropout = Dropout(config.dropout)
        self.norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.attn_dropout = config.attn_dropout


class Encoder(Stack):
    """The encoder stack."""

    layer_class = EncoderLayer

    def forward(
        self,
        src: Tensor,
        src_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Encode embedded ``src (B, L, d)``; ``src_key_padding_mask (B, L)`` True at padding."""
        positions = self.encoding.positions(src.shape[1], src.device)
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


class Decoder(Stack):
    """The decoder stack; supports incremental decoding through a :class:`DecoderCache`."""

    layer_class = DecoderLayer

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_key_padding_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """Decode embedded ``tgt (B, Lt, d)`` against ``memory (B, Ls, d)``.

        Self-attention is always causal, so target padding (which only follows real tokens)
        needs no mask. With ``cache``, ``tgt`` holds only the new tokens, which continue at
        position ``cache.length``; the cache is extended in place. Without one, positions come
        from :meth:`StackEncoding.positions` (augmented in training). Returns ``(B, Lt, d)``.
        """
        length = tgt.shape[1]
        if cache is None:
            q_pos = k_pos = self.encoding.positions(length, tgt.device)
        else:
            q_pos = torch.arange(cache.length, cache.length + length, device=tgt.device)
            k_pos = torch.arange(cache.length + length, device=tgt.device)
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
