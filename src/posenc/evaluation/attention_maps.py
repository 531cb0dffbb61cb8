"""One example attention map per run: the weights of layer 0 on a test sentence, saved as
``attention.npz`` (the maps and the tokens of both sides) and ``attention.png`` in the run
directory and logged to TensorBoard. The figure labels each map's axes with the tokens the model
saw (queries down, keys across) and gives each site a colour bar of the weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import pre_tokenizers

from posenc.data.batching import collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime.figures import save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the token arrays an attention example holds beside its maps
SOURCE, TARGET = "source_tokens", "target_tokens"
TOKEN_KEYS = (SOURCE, TARGET)
#: which tokens a site's queries and keys are: (queries, keys), by the site's name
SITE_TOKENS = {"encoder": (SOURCE, SOURCE), "decoder": (TARGET, TARGET), "cross": (TARGET, SOURCE)}
#: the most tick labels on one axis (longer sentences label every k-th token)
MAX_LABELS = 40


def _byte_values() -> dict[str, int]:
    """The byte each character of a byte-level BPE piece stands for (GPT-2's mapping, which
    the ``tokenizers`` ByteLevel pre-tokenizer uses: printable bytes are themselves, the others
    shifted past 255)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    chars.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return chars


def _readable(piece: str, values: dict[str, int]) -> str:
    """A byte-level piece as text (a leading space as ``▁``); a piece that is only part of a
    character's bytes as those bytes in hex (``<C3>``)."""
    raw = bytes(values[c] for c in piece if c in values)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"<{b:02X}>" for b in raw)
    return "▁" + text[1:] if text.startswith(" ") else text


def token_labels(tokenizer: Tokenizer, text: str) -> list[str]:
    """The tokens of ``text`` as the model sees them: the tokenizer's pieces, byte-level ones
    decoded (:func:`_readable`), types the model does not know as the unknown token; the ids
    themselves if the pieces do not line up with them."""
    ids = tokenizer.encode(text)
    pieces = list(tokenizer.backend.encode(text, add_special_tokens=False).tokens)
    if len(pieces) != len(ids):
        return [str(i) for i in ids]
    if isinstance(tokenizer.backend.pre_tokenizer, pre_tokenizers.ByteLevel):
        values = _byte_values()
        pieces = [_readable(p, values) for p in pieces]
    unknown = tokenizer.specials.get("unk", "<unk>")
    return [unknown if i == tokenizer.unk_id else p for i, p in zip(ids, pieces, strict=True)]


def example_attention(
    model: Seq2Seq, tokenizer: Tokenizer, source: str, target: str, device: torch.device
) -> dict[str, np.ndarray]:
    """Layer-0 weights ``(H, Lq, Lk)`` per site (``SITE_layer0``) for one sentence pair, and
    its tokens: ``source_tokens`` (the source and EOS) and ``target_tokens`` (BOS and the
    target), the queries and keys of the maps (:data:`SITE_TOKENS`)."""
    src, tgt_in, _ = collate(
        [tokenizer.encode(source)],
        [tokenizer.encode(target)],
        tokenizer.pad_id,
        tokenizer.bos_id,
        tokenizer.eos_id,
    )
    maps = model.attention_maps(src.to(device), tgt_in.to(device))
    arrays = {f"{site}_layer0": w[0].float().cpu().numpy() for site, w in maps.items()}
    arrays[SOURCE] = np.array([*token_labels(tokenizer, source), tokenizer.specials["eos"]])
    arrays[TARGET] = np.array([tokenizer.specials["bos"], *token_labels(tokenizer, target)])
    return arrays


def site_labels(
    maps: dict[str, np.ndarray], key: str, shape: Sequence[int]
) -> tuple[list[str], list[str]]:
    """The (query, key) labels of the map ``key`` of shape ``(Lq, Lk)``: its site's tokens
    (:data:`SITE_TOKENS`), or positions where ``maps`` holds none of the right length."""
    sides = SITE_TOKENS.get(key.split("_layer")[0], (None, None))
    labels = []
    for side, length in zip(sides, shape, strict=True):
        tokens = maps.get(side) if side else None
        if tokens is not None and len(tokens) == length:
            labels.append([str(t).replace("$", r"\$") for t in tokens])
        else:
            labels.append([str(i) for i in range(length)])
    return labels[0], labels[1]


def _ticks(ax: Any, labels: Sequence[str], axis: str, show: bool) -> None:
    """Every token (every k-th past :data:`MAX_LABELS`) as a tick of ``axis``, its label
    shown when ``show``."""
    step = max(1, math.ceil(len(labels) / MAX_LABELS))
    positions = list(range(0, len(labels), step))
    text = [labels[i] for i in positions]
    if axis == "x":
        ax.set_xticks(positions, text, rotation=90, fontsize=6)
        ax.tick_params(axis="x", labelbottom=show)
    else:
        ax.set_yticks(positions, text, fontsize=6)
        ax.tick_params(axis="y", labelleft=show)


def attention_figure(maps: dict[str, np.ndarray], title: str) -> Figure:
    """Sites in rows, heads in columns: each map with its key tokens across (every panel) and
    its query tokens down (first panel of a row), one colour bar per site (weights from 0 to
    the site's 99th percentile, so one key holding a whole row does not wash out the rest)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported when drawing
    from matplotlib.figure import Figure

    sites = [k for k in maps if k not in TOKEN_KEYS]
    heads = max(maps[s].shape[0] for s in sites)
    longest = max(max(maps[s].shape[1:]) for s in sites)
    side = min(4.0, max(1.9, 0.11 * longest))
    fig = Figure(
        figsize=(side * heads + 1.8, (side + 1.0) * len(sites) + 0.4), layout="constrained"
    )
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(sites), heads, squeeze=False)
    for row, site in enumerate(sites):
        weights = maps[site]
        queries, keys = site_labels(maps, site, weights.shape[1:])
        top = float(weights.max())
        vmax = float(np.percentile(weights, 99)) or top or 1.0
        name = site.split("_layer")[0]
        for head in range(heads):
            ax = axes[row][head]
            if head >= weights.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(
                weights[head],
                cmap="viridis",
                aspect="auto",
                interpolation="nearest",
                vmin=0,
                vmax=vmax,
            )
            _ticks(ax, keys, "x", True)
            _ticks(ax, queries, "y", head == 0)
            ax.set_title(f"{name}, head {head}", fontsize=8)
            if head == 0:
                ax.set_ylabel(f"{name} query", fontsize=7)
            ax.set_xlabel("key", fontsize=7)
        fig.colorbar(
            image,
            ax=list(axes[row]),
            label="weight",
            extend="max" if top > vmax else "neither",
            fraction=0.02,
            pad=0.01,
        )
    fig.suptitle(title, fontsize=9)
    return fig


def plot_attention(maps: dict[str, np.ndarray], title: str, path: Path) -> np.ndarray:
    """Draw ``maps`` (:func:`attention_figure`) and save it to ``path``. Returns the image
    ``(H, W, 3)`` uint8."""
    fig = attention_figure(maps, title)
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    save_figure(fig, path, dpi=100)
    return image
