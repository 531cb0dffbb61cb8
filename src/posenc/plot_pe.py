"""Pictures of what a positional encoding does (``scripts/plot_pe.py pe=NAME``).

The model is the untrained, seeded Seq2Seq of ``configs/model/MODEL.yaml`` with the encoding of
``configs/pe/NAME.yaml``, in eval mode (no dropout). Everything is read through the encoding
interface, so any encoding with a config is drawn without code of its own:

* **input level**: the absolute table ``encoding.embed(zeros(1, L, d), arange(L))``, positions x
  dims (blank with a note when the encoding adds nothing to the input);
* **position only**: every position holds the same token, so the layer-0 self-attention of the
  encoder and of the decoder (:meth:`MultiHeadAttention.attention_weights`) sees no content
  differences and shows the position effect alone. Drawn per head as the log-weight relative to
  the row's largest weight for one query (middle of the encoder, last of the decoder) against
  the distance ``i - j`` (positive: key before the query) — for a bias encoding this is the bias
  up to a constant — and as the full ``(L, L)`` weight matrix of head 0;
* **bias**: for rules that override :meth:`AttentionRule.bias` (ALiBi, T5, KERPLE, FoX), the
  bias itself per head against distance, for the same query and constant input;
* **rotary** (rules of :mod:`posenc.encodings.rotary`): ``q_i . k_j / D`` against ``i - j`` with
  ``q = k`` one fixed random vector at every position, and averaged over 512 random vectors
  (RoFormer's long-term decay; xPos adds its decay in the decoder);
* **content**: the weights of every head on an example sequence of random tokens (what
  content-dependent encodings such as CoPE, FoX and stick-breaking add shows up here; for the
  others it shows the untrained model's content noise on top of the position pattern).

Beside the PNG, ``NAME.npz`` holds the plotted arrays (``H`` heads, ``L`` positions, ``d``
model width): ``positions (L,)``, ``embed_encoder``/``embed_decoder (L, d)``, and per stack
``S`` in ``encoder``/``decoder``: ``S_query ()``, ``S_distance (L,)``, ``S_logweight (H, L)``
(NaN where a key is masked or gets exactly 0), ``S_weights_constant (H, L, L)``,
``S_weights_random (H, L, L)``, ``S_tokens_random (L,)``, and where they apply
``S_bias (H, L)`` and ``S_rotary_score``/``S_rotary_mean (L,)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from posenc.attention import MultiHeadAttention
from posenc.catalog import build_named_model, select_encodings
from posenc.encodings.base import AttentionCall, AttentionRule, StackEncoding
from posenc.model import Seq2Seq

try:  # rotary encodings are optional: the plots work without them
    from posenc.encodings.rotary import RotaryRule
except ImportError:  # pragma: no cover
    RotaryRule = None

CONSTANT_TOKEN = 3
"""The token repeated at every position of the position-only input (the first non-special id)."""
ROTARY_SAMPLES = 512
HEATMAP_HEADS = 4


@dataclass
class Layer0Inputs:
    """What layer 0's self-attention received in one forward pass."""

    x: Tensor | None = None
    call: AttentionCall | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    state: Tensor | None = None


@contextmanager
def capture_layer0(attention: MultiHeadAttention) -> Iterator[Layer0Inputs]:
    """Record the first call of ``attention`` (its input ``x`` and call) and of its rule (the
    projected q, k and key state). The first call is layer 0's even when a stack shares one
    rule object between its layers, since layer 0 runs first."""
    seen = Layer0Inputs()

    def attention_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if seen.x is None:
            seen.x = args[0] if args else kwargs["x"]
            seen.call = args[1] if len(args) > 1 else kwargs["call"]

    def rule_hook(module: torch.nn.Module, args: tuple) -> None:
        if seen.q is None:
            seen.q, seen.k, _, seen.state, _ = args

    handles = [
        attention.register_forward_pre_hook(attention_hook, with_kwargs=True),
        attention.rule.register_forward_pre_hook(rule_hook),
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@dataclass
class StackView:
    """The arrays drawn for one stack (encoder or decoder), as numpy."""

    query: int
    distance: np.ndarray
    logweight: np.ndarray
    weights_constant: np.ndarray
    weights_random: np.ndarray
    tokens_random: np.ndarray
    bias: np.ndarray | None = None
    rotary_score: np.ndarray | None = None
    rotary_mean: np.ndarray | None = None

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The non-empty fields as ``{prefix_field: array}`` for the npz file."""
        out = {f"{prefix}_query": np.asarray(self.query)}
        for name, value in vars(self).items():
            if name != "query" and value is not None:
                out[f"{prefix}_{name}"] = value
        return out


@dataclass
class EncodingView:
    """Everything drawn for one encoding."""

    name: str
    encoding: StackEncoding
    positions: np.ndarray
    embed_encoder: np.ndarray
    embed_decoder: np.ndarray
    stacks: dict[str, StackView] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every plotted array by name (the npz content)."""
        out = {
            "positions": self.positions,
            "embed_encoder": self.embed_encoder,
            "embed_decoder": self.embed_decoder,
        }
        for prefix, stack in self.stacks.items():
            out.update(stack.arrays(prefix))
        return out

    @property
    def flat(self) -> bool:
        """True when positions change nothing: no input table and uniform attention."""
        no_table = not np.any(self.embed_encoder) and not np.any(self.embed_decoder)
        uniform = all(np.nanmax(np.abs(s.logweight)) < 1e-5 for s in self.stacks.values())
        return no_table and uniform


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def _overrides_bias(rule: AttentionRule) -> bool:
    return type(rule).bias is not AttentionRule.bias


def _row_with_mask(matrix: Tensor, call: AttentionCall, query: int) -> Tensor:
    """Row ``query`` of ``matrix (H, Lq, Lk)`` with keys the call does not allow set to NaN."""
    row = matrix[:, query].float()
    allowed = call.allowed()
    if allowed is not None:
        allowed = allowed.expand(-1, -1, matrix.shape[1], matrix.shape[2])
        row = row.masked_fill(~allowed[0, 0, query][None], float("nan"))
    return row


def rotary_scores(
    rule: AttentionRule, encoding: StackEncoding, length: int, query: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``q_query . k_j / D`` for ``j < length`` with ``q = k`` the same vector at every position,
    rotated by ``rule.prepare``: for one seeded random vector, and the mean over
    :data:`ROTARY_SAMPLES` random vectors. Returns two ``(L,)`` arrays."""
    dim = encoding.d_model // encoding.n_heads
    positions = torch.arange(length)
    context = encoding.context(positions, positions)
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(ROTARY_SAMPLES, 1, 1, dim, generator=generator)
    qk = vectors.expand(-1, -1, length, -1).contiguous()
    x = torch.zeros(1, length, encoding.d_model).expand(ROTARY_SAMPLES, -1, -1)
    q, k, _ = rule.prepare(qk, qk, x, positions, context=context)
    scores = (q[:, 0, query, None, :] * k[:, 0]).sum(-1) / dim  # (N, L)
    return _numpy(scores[0]), _numpy(scores.mean(0))


def stack_view(
    attention: MultiHeadAttention,
    encoding: StackEncoding,
    constant: Layer0Inputs,
    random: Layer0Inputs,
    random_tokens: Tensor,
    query: int,
    seed: int,
) -> StackView:
    """The arrays of one stack from its layer-0 inputs on constant and on random tokens."""
    length = constant.x.shape[1]
    weights = attention.attention_weights(constant.x, constant.call)[0].float()  # (H, L, L)
    row = _row_with_mask(weights, constant.call, query)
    log_row = torch.where(row > 0, row.log(), torch.full_like(row, float("nan")))
    best = torch.nan_to_num(log_row, nan=-torch.inf).amax(-1, keepdim=True)
    view = StackView(
        query=query,
        distance=query - np.arange(length),
        logweight=_numpy(log_row - best),
        weights_constant=_numpy(weights),
        weights_random=_numpy(attention.attention_weights(random.x, random.call)[0]),
        tokens_random=random_tokens.numpy(),
    )
    rule = attention.rule
    if _overrides_bias(rule):
        bias = rule.bias(constant.q, constant.k, constant.state, constant.call)
        if isinstance(bias, Tensor):
            bias = bias[0].expand(encoding.n_heads, length, length)
            view.bias = _numpy(_row_with_mask(bias, constant.call, query))
    if RotaryRule is not None and isinstance(rule, RotaryRule):
        view.rotary_score, view.rotary_mean = rotary_scores(rule, encoding, length, query, seed)
    return view


@torch.no_grad()
def encoding_view(name: str, length: int, model: Seq2Seq, seed: int = 0) -> EncodingView:
    """Compute every plotted array of encoding ``name`` on ``model`` (already built with it)."""
    model.eval()
    stacks = {"encoder": model.encoder, "decoder": model.decoder}
    positions = torch.arange(length)
    tables = {
        site: _numpy(
            stack.encoding.embed(torch.zeros(1, length, model.src_embed.embedding_dim), positions)[
                0
            ]
        )
        for site, stack in stacks.items()
    }
    inputs: dict[str, dict[str, Layer0Inputs]] = {}
    generator = torch.Generator().manual_seed(seed)
    random_src = torch.randint(3, model.output.out_features, (1, length), generator=generator)
    random_tgt = torch.randint(3, model.output.out_features, (1, length), generator=generator)
    constant_tokens = torch.full((1, length), CONSTANT_TOKEN)
    for kind, (src, tgt) in {
        "constant": (constant_tokens, constant_tokens),
        "random": (random_src, random_tgt),
    }.items():
        with (
            capture_layer0(model.encoder.layers[0].self_attn) as enc,
            capture_layer0(model.decoder.layers[0].self_attn) as dec,
        ):
            model(src, tgt)
        inputs[kind] = {"encoder": enc, "decoder": dec}
    view = EncodingView(
        name=name,
        encoding=model.encoder.encoding,
        positions=positions.numpy(),
        embed_encoder=tables["encoder"],
        embed_decoder=tables["decoder"],
    )
    queries = {"encoder": length // 2, "decoder": length - 1}
    tokens = {"encoder": random_src[0], "decoder": random_tgt[0]}
    for site, stack in stacks.items():
        view.stacks[site] = stack_view(
            stack.layers[0].self_attn,
            stack.encoding,
            inputs["constant"][site],
            inputs["random"][site],
            tokens[site],
            queries[site],
            seed,
        )
    return view


def _heatmap(fig: Figure, ax: Any, data: np.ndarray, title: str, xlabel: str, ylabel: str) -> None:
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)


def _curves(ax: Any, distance: np.ndarray, rows: np.ndarray, title: str, ylabel: str) -> None:
    for head, row in enumerate(rows):
        ax.plot(distance, row, label=f"head {head}", linewidth=1)
    ax.set(title=title, xlabel="distance i - j (key before query > 0)", ylabel=ylabel)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.legend(fontsize=6, ncol=2)


def draw(view: EncodingView) -> Figure:
    """The figure of one encoding (see the module docstring for the panels)."""
    enc, dec = view.stacks["encoder"], view.stacks["decoder"]
    has_bias = enc.bias is not None or dec.bias is not None
    has_rotary = enc.rotary_score is not None or dec.rotary_score is not None
    n_rows = 4 + has_bias + has_rotary
    fig = Figure(figsize=(18, 3.6 * n_rows), layout="constrained")
    grid = fig.add_gridspec(n_rows, 4)
    row = 0

    ax = fig.add_subplot(grid[row, :2])
    if np.any(view.embed_encoder):
        _heatmap(
            fig, ax, view.embed_encoder, "input table embed(0, pos), encoder", "dim", "position"
        )
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no input-level encoding (embed adds nothing)", ha="center")
    notes = fig.add_subplot(grid[row, 2:])
    notes.axis("off")
    lines = [
        f"pe={view.name}  ({type(view.encoding).__name__})",
        f"applies to: {view.encoding.applies_to}",
        f"encoder form: {view.encoding.encoder_form}",
        "untrained seeded model, layer-0 self-attention, eval mode",
        f"constant input: token {CONSTANT_TOKEN} at every position (position effects only)",
    ]
    if view.flat:
        lines.append("FLAT: this encoding gives attention no position information")
    notes.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=9)
    row += 1

    for col, (site, stack) in enumerate(view.stacks.items()):
        _curves(
            fig.add_subplot(grid[row, 2 * col]),
            stack.distance,
            stack.logweight,
            f"{site}: log weight - row max, query {stack.query}, constant input",
            "log weight (relative)",
        )
        _heatmap(
            fig,
            fig.add_subplot(grid[row, 2 * col + 1]),
            stack.weights_constant[0],
            f"{site}: weights head 0, constant input",
            "key j",
            "query i",
        )
    row += 1

    if has_bias:
        for col, (site, stack) in enumerate(view.stacks.items()):
            ax = fig.add_subplot(grid[row, 2 * col : 2 * col + 2])
            if stack.bias is None:
                ax.axis("off")
                continue
            _curves(ax, stack.distance, stack.bias, f"{site}: bias, query {stack.query}", "bias")
        row += 1

    if has_rotary:
        for col, (site, stack) in enumerate(view.stacks.items()):
            ax = fig.add_subplot(grid[row, 2 * col : 2 * col + 2])
            if stack.rotary_score is None:
                ax.axis("off")
                continue
            ax.plot(stack.distance, stack.rotary_score, label="one random q = k", linewidth=1)
            ax.plot(stack.distance, stack.rotary_mean, label=f"mean of {ROTARY_SAMPLES}")
            ax.set(
                title=f"{site}: rotated q . k / D, query {stack.query}",
                xlabel="distance i - j",
                ylabel="score",
            )
            ax.legend(fontsize=7)
        row += 1

    for site, stack in view.stacks.items():
        heads = stack.weights_random.shape[0]
        for head in range(min(heads, HEATMAP_HEADS)):
            _heatmap(
                fig,
                fig.add_subplot(grid[row, head]),
                stack.weights_random[head],
                f"{site}: weights head {head}, random tokens",
                "key j",
                "query i",
            )
        row += 1
    fig.suptitle(f"What pe={view.name} does to attention (L={len(view.positions)})")
    return fig


def plot_encoding(
    name: str, out_dir: Path, length: int = 128, model: str = "small", seed: int = 0
) -> tuple[Path, Path]:
    """Draw encoding ``name`` to ``OUT/NAME.png`` and save its arrays to ``OUT/NAME.npz``."""
    seq2seq = build_named_model(name, model, seed=seed)
    view = encoding_view(name, length, seq2seq, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, npz = out_dir / f"{name}.png", out_dir / f"{name}.npz"
    draw(view).savefig(png, dpi=80)
    np.savez_compressed(npz, **view.arrays())
    return png, npz


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``scripts/plot_pe.py``."""
    parser = argparse.ArgumentParser(
        description="Draw what a positional encoding does (untrained model) to a PNG and save "
        "the plotted arrays beside it as .npz."
    )
    parser.add_argument("pe", help="pe=NAME, pe=NAME1,NAME2 or pe=all (configs/pe/*.yaml)")
    parser.add_argument("--out", type=Path, default=Path("outputs/plots"), help="directory")
    parser.add_argument("--length", type=int, default=128, help="positions L")
    parser.add_argument("--model", default="small", help="configs/model/NAME.yaml")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Plot every requested encoding; prints the files written."""
    args = parse_args(argv)
    spec = args.pe.removeprefix("pe=")
    try:
        names = select_encodings(spec)
    except ValueError as err:
        print(f"plot_pe: {err}", file=sys.stderr)
        return 2
    if args.length < 2:
        print(f"plot_pe: --length={args.length} must be at least 2", file=sys.stderr)
        return 2
    for name in names:
        png, npz = plot_encoding(name, args.out, args.length, args.model, args.seed)
        print(f"{name}: {png} {npz}")
    return 0
