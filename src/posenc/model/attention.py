"""The one multi-head attention module of posenc. Its :class:`AttentionRule` decides how
positions enter (see :mod:`posenc.model.encodings.base`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from posenc.model.encodings.base import AttentionCall, AttentionRule

KVCache = dict[str, Tensor | None]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with q/k/v/out projections around a pluggable rule.

    Args:
        d_model: model width ``d``.
        n_heads: heads ``H``; ``D = d / H``.
        rule: the encoding's attention rule for this layer and site; its
            :meth:`~AttentionRule.head_counts` says how many heads of ``D`` q, k, v are projected to
            (``n_heads``) and how many its output holds (H unless the rule says otherwise).
    """

    def __init__(self, d_model: int, n_heads: int, rule: AttentionRule) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.head_dim = d_model // n_heads
        self.n_heads, self.attended_heads = rule.head_counts(n_heads)
        width = self.n_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, width)
        self.kv_proj = nn.Linear(d_model, 2 * width)
        self.out_proj = nn.Linear(self.attended_heads * self.head_dim, d_model)
        self.rule = rule

    def decayed_parameters(self) -> list[nn.Parameter]:
        """The projection matrices, which weight decay applies to (see
        :mod:`posenc.training.optim`); biases and the rule's parameters are not decayed."""
        return [self.q_proj.weight, self.kv_proj.weight, self.out_proj.weight]

    def _split(self, x: Tensor) -> Tensor:
        """``(B, L, H*D)`` -> ``(B, H, L, D)``."""
        b, l, _ = x.shape
        return x.view(b, l, self.n_heads, self.head_dim).transpose(1, 2)

    def _project(
        self, x: Tensor, call: AttentionCall, memory: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """q ``(B, H, Lq, D)``, k and v ``(B, H, Lk, D)`` and the key state, cache extended."""
        q = self._split(self.q_proj(x))
        state = None
        if memory is None:
            k, v = map(self._split, self.kv_proj(x).chunk(2, dim=-1))
            q, k, state = self.rule.prepare(q, k, x, call.q_pos, context=call.context)
            if cache is not None:
                if cache.get("k") is not None:
                    k = _cat(cache["k"], k, dim=2)
                    v = _cat(cache["v"], v, dim=2)
                    state = _cat(cache.get("state"), state, dim=2)
                cache.update(k=k, v=v, state=state)
        elif cache is not None and cache.get("k") is not None:
            k, v = cache["k"], cache["v"]
        else:
            k, v = map(self._split, self.kv_proj(memory).chunk(2, dim=-1))
            if cache is not None:
                cache.update(k=k, v=v)
        return q, k, v, state

    def attention_weights(
        self, x: Tensor, call: AttentionCall, memory: Tensor | None = None
    ) -> Tensor:
        """The weights ``(B, H, Lq, Lk)`` this layer puts on each key (for plots and reports)."""
        q, k, _, state = self._project(x, call, memory, None)
        return self.rule.weights(q, k, state, call)

    def forward(
        self,
        x: Tensor,
        call: AttentionCall,
        memory: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``x (B, Lq, d)``.

        Self-attention when ``memory`` is None (keys are ``x`` and, with a cache, every earlier
        token); cross-attention to ``memory (B, Lk, d)`` otherwise. ``cache`` is a dict updated
        in place: self-attention appends the new keys/values, cross-attention stores the memory's
        keys/values once. Returns ``(B, Lq, d)``.
        """
        q, k, v, state = self._project(x, call, memory, cache)
        if cache is not None and memory is None:
            out, cache["k"] = self.rule.attend_cached(q, k, v, state, call)
        else:
            out = self.rule(q, k, v, state, call)
        b, _, lq, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, lq, -1))


def _cat(old: Tensor | None, new: Tensor | None, dim: int) -> Tensor | None:
    """Concatenate cached and new tensors along ``dim``; None stays None."""
    if old is None or new is None:
        return new
    return torch.cat([old, new], dim=dim)


@dataclass
class Call:
    """The arguments of one call of a module (recorded by :func:`first_calls`)."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    seen: bool = False

    def arg(self, index: int, name: str) -> Any:
        """Argument ``name``, passed at position ``index`` or by keyword (None when absent)."""
        return self.args[index] if len(self.args) > index else self.kwargs.get(name)


@contextmanager
def first_calls(*modules: nn.Module) -> Iterator[list[Call]]:
    """Inside the block, record the arguments of each module's first call (forward pre-hooks,
    removed on leaving); plots and attention maps read what a layer received this way."""
    calls = [Call() for _ in modules]

    def recorder(call: Call):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not call.seen:
                call.args, call.kwargs, call.seen = args, dict(kwargs), True

        return hook

    handles = [
        module.register_forward_pre_hook(recorder(call), with_kwargs=True)
        for module, call in zip(modules, calls, strict=True)
    ]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
