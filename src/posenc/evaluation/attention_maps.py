"""One example attention map per run: the weights of layer 0 on a test sentence, saved as
``attention.npz`` and ``attention.png`` in the run directory and logged to TensorBoard."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from posenc.data.batching import collate  # noqa: E402
from posenc.data.tokenizer import Tokenizer  # noqa: E402
from posenc.model.seq2seq import Seq2Seq  # noqa: E402


def example_attention(
    model: Seq2Seq, tokenizer: Tokenizer, source: str, target: str, device: torch.device
) -> dict[str, np.ndarray]:
    """Layer-0 weights ``(H, Lq, Lk)`` per site for one sentence pair."""
    src, tgt_in, _ = collate(
        [tokenizer.encode(source)],
        [tokenizer.encode(target)],
        tokenizer.pad_id,
        tokenizer.bos_id,
        tokenizer.eos_id,
    )
    maps = model.attention_maps(src.to(device), tgt_in.to(device))
    return {f"{site}_layer0": w[0].float().cpu().numpy() for site, w in maps.items()}


def plot_attention(maps: dict[str, np.ndarray], title: str, path: Path) -> np.ndarray:
    """Heads in columns, sites in rows; saved to ``path``. Returns the image ``(H, W, 3)`` uint8."""
    sites = list(maps)
    heads = max(m.shape[0] for m in maps.values())
    fig, axes = plt.subplots(
        len(sites), heads, figsize=(1.8 * heads, 1.9 * len(sites)), squeeze=False
    )
    for row, site in enumerate(sites):
        for head in range(heads):
            ax = axes[row][head]
            ax.imshow(maps[site][head], cmap="viridis", aspect="auto", vmin=0)
            ax.set_xticks([])
            ax.set_yticks([])
            if head == 0:
                ax.set_ylabel(site.replace("_layer0", ""), fontsize=8)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return image
