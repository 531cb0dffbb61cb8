"""The command line of ``scripts/bench.py``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from posenc.analysis.bench.peers import Peers
from posenc.analysis.bench.render import markdown
from posenc.analysis.bench.runner import BenchSettings, run
from posenc.model.factory import select_encodings


def _int_list(text: str) -> list[int]:
    """``"64,128"`` -> ``[64, 128]``."""
    return [int(item) for item in text.split(",") if item.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``scripts/bench.py``."""
    parser = argparse.ArgumentParser(
        description="Time a training step and cached greedy decoding for every encoding "
        "(configs/pe/*.yaml) and report ratios to the reference encoding measured alongside."
    )
    parser.add_argument("--pe", default=None, help="comma-separated subset (default: all)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="also an encoding with options, as a sweep overrides them (repeatable): "
        "--variant 'alibi pe.dape=true', measured as 'alibi (pe.dape=True)', the report's name",
    )
    parser.add_argument("--lengths", type=_int_list, default=None, help="default 64,128,256")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per side per batch")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds per length")
    parser.add_argument("--decode-batch", type=int, default=8, help="sources decoded at once")
    parser.add_argument("--model", default="small", help="configs/model/NAME.yaml")
    parser.add_argument("--vocab", type=int, default=8000, help="vocabulary size")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N"
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "fp32", "bf16"),
        help="of the training step: auto = bf16 autocast on CUDA, fp32 on the CPU",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="training steps through torch.compile(model), as trainer.compile=true",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also time a plain torch.nn.Transformer, the seed report's approach and "
        "x-transformers (if installed) in the same repetitions (configs/bench/peers.yaml)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a check that it works: L=64, one repetition"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/bench.json"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the markdown tables, write ``--out`` and the ``.md`` beside it."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = args.lengths or ([64] if args.quick else [64, 128, 256])
    repeats = args.repeats or (1 if args.quick else 5)
    try:
        settings = BenchSettings(
            encodings=select_encodings(args.pe),
            lengths=lengths,
            tokens=args.tokens,
            repeats=repeats,
            warmup=args.warmup,
            decode_batch=args.decode_batch,
            model=args.model,
            vocab_size=args.vocab,
            seed=args.seed,
            memory=not args.no_memory,
            variants=args.variant,
            device=args.device,
            precision=args.precision,
            compile=args.compile,
        )
        if args.peers and settings.device != "cpu":
            raise ValueError(
                f"--peers runs on the CPU only, not {settings.device}: add --device cpu"
            )
    except ValueError as err:
        print(f"bench: {err}", file=sys.stderr)
        return 2
    result = run(settings, Peers(settings) if args.peers else None)
    report = markdown(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report)
    print(report)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}", file=sys.stderr)
    return 0
