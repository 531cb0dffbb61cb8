"""``nn.Transformer`` holding posenc's encoder and decoder stacks: the one place that pays for it.

Users expect a ``torch.nn.Transformer`` (``model.transformer`` is one, with posenc's stacks as its
``encoder`` and ``decoder``), but two of its habits do not fit posenc, and this adapter confines
them:

* its constructor initialises every matrix it holds with Xavier, which would overwrite the
  initialisation each encoding's paper prescribes: the adapter is built around parameter-free
  placeholders, then takes the stacks and gives the layers' matrices (never a parameter owned by
  an encoding, see :class:`~posenc.model.encodings.base.EncodingModule`) the same Xavier
  initialisation ``nn.Transformer`` gives its own layers;
* its forward passes attention masks (``src_mask``, ``tgt_mask``, ``is_causal``) that posenc never
  uses, since position information comes from the encoding, never from a mask: the adapter's
  forward takes padding masks only and calls the stacks with exactly what they need.
"""

from __future__ import annotations

from torch import Tensor, nn

from posenc.config import ModelConfig
from posenc.model.encodings.base import EncodingModule
from posenc.model.layers import Decoder, Encoder


class StackedTransformer(nn.Transformer):
    """An ``nn.Transformer`` (batch first) whose encoder and decoder are posenc's stacks."""

    encoder: Encoder
    decoder: Decoder

    def __init__(self, config: ModelConfig, encoder: Encoder, decoder: Decoder) -> None:
        super().__init__(
            d_model=config.d_model,
            nhead=config.n_heads,
            dim_feedforward=config.d_ff,
            dropout=config.dropout,
            custom_encoder=nn.Identity(),
            custom_decoder=nn.Identity(),
            batch_first=True,
        )
        self.encoder, self.decoder = encoder, decoder
        owned = {
            id(p) for m in self.modules() if isinstance(m, EncodingModule) for p in m.parameters()
        }
        for p in self.parameters():
            if p.dim() > 1 and id(p) not in owned:
                nn.init.xavier_uniform_(p)

    def forward(self, src: Tensor, tgt: Tensor, src_key_padding_mask: Tensor) -> Tensor:
        """Hidden states ``(B, Lt, d)`` of embedded ``tgt (B, Lt, d)`` attending to embedded
        ``src (B, Ls, d)``; ``src_key_padding_mask (B, Ls)`` is True at source padding."""
        memory = self.encoder(src, src_key_padding_mask)
        return self.decoder(tgt, memory, src_key_padding_mask)
