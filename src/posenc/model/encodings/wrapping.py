"""Attention rules around other rules (a temperature, learned sinks, DAPE's bias MLP): every hook
of :class:`~posenc.model.encodings.base.AttentionRule` forwarded to the inner rule by
construction, and whether a rule, through its wrappers, changes a hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posenc.model.encodings.base import AttentionRule


def rule_hooks() -> list[str]:
    """The hooks of :class:`AttentionRule`: every public method its own class body defines."""
    return [n for n, v in vars(AttentionRule).items() if callable(v) and not n.startswith("_")]


class WrapperRule(AttentionRule):
    """An attention rule around another, ``inner`` (a temperature, DAPE's bias MLP): every hook
    of :class:`AttentionRule` is forwarded to ``inner`` by construction, so a hook added later
    reaches it without a word here; a wrapper overrides what it changes. The declarations
    :attr:`~AttentionRule.rotates_qk` and :attr:`~AttentionRule.masking_bias` are inner's."""

    def __init__(self, inner: AttentionRule) -> None:
        super().__init__()
        self.inner = inner
        self.rotates_qk, self.masking_bias = inner.rotates_qk, inner.masking_bias


def overrides(rule: AttentionRule, hook: str) -> bool:
    """Whether ``rule`` changes :class:`AttentionRule`'s ``hook`` (a wrapper that forwards it
    asks its inner rule)."""
    own = getattr(type(rule), hook)
    if own is getattr(WrapperRule, hook):
        return overrides(rule.inner, hook)  # type: ignore[attr-defined]
    return own is not getattr(AttentionRule, hook)


def _forwarding(name: str) -> Callable[..., Any]:
    def forward_to_inner(self: WrapperRule, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    forward_to_inner.__name__ = name
    forward_to_inner.__doc__ = f"``inner``'s :meth:`~AttentionRule.{name}`."
    return forward_to_inner


for _hook in rule_hooks():
    setattr(WrapperRule, _hook, _forwarding(_hook))
del _hook
