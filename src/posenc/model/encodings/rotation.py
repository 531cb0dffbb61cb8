"""The rotation of queries and keys that the rotary encodings share.

RoPE (:mod:`~posenc.model.encodings.rotary`) and xPos (:mod:`~posenc.model.encodings.xpos`)
use RoPE's frequencies, the complex rotation tables, the rotation of pairs of dims, and the
stack whose self-attention rotates the new tokens before they are cached; FoPE maps pairs by
complex tables of its own; LieRE and ComRoPE rotate blocks of dims by exponentials of
skew-symmetric generators."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.model.encodings.base import AttentionRule, StackEncoding, compute_dtype


def rope_frequencies(dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """RoPE's inverse frequencies ``theta_i = base^(-2i/dim) (dim/2,)`` for ``dim`` rotated
    dims, in ``dtype``."""
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=dtype) / dim)


def paired_head_dim(name: str, d_model: int, n_heads: int) -> int:
    """The head dim ``d_model / n_heads`` of an encoding that turns pairs of dims.

    Raises:
        ValueError: it is odd (one line naming the encoding ``name`` and the fix).
    """
    head_dim = d_model // n_heads
    if head_dim % 2:
        raise ValueError(f"{name}: the head dim {head_dim} must be even; change d_model or n_heads")
    return head_dim


def slow_bands(inv_freq: Tensor, training_length: int) -> Tensor:
    """Bool ``(D/2,)``: the bands of ``inv_freq (D/2,)`` whose wavelength exceeds the training
    length ``L``, ``theta_j < 2 pi / L`` (HoPE's rule, as Levy et al. 2026 state it)."""
    return inv_freq < 2 * math.pi / training_length


def rotation_table(positions: Tensor, inv_freq: Tensor, scale: Tensor | float = 1.0) -> Tensor:
    """Complex ``scale * e^(i m theta) (..., L, r/2)`` (complex64) for ``positions (L,)`` and
    ``inv_freq``: ``(r/2,)`` for every position, ``(L, r/2)`` one set per position or
    ``(B, 1, r/2)`` one per sequence; ``scale`` (a float or ``(L, r/2)``) is YaRN's temperature
    or xPos's decay."""
    angles = positions.to(torch.float32)[:, None] * inv_freq
    return torch.complex(angles.cos() * scale, angles.sin() * scale)


def rotate(x: Tensor, table: Tensor) -> Tensor:
    """Rotate the first ``r`` dims of ``x (B, H, L, D)`` by ``table (L, r/2)`` (or any shape
    that broadcasts to ``(B, H, L, r/2)``: one per sequence ``(B, 1, L, r/2)``, per head
    ``(H, L, r/2)``, per sequence and head) from :func:`rotation_table` or an encoding's own
    complex maps, pair ``(2i, 2i+1)`` by entry ``i``; the other dims pass through.

    Computed in float32 for lower-precision inputs (complex bfloat16 does not exist) and
    returned in ``x``'s dtype.
    """
    r = 2 * table.shape[-1]
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    head = work[..., :r] if r < x.shape[-1] else work
    compiling = torch.compiler.is_compiling()  # reading strides would break the graph
    if compiling or head.storage_offset() % 2 or any(st % 2 for st in head.stride()[:-1]):
        head = head.contiguous()  # a complex view needs even strides (odd head dims)
    pairs = torch.view_as_complex(head.unflatten(-1, (-1, 2)))
    out = torch.view_as_real(pairs * table.to(pairs.dtype)).flatten(-2)
    if r < x.shape[-1]:
        out = torch.cat((out, work[..., r:]), dim=-1)
    return out.to(x.dtype)


def block_exponentials(skew: Tensor, positions: Tensor) -> Tensor:
    """``exp(x_t S)`` ``(L, G, n, b, b)`` of skew-symmetric generators ``skew (G, n, b, b)`` (``G``
    head groups of ``n`` blocks of ``b`` dims) at real positions ``positions (L,)``, taken in
    float32 (float64 for float64 generators) outside autocast: LieRE's and ComRoPE's
    rotations."""
    dtype = compute_dtype(skew)
    with torch.autocast(skew.device.type, enabled=False):
        angles = positions.to(dtype)[:, None, None, None, None] * skew.to(dtype)
        return torch.linalg.matrix_exp(angles)


def rotate_blocks(x: Tensor, rotations: Tensor) -> Tensor:
    """``x (B, H, L, D)`` with each block of ``b`` dims of token ``t`` multiplied by its
    rotation of ``rotations (L, G, n, b, b)`` (``G`` 1: the same for every head)."""
    b, h, length, d = x.shape
    blocks = rotations.shape[2]
    work = x.to(rotations.dtype).reshape(b, h, length, blocks, -1)
    per_head = rotations.permute(1, 0, 2, 3, 4)  # (G, L, n, b, b)
    out = torch.einsum("hlnij,bhlnj->bhlni", per_head, work)
    return out.reshape(b, h, length, d).to(x.dtype)


@dataclass
class RotaryTables:
    """The per-forward rotation of the new tokens: complex ``(L, r/2)`` tables for queries and
    for keys (the same tensor unless the key side is scaled differently, as in xPos)."""

    q: Tensor
    k: Tensor


def rotate_heads(x: Tensor, table: Tensor, heads: int | None = None) -> Tensor:
    """:func:`rotate` on the last ``heads`` heads of ``x (B, H, L, D)`` (x-transformers'
    ``rotate_num_heads``), the others passed through unchanged; None: every head."""
    if heads is None or heads == x.shape[1]:
        return rotate(x, table)
    return torch.cat((x[:, :-heads], rotate(x[:, -heads:], table)), dim=1)


class RotaryRule(AttentionRule):
    """Rotates the new tokens' q and k with the stack's :class:`RotaryTables` before caching
    (the last ``heads`` heads only, when given); attention is then plain SDPA (the base class's
    forward)."""

    rotates_qk = True

    def __init__(self, heads: int | None = None) -> None:
        super().__init__()
        self.heads = heads

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        x: Tensor,
        positions: Tensor,
        context: RotaryTables | None = None,
    ) -> tuple[Tensor, Tensor, None]:
        """``q, k (B, H, L, D)`` rotated at ``positions (L,)`` using ``context``."""
        if context is None or context.q.shape[0] != positions.shape[0]:
            raise ValueError(
                "a rotary rule needs the stack's context built from the call's q_pos "
                f"({positions.shape[0]} positions)"
            )
        return (
            rotate_heads(q, context.q, self.heads),
            rotate_heads(k, context.k, self.heads),
            None,
        )


class RotaryStack(StackEncoding):
    """Shared machinery: one :class:`RotaryRule` per layer for self-attention, plain
    cross-attention, tables computed in :meth:`context`."""

    def self_rule(self, layer: int) -> AttentionRule:
        return RotaryRule()
