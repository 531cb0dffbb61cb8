"""Pictures of what a positional encoding does (``scripts/plot_pe.py pe=NAME``).

The model is the untrained, seeded Seq2Seq of ``configs/model/MODEL.yaml`` with the encoding of
``configs/pe/NAME.yaml`` (or a trained run's checkpoint, ``--run DIR``), in eval mode. All is
read through the encoding interface, so any encoding with a config is drawn without code of its
own; a rule that declares :attr:`AttentionRule.rotates_qk` gets one extra panel. The panels:

* **input level**: the absolute table ``encoding.embed(zeros(1, L, d), arange(L))``, positions x
  dims (left out, with a note, when the encoding adds nothing to the input);
* **position only**: every position holds the same token (the first id that is not pad, BOS or
  EOS), so the layer-0 self-attention of the encoder and of the decoder
  (:meth:`MultiHeadAttention.attention_weights`) sees no content differences and shows the
  position effect alone. Drawn per head as the log-weight relative to the row's largest weight
  for one query (middle of the encoder, last of the decoder) against the distance ``i - j``
  (positive: key before the query) — for a bias encoding, the bias up to a constant — and as
  the full ``(L, L)`` weight matrix of head 0;
* **bias**: for rules whose :meth:`AttentionRule.bias` gives one, the bias per head against
  distance, for the same query and constant input (entries at or below the rule's
  :attr:`AttentionRule.masking_bias` are a mask, left out);
* **rotary**: for rules that declare :attr:`AttentionRule.rotates_qk`, ``q_i . k_j / D`` against
  ``i - j`` with ``q = k`` one fixed random vector at every position, and averaged over 512
  random vectors (the long-term decay of the rotation);
* **content**: the weights of the first four heads on an example sequence of random tokens
  (what content-dependent encodings such as CoPE, FoX and stick-breaking add shows up here;
  for the others it is the untrained model's content noise on top of the position pattern).

Beside the PNG, ``NAME.npz`` holds the plotted arrays (``H`` heads, ``L`` positions, ``d``
model width): ``positions (L,)``, ``embed_encoder``/``embed_decoder (L, d)``, and per stack
``S`` in ``encoder``/``decoder``: ``S_query ()``, ``S_distance (L,)``, ``S_logweight (H, L)``
(NaN where a key is masked or gets exactly 0), ``S_weights_constant (H, L, L)``,
``S_weights_random (H, L, L)``, ``S_tokens_random (L,)``, and where they apply
``S_bias (H, L)`` (NaN at masked keys) and ``S_rotary_score``/``S_rotary_mean (L,)``.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from posenc.config.settings import Settings
from posenc.model.attention import MultiHeadAttention, first_calls
from posenc.model.encodings.base import AttentionCall, AttentionRule, EncodingModule, StackEncoding
from posenc.model.factory import build_named_model, load_run_model, select_encodings
from posenc.model.seq2seq import Seq2Seq
from posenc.runtime.checkpoint import CheckpointError
from posenc.runtime.figures import save_figure
from posenc.runtime.rundir import RunDir
from posenc.runtime.untrusted import read_config

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
    rule object between its layers, since layer 0 runs first. The fields are filled when the
    block ends."""
    seen = Layer0Inputs()
    with first_calls(attention, attention.rule) as (attention_call, rule_call):
        yield seen
    seen.x, seen.call = attention_call.arg(0, "x"), attention_call.arg(1, "call")
    seen.q, seen.k, _, seen.state, _ = rule_call.args


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
    source: str
    constant_token: int
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
    """``x`` as a float32 numpy array."""
    return x.detach().float().cpu().numpy()


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
    """``q_query . k_j / D`` of head 0 for ``j < length`` with ``q = k`` the same vector at every
    position and head, rotated by ``rule.prepare``: for one seeded random vector, and the mean
    over :data:`ROTARY_SAMPLES` random vectors. Returns two ``(L,)`` arrays."""
    dim = encoding.d_model // encoding.n_heads
    positions = torch.arange(length)
    context = encoding.context(positions, positions)
    generator = torch.Generator().manual_seed(seed)
    vectors = torch.randn(ROTARY_SAMPLES, 1, 1, dim, generator=generator)
    qk = vectors.expand(-1, encoding.n_heads, length, -1).contiguous()  # rules may act per head
    x = torch.zeros(1, length, encoding.d_model).expand(ROTARY_SAMPLES, -1, -1)
    q, k, _ = rule.prepare(qk, qk, x, positions, context=context)
    scores = (q[:, 0, query, None, :] * k[:, 0]).sum(-1) / dim  # (N, L)
    return _numpy(scores[0]), _numpy(scores.mean(0))


def stack_view(
    stack: torch.nn.Module,
    constant: Layer0Inputs,
    random: Layer0Inputs,
    random_tokens: Tensor,
    query: int,
    seed: int,
) -> StackView:
    """The arrays of one stack (encoder or decoder) from its layer-0 inputs on constant and on
    random tokens."""
    attention, encoding = stack.layers[0].self_attn, stack.encoding
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
    bias = rule.bias(constant.q, constant.k, constant.state, constant.call)  # None: no bias
    if isinstance(bias, Tensor):
        bias = bias[0].expand(encoding.n_heads, length, length)
        row = _row_with_mask(bias, constant.call, query)
        if rule.masking_bias is not None:  # keys the head does not look at: no bias
            row = row.masked_fill(row <= rule.masking_bias, float("nan"))
        view.bias = _numpy(row)
    if rule.rotates_qk:
        view.rotary_score, view.rotary_mean = rotary_scores(rule, encoding, length, query, seed)
    return view


def _ordinary_tokens(model: Seq2Seq) -> Tensor:
    """The ids of the model's vocabulary other than pad, BOS and EOS."""
    ids = torch.arange(model.output.out_features)
    special = torch.tensor([model.pad_id, model.bos_id, model.eos_id])
    return ids[~torch.isin(ids, special)]


@torch.no_grad()
def encoding_view(
    name: str, length: int, model: Seq2Seq, seed: int = 0, source: str = "given model"
) -> EncodingView:
    """Every plotted array of encoding ``name`` on ``model`` (built with it; ``source`` says
    which model it is, for the figure's notes)."""
    model.eval()
    stacks = {"encoder": model.encoder, "decoder": model.decoder}
    positions = torch.arange(length)
    zeros = torch.zeros(1, length, model.src_embed.embedding_dim)
    tables = {
        site: _numpy(stack.encoding.embed(zeros, positions)[0]) for site, stack in stacks.items()
    }
    ordinary = _ordinary_tokens(model)
    generator = torch.Generator().manual_seed(seed)
    random_src = ordinary[torch.randint(len(ordinary), (1, length), generator=generator)]
    random_tgt = ordinary[torch.randint(len(ordinary), (1, length), generator=generator)]
    constant_tokens = torch.full((1, length), int(ordinary[0]))
    inputs: dict[str, list[Layer0Inputs]] = {"encoder": [], "decoder": []}  # constant, random
    for src, tgt in ((constant_tokens, constant_tokens), (random_src, random_tgt)):
        with (
            capture_layer0(model.encoder.layers[0].self_attn) as enc,
            capture_layer0(model.decoder.layers[0].self_attn) as dec,
        ):
            model(src, tgt)
        inputs["encoder"].append(enc)
        inputs["decoder"].append(dec)
    view = EncodingView(
        name=name,
        encoding=model.encoder.encoding,
        source=source,
        constant_token=int(ordinary[0]),
        positions=positions.numpy(),
        embed_encoder=tables["encoder"],
        embed_decoder=tables["decoder"],
    )
    queries = {"encoder": length // 2, "decoder": length - 1}
    tokens = {"encoder": random_src[0], "decoder": random_tgt[0]}
    for site, stack in stacks.items():
        view.stacks[site] = stack_view(stack, *inputs[site], tokens[site], queries[site], seed)
    return view


def _heatmap(fig: Figure, ax: Any, data: np.ndarray, title: str, weights: bool = True) -> None:
    """Draw ``data`` on ``ax``: attention weights (query x key), clipped at their 99th percentile
    so that rows holding all their weight on one key (the decoder's first) do not wash out the
    rest; or, with ``weights=False``, the input table (position x dim)."""
    if weights:
        limits = {"vmin": 0.0, "vmax": float(np.percentile(data, 99)) or None}
        xlabel, ylabel = "key j", "query i"
    else:
        limits, xlabel, ylabel = {}, "dim", "position"
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap="viridis", **limits)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)


def _curves(ax: Any, distance: np.ndarray, rows: np.ndarray, title: str, ylabel: str) -> None:
    """One line per head: ``rows (H, L)`` against ``distance (L,)``."""
    for head, row in enumerate(rows):
        ax.plot(distance, row, label=f"head {head}", linewidth=1)
    ax.set(title=title, xlabel="distance i - j (key before query > 0)", ylabel=ylabel)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.legend(fontsize=6, ncol=2)


def _notes(view: EncodingView, has_table: bool) -> str:
    """The figure's text panel: the encoding, where it applies, the model, the input."""
    lines = [
        f"pe={view.name}  ({type(view.encoding).__name__})",
        f"applies to: {view.encoding.applies_to}",
        f"encoder form: {view.encoding.encoder_form}",
        f"{view.source}; layer-0 self-attention, eval mode",
        f"constant input: token {view.constant_token} at every position (position effects only)",
    ]
    if not has_table:
        lines.append("no input-level encoding (embed adds nothing)")
    if view.flat:
        lines.append(
            "FLAT: attention gets no position information from this model (an encoding that "
            "starts at zero, like CoPE, needs training or --zero-init-std)"
        )
    width = 90 if has_table else 180  # the panel is half the figure's width beside a table
    return "\n".join(
        wrapped for line in lines for wrapped in textwrap.wrap(line, width, subsequent_indent="  ")
    )


def draw(view: EncodingView) -> Figure:
    """The figure of one encoding (see the module docstring for the panels)."""
    stacks = view.stacks
    has_table = bool(np.any(view.embed_encoder))
    has_bias = any(stack.bias is not None for stack in stacks.values())
    has_rotary = any(stack.rotary_score is not None for stack in stacks.values())
    n_rows = 4 + has_bias + has_rotary
    top = 1.0 if has_table else 0.3
    fig = Figure(figsize=(18, 3.6 * (n_rows - 1 + top)), layout="constrained")
    grid = fig.add_gridspec(n_rows, 4, height_ratios=[top] + [1.0] * (n_rows - 1))

    if has_table:
        table_ax = fig.add_subplot(grid[0, :2])
        _heatmap(fig, table_ax, view.embed_encoder, "input table embed(0, pos), encoder", False)
    notes = fig.add_subplot(grid[0, 2:] if has_table else grid[0, :])
    notes.axis("off")
    notes.text(0, 1, _notes(view, has_table), va="top", family="monospace", fontsize=9)
    row = 1

    for col, (site, stack) in enumerate(stacks.items()):
        _curves(
            fig.add_subplot(grid[row, 2 * col]),
            stack.distance,
            stack.logweight,
            f"{site}: log weight - row max, query {stack.query}",
            "log weight (relative)",
        )
        heat_ax = fig.add_subplot(grid[row, 2 * col + 1])
        _heatmap(fig, heat_ax, stack.weights_constant[0], f"{site}: head 0, constant input")
    row += 1

    if has_bias:
        for col, (site, stack) in enumerate(stacks.items()):
            ax = fig.add_subplot(grid[row, 2 * col : 2 * col + 2])
            if stack.bias is None:
                ax.axis("off")
                continue
            _curves(ax, stack.distance, stack.bias, f"{site}: bias, query {stack.query}", "bias")
        row += 1

    if has_rotary:
        for col, (site, stack) in enumerate(stacks.items()):
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

    for site, stack in stacks.items():
        for head in range(min(stack.weights_random.shape[0], HEATMAP_HEADS)):
            ax = fig.add_subplot(grid[row, head])
            _heatmap(fig, ax, stack.weights_random[head], f"{site}: head {head}, random tokens")
        row += 1
    fig.suptitle(f"What pe={view.name} does to attention (L={len(view.positions)})")
    return fig


def perturb_zero_parameters(model: Seq2Seq, std: float, seed: int) -> int:
    """Draw every all-zero parameter of the model's encodings from ``N(0, std)``; returns how
    many tensors changed. Encodings whose paper starts them at zero (CoPE's position tables)
    show nothing before training; this makes their mechanism visible on an untrained model."""
    generator = torch.Generator().manual_seed(seed)
    params = {
        id(param): param
        for module in model.modules()
        if isinstance(module, EncodingModule)
        for param in module.parameters()
    }
    changed = 0
    with torch.no_grad():
        for param in params.values():
            if not torch.any(param):
                param.copy_(torch.randn(param.shape, generator=generator) * std)
                changed += 1
    return changed


def save_view(view: EncodingView, out_dir: Path) -> tuple[Path, Path]:
    """Write ``OUT/NAME.png`` and ``OUT/NAME.npz`` for ``view``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png, npz = out_dir / f"{view.name}.png", out_dir / f"{view.name}.npz"
    save_figure(draw(view), png, dpi=80)
    np.savez_compressed(npz, **view.arrays())
    return png, npz


def plot_encoding(
    name: str,
    out_dir: Path,
    length: int = 128,
    model: str = "small",
    seed: int = 0,
    zero_init_std: float = 0.0,
) -> tuple[Path, Path]:
    """Draw encoding ``name`` on an untrained seeded model of ``configs/model/MODEL.yaml`` to
    ``OUT/NAME.png`` and save its arrays to ``OUT/NAME.npz``; with ``zero_init_std > 0``, see
    :func:`perturb_zero_parameters`."""
    seq2seq = build_named_model(name, model, seed=seed)
    source = f"untrained model '{model}', seed {seed}"
    if zero_init_std > 0:
        changed = perturb_zero_parameters(seq2seq, zero_init_std, seed)
        source += f"; {changed} zero-initialised encoding tensors ~ N(0, {zero_init_std})"
    return save_view(encoding_view(name, length, seq2seq, seed, source), out_dir)


def plot_run(
    run_dir: Path, out_dir: Path | None = None, length: int = 128, which: str = "best"
) -> tuple[Path, Path]:
    """Draw the trained encoding of a training run directory (its ``which`` checkpoint) to
    ``OUT/NAME.png`` and ``OUT/NAME.npz``, ``OUT`` defaulting to ``RUN/plots``.

    Raises:
        UntrustedFileError, DataError, CheckpointError: a file of the run is missing or not
            what posenc writes (one line naming it).
    """
    settings = Settings.of(read_config(RunDir(run_dir).config))
    _, model, step, path = load_run_model(run_dir, settings, which, torch.device("cpu"))
    source = f"trained: {path} (step {step})"
    view = encoding_view(settings.pe["name"], length, model, 0, source)
    return save_view(view, out_dir or run_dir / "plots")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``scripts/plot_pe.py``."""
    parser = argparse.ArgumentParser(
        description="Draw what a positional encoding does to a PNG and save the plotted arrays "
        "beside it as .npz: on an untrained seeded model (pe=NAME), or on a trained run "
        "(--run DIR)."
    )
    parser.add_argument(
        "pe", nargs="?", help="pe=NAME, pe=NAME1,NAME2 or pe=all (configs/pe/*.yaml)"
    )
    parser.add_argument("--run", type=Path, default=None, help="a training run directory")
    parser.add_argument("--checkpoint", choices=["best", "last"], default="best", help="with --run")
    parser.add_argument(
        "--out", type=Path, default=None, help="directory (outputs/plots; RUN/plots with --run)"
    )
    parser.add_argument("--length", type=int, default=128, help="positions L")
    parser.add_argument("--model", default="small", help="configs/model/NAME.yaml")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--zero-init-std",
        type=float,
        default=0.0,
        help="draw all-zero encoding parameters (CoPE's tables) from N(0, STD) to show their "
        "mechanism before training (default 0: the paper's initialisation)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Plot every requested encoding (or a run's); prints the files written."""
    args = parse_args(argv)
    if args.length < 2:
        print(f"plot_pe: --length={args.length} must be at least 2", file=sys.stderr)
        return 2
    if args.run is not None:
        if args.pe:
            print("plot_pe: give pe=NAME or --run DIR, not both", file=sys.stderr)
            return 2
        try:
            png, npz = plot_run(args.run, args.out, args.length, args.checkpoint)
        except (ValueError, CheckpointError) as err:  # a file of the run, named in one line
            print(f"plot_pe: {err}", file=sys.stderr)
            return 2
        print(f"{png} {npz}")
        return 0
    try:
        names = select_encodings((args.pe or "").removeprefix("pe=") or None)
    except ValueError as err:
        print(f"plot_pe: {err}", file=sys.stderr)
        return 2
    if not args.pe:
        print("plot_pe: name the encoding(s): pe=NAME, pe=a,b or pe=all", file=sys.stderr)
        return 2
    out_dir = args.out or Path("outputs/plots")
    for name in names:
        png, npz = plot_encoding(
            name, out_dir, args.length, args.model, args.seed, args.zero_init_std
        )
        print(f"{name}: {png} {npz}")
    return 0
