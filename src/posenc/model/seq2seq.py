"""The Seq2Seq model and its batched greedy decoding (or sampling) with a key/value cache. It
holds token embeddings, ``nn.Transformer`` with posenc's stacks (see
:mod:`posenc.model.transformer`) and the output head; beam search is in :mod:`posenc.model.search`
and sampling's filters and draws in :mod:`posenc.model.sampling`. The decoding itself
(:class:`Translator`) asks only for :class:`~posenc.model.search.Decodable`, so an
:class:`~posenc.model.ensemble.Ensemble` of models decodes through the same code."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.config import ModelConfig
from posenc.model.attention import first_calls
from posenc.model.encodings.base import Site, StackEncoding
from posenc.model.layers import Decoder, DecoderCache, Encoder
from posenc.model.sampling import Sampling
from posenc.model.search import DecodeState, Hypothesis, beam_search, max_lengths
from posenc.model.transformer import StackedTransformer


class Translator(nn.Module):
    """Greedy decoding, sampling, beam search and n-best lists of a model that
    :class:`~posenc.model.search.Decodable` describes: its ``pad_id``, ``bos_id``, ``eos_id``
    and :meth:`start`, and its ``position_limit``."""

    pad_id: int
    bos_id: int
    eos_id: int

    @property
    def position_limit(self) -> int | None:
        """The most target tokens it can place (its decoder's positions); None: any."""
        raise NotImplementedError

    def start(self, src: Tensor, use_cache: bool) -> DecodeState:
        """Encode ``src (B, Ls)``: the state of its rows before their first token."""
        raise NotImplementedError

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        use_cache: bool = True,
        beam_size: int = 1,
        lenpen: float = 1.0,
        sampling: Sampling | None = None,
        sentence_ids: Sequence[int] | None = None,
    ) -> list[list[int]]:
        """Translate ``src (B, Ls)``: batched greedy decoding when ``beam_size`` is 1, else the
        best hypothesis of :func:`~posenc.model.search.beam_search` under length penalty
        ``lenpen``; with ``sampling`` (and ``beam_size`` 1), each token is drawn as it says
        (see :mod:`posenc.model.sampling`), row ``b`` with the draws of sentence
        ``sentence_ids[b]`` (default: ``b``).

        Each row may produce at most ``max_len_a * source_length + max_len_b`` tokens (EOS
        included). With ``use_cache=False`` the decoder recomputes the whole prefix at every
        step (a reference for the cache). Returns token ids per row, without BOS and EOS.
        """
        if sampling is not None and beam_size != 1:
            raise ValueError(f"sampling draws one translation per row: beam_size={beam_size}")
        was_training = self.training
        self.eval()
        try:
            if beam_size == 1:
                return self._greedy(src, max_len_a, max_len_b, use_cache, sampling, sentence_ids)
            found = beam_search(self, src, beam_size, lenpen, max_len_a, max_len_b, use_cache)
            return [hypotheses[0].tokens for hypotheses in found]
        finally:
            self.train(was_training)

    @torch.no_grad()
    def nbest(
        self,
        src: Tensor,
        nbest: int,
        beam_size: int,
        lenpen: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        use_cache: bool = True,
    ) -> list[list[Hypothesis]]:
        """The ``nbest`` best hypotheses of :func:`~posenc.model.search.beam_search` of width
        ``beam_size`` for each row of ``src (B, Ls)``, best first, each with its score and
        summed log-probability (fewer where the search finished fewer); the first is what
        :meth:`generate` returns."""
        if not 1 <= nbest <= beam_size:
            raise ValueError(f"nbest={nbest} must be in [1, beam_size={beam_size}]")
        was_training = self.training
        self.eval()
        try:
            found = beam_search(self, src, beam_size, lenpen, max_len_a, max_len_b, use_cache)
            return [hypotheses[:nbest] for hypotheses in found]
        finally:
            self.train(was_training)

    def _greedy(
        self,
        src: Tensor,
        max_len_a: float,
        max_len_b: int,
        use_cache: bool,
        sampling: Sampling | None = None,
        sentence_ids: Sequence[int] | None = None,
    ) -> list[list[int]]:
        """Greedy decoding of ``src (B, Ls)``, or sampling as ``sampling`` says (row ``b`` with
        the draws of sentence ``sentence_ids[b]``); stops once every row has produced EOS."""
        state = self.start(src, use_cache)
        limits = max_lengths(state.src_pad, max_len_a, max_len_b, self.position_limit)
        batch = src.shape[0]
        if sampling is not None:
            ids = range(batch) if sentence_ids is None else sentence_ids
            uniforms = sampling.uniforms(ids, limits)
        tokens = torch.full((batch, 1), self.bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
        for step in range(int(limits.max())):
            logits = state.logits(tokens)
            if sampling is None:
                next_token = logits.argmax(dim=-1)
            else:
                never = (self.pad_id, self.bos_id)
                next_token = sampling.draw(logits, uniforms[:, step], never)
            next_token = torch.where(finished, torch.full_like(next_token, self.pad_id), next_token)
            next_token = torch.where(
                ~finished & (step + 1 >= limits),
                torch.full_like(next_token, self.eos_id),
                next_token,
            )
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            finished |= next_token.eq(self.eos_id)
            if bool(finished.all()):
                break
        return [_strip(row, self.eos_id, self.pad_id) for row in tokens[:, 1:].tolist()]


class Seq2Seq(Translator):
    """An encoder-decoder Transformer whose positional encoding is pluggable.

    Args:
        vocab_size: size of the (joint) vocabulary.
        pad_id, bos_id, eos_id: special token ids.
        config: the model's shape, depth, regularisation and embedding switches.
        encoding: ``(site, d_model, n_heads, n_layers) -> StackEncoding``, called once per stack.
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        bos_id: int,
        eos_id: int,
        config: ModelConfig,
        encoding: Callable[..., StackEncoding],
    ) -> None:
        super().__init__()
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        d, heads = config.d_model, config.n_heads
        self.embed_scale = math.sqrt(d) if config.scale_embedding else 1.0
        self.src_embed = nn.Embedding(vocab_size, d, padding_idx=pad_id)
        self.tgt_embed = (
            self.src_embed if config.share_embeddings else nn.Embedding(vocab_size, d, pad_id)
        )
        self.transformer = StackedTransformer(
            config,
            Encoder(config, encoding(Site.ENCODER, d, heads, config.encoder_layers)),
            Decoder(config, encoding(Site.DECODER, d, heads, config.decoder_layers)),
        )
        self.output = nn.Linear(d, vocab_size, bias=False)
        if config.tie_output:
            self.output.weight = self.tgt_embed.weight
        self._init_embeddings(config.embed_init_std)

    def _init_embeddings(self, embed_std: float | None) -> None:
        """Embeddings ~ N(0, ``embed_std``) (default d^-1/2), padding row zero; an untied output
        matrix ~ N(0, d^-1/2)."""
        d = self.src_embed.embedding_dim
        for emb in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(emb.weight, std=d**-0.5 if embed_std is None else embed_std)
            with torch.no_grad():
                emb.weight[self.pad_id].zero_()
        if self.output.weight is not self.tgt_embed.weight:
            nn.init.normal_(self.output.weight, std=d**-0.5)

    @property
    def encoder(self) -> Encoder:
        return self.transformer.encoder

    @property
    def decoder(self) -> Decoder:
        return self.transformer.decoder

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits ``(B, Lt, V)`` for ``src (B, Ls)`` and ``tgt_in (B, Lt)``."""
        src_pad = src.eq(self.pad_id)
        hidden = self.transformer(
            self.src_embed(src) * self.embed_scale,
            self.tgt_embed(tgt_in) * self.embed_scale,
            src_key_padding_mask=src_pad,
        )
        return self.output(hidden)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Memory ``(B, Ls, d)`` and source padding mask ``(B, Ls)`` for ``src (B, Ls)``."""
        src_pad = src.eq(self.pad_id)
        memory = self.encoder(self.src_embed(src) * self.embed_scale, src_pad)
        return memory, src_pad

    @property
    def position_limit(self) -> int | None:
        """The decoder's :attr:`StackEncoding.max_positions` (None: any length)."""
        return self.decoder.encoding.max_positions

    def start(self, src: Tensor, use_cache: bool = True) -> Decoding:
        """Encode ``src (B, Ls)`` for decoding, with an empty key/value cache when
        ``use_cache``."""
        memory, src_pad = self.encode(src)
        return Decoding(self, memory, src_pad, DecoderCache() if use_cache else None)

    def decode(
        self, tgt: Tensor, memory: Tensor, src_pad: Tensor, cache: DecoderCache | None = None
    ) -> Tensor:
        """Logits ``(B, Lt, V)`` for target tokens ``tgt (B, Lt)`` (only new ones with a cache)."""
        hidden = self.decoder(
            self.tgt_embed(tgt) * self.embed_scale,
            memory,
            memory_key_padding_mask=src_pad,
            cache=cache,
        )
        return self.output(hidden)

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt_in: Tensor, layer: int = 0) -> dict[str, Tensor]:
        """Attention weights of ``layer`` for one teacher-forced pass, keyed ``encoder``
        (self, ``(B, H, Ls, Ls)``), ``decoder`` (self, ``(B, H, Lt, Lt)``) and ``cross``
        (``(B, H, Lt, Ls)``)."""
        sites = {
            "encoder": self.encoder.layers[layer].self_attn,
            "decoder": self.decoder.layers[layer].self_attn,
            "cross": self.decoder.layers[layer].cross_attn,
        }
        return self._weights(src, tgt_in, sites)

    def cross_attention_maps(self, src: Tensor, tgt_in: Tensor) -> list[Tensor]:
        """The cross-attention weights ``(B, H, Lt, Ls)`` of every decoder layer, in order,
        from one teacher-forced pass."""
        sites = {str(i): layer.cross_attn for i, layer in enumerate(self.decoder.layers)}
        return list(self._weights(src, tgt_in, sites).values())

    def _weights(
        self, src: Tensor, tgt_in: Tensor, sites: dict[str, nn.Module]
    ) -> dict[str, Tensor]:
        """The attention weights of each attention module of ``sites`` (by name) for one
        teacher-forced pass in eval mode, recomputed from the arguments of its call."""
        was_training = self.training
        self.eval()
        try:
            with first_calls(*sites.values()) as calls:
                self(src, tgt_in)
        finally:
            self.train(was_training)
        return {
            name: attention.attention_weights(
                call.arg(0, "x"), call.arg(1, "call"), memory=call.arg(2, "memory")
            )
            for (name, attention), call in zip(sites.items(), calls, strict=True)
        }


@dataclass
class Decoding:
    """One model's :class:`~posenc.model.search.DecodeState`: the encoder output ``memory (B,
    Ls, d)`` and padding mask ``src_pad (B, Ls)`` of each row, and the decoder's key/value
    ``cache`` (None: the whole prefix is recomputed at every step, a reference for the cache)."""

    model: Seq2Seq
    memory: Tensor
    src_pad: Tensor
    cache: DecoderCache | None

    @property
    def dtype(self) -> torch.dtype:
        return self.memory.dtype

    def logits(self, tokens: Tensor) -> Tensor:
        """``(B, V)`` the model's next-token logits after ``tokens (B, t)`` (only the last
        token is fed with a cache)."""
        step_input = tokens[:, -1:] if self.cache is not None else tokens
        return self.model.decode(step_input, self.memory, self.src_pad, self.cache)[:, -1]

    def select(self, rows: Tensor) -> None:
        """Keep the rows ``rows (B',)`` of the memory, the mask and the cache."""
        self.memory = self.memory[rows]
        self.src_pad = self.src_pad[rows]
        if self.cache is not None:
            self.cache.reorder(rows)


def _strip(ids: list[int], eos_id: int, pad_id: int) -> list[int]:
    """Cut a generated row at its first EOS and drop padding."""
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return [i for i in ids if i != pad_id]


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
