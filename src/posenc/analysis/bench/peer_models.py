"""The models that the benchmark's peers (:mod:`.peers`) train: a plain ``torch.nn.Transformer``
of posenc's shape, and x-transformers' ``XTransformer`` with the options of an encoding.

Each takes ``model(src, tgt_in) -> logits (B, Lt, V)``, so posenc's training step
(:class:`.runner.Trainer`: label-smoothed loss, clipping, AdamW) trains it unchanged, and
declares the matrices that weight decay applies to (``decayed_parameters``, the rule of
:mod:`posenc.training.optim`: the layers' matrices, never embeddings, the output layer or position
parameters).
"""

from __future__ import annotations

import importlib.metadata
import math
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from posenc.config import ModelConfig

XT_INSTALL = (
    "x-transformers is not installed, so --peers leaves it out: "
    "pip install -e '.[bench]' (or pip install x-transformers) to time it"
)


def sinusoidal_table(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al.'s table ``(length, d_model)``: sin at even, cos at odd dimensions."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: d_model // 2])
    return table


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` (batch first) of ``config``'s shape, with posenc's embedding
    switches (shared source/target table, output tied to the target table, ``sqrt(d)`` scale, the
    same initial draws' distribution) and sinusoidal positions added to the embeddings
    (``positions=False``: none).

    Where it differs from posenc's model of the same shape: ``nn.Transformer`` ends each stack
    with a LayerNorm whatever ``norm_first`` is, posenc only in pre-norm, so with
    ``norm_first: false`` it has ``4 * d_model`` more parameters; the attention-weight dropout,
    which ``nn.Transformer``'s constructor ties to ``dropout``, is set to ``attn_dropout`` as in
    posenc. The causal mask is built the standard way
    (``nn.Transformer.generate_square_subsequent_mask``, with ``tgt_is_causal=True``).
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, pad_id: int, positions: bool = True
    ) -> None:
        super().__init__()
        d = config.d_model
        self.pad_id, self.positions = pad_id, positions
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.src_embed = nn.Embedding(vocab_size, d, padding_idx=pad_id)
        self.tgt_embed = (
            self.src_embed if config.share_embeddings else nn.Embedding(vocab_size, d, pad_id)
        )
        with warnings.catch_warnings():  # nested tensors (inference only) and norm_first
            warnings.filterwarnings("ignore", message="enable_nested_tensor")
            self.transformer = self._transformer(config)
        for module in self.transformer.modules():
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = config.attn_dropout
        self.output = nn.Linear(d, vocab_size, bias=False)
        if config.tie_output:
            self.output.weight = self.tgt_embed.weight
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=d**-0.5)
            with torch.no_grad():
                emb.weight[pad_id].zero_()
        if not config.tie_output:
            nn.init.normal_(self.output.weight, std=d**-0.5)
        self.register_buffer("table", sinusoidal_table(512, d), persistent=False)

    @staticmethod
    def _transformer(config: ModelConfig) -> nn.Transformer:
        return nn.Transformer(
            d_model=config.d_model,
            nhead=config.n_heads,
            num_encoder_layers=config.encoder_layers,
            num_decoder_layers=config.decoder_layers,
            dim_feedforward=config.d_ff,
            dropout=config.dropout,
            activation=config.activation,
            batch_first=True,
            norm_first=config.norm_first,
        )

    def decayed_parameters(self) -> list[nn.Parameter]:
        """Attention and feed-forward matrices, as posenc decays."""
        return [p for p in self.transformer.parameters() if p.dim() > 1]

    def _embed(self, embed: nn.Embedding, tokens: Tensor) -> Tensor:
        x = embed(tokens) * self.embed_scale
        if not self.positions:
            return x
        if tokens.shape[1] > self.table.shape[0]:
            self.table = sinusoidal_table(tokens.shape[1], x.shape[-1]).to(x.device)
        return x + self.table[: tokens.shape[1]]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, Lt, V)``."""
        src_pad = src.eq(self.pad_id)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=src.device)
        hidden = self.transformer(
            self._embed(self.src_embed, src),
            self._embed(self.tgt_embed, tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )
        return self.output(hidden)


def xt_version() -> str | None:
    """The installed x-transformers' version, or None when it is not installed."""
    try:
        return importlib.metadata.version("x-transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def xt_options(
    config: ModelConfig,
    vocab_size: int,
    pad_id: int,
    max_len: int,
    common: dict[str, Any],
    variant: dict[str, Any],
) -> dict[str, Any]:
    """``XTransformer`` keyword arguments: ``config``'s shape, dropouts and shared embedding
    table, then ``common`` and the encoding's ``variant`` options (a key without ``enc_`` or
    ``dec_`` applies to both stacks; a variant's key overrides a common one)."""
    d, heads = config.d_model, config.n_heads
    if int(d * (config.d_ff / d)) != config.d_ff:
        raise ValueError(f"x-transformers cannot make d_ff={config.d_ff} from d_model={d}")
    shared = {
        "num_tokens": vocab_size,
        "max_seq_len": max_len,
        "heads": heads,
        "attn_dim_head": d // heads,
        "rotary_emb_dim": d // heads,  # full-width rotation, as posenc's rotary
        "ff_mult": config.d_ff / d,
        "ff_custom_activation": nn.ReLU() if config.activation == "relu" else nn.GELU(),
        "pre_norm": config.norm_first,
        "emb_dropout": config.dropout,
        "attn_dropout": config.attn_dropout,
        "attn_sublayer_dropout": config.dropout,
        "ff_dropout": config.dropout,
        "ff_sublayer_dropout": config.dropout,
        **common,
    }
    options: dict[str, Any] = {}
    for key, value in {**shared, **variant}.items():
        sides = [key] if key.startswith(("enc_", "dec_")) else [f"enc_{key}", f"dec_{key}"]
        options.update(dict.fromkeys(sides, value))
    options["enc_depth"], options["dec_depth"] = config.encoder_layers, config.decoder_layers
    return {**options, "dim": d, "tie_token_emb": config.share_embeddings, "pad_value": pad_id}


class XTransformerPeer(nn.Module):
    """x-transformers' ``XTransformer`` called for teacher-forced logits (its own forward returns
    its own loss; posenc's label-smoothed loss is applied to these logits instead). The source
    mask (True at real tokens) goes to the encoder and to cross-attention, as posenc passes its
    padding mask. With ``tie_output`` the decoder's output layer shares the target embedding
    table, as posenc ties them (``XTransformer`` itself has no such switch)."""

    def __init__(self, options: dict[str, Any], tie_output: bool) -> None:
        super().__init__()
        from loguru import logger
        from x_transformers import XTransformer

        logger.disable("x_transformers")  # its advice on rotary widths, once per stack
        self.pad_id = options["pad_value"]
        self.xt = XTransformer(**options)
        net = self.xt.decoder.net
        if tie_output:
            net.to_logits.weight = net.token_emb.emb.weight

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The attention layers' matrices (not embeddings, the output layer or bias tables)."""
        stacks = (self.xt.encoder.attn_layers, self.xt.decoder.net.attn_layers)
        modules = [m for stack in stacks for m in stack.modules()]
        tables = {id(m.weight) for m in modules if isinstance(m, nn.Embedding)}
        return [
            m.weight for m in modules if isinstance(m, nn.Linear) and id(m.weight) not in tables
        ]

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, Lt, V)``."""
        mask = src.ne(self.pad_id)
        memory = self.xt.encoder(src, mask=mask, return_embeddings=True)
        return self.xt.decoder.net(tgt_in, context=memory, context_mask=mask)
