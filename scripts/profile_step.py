"""Profile the benchmark's training step of some encodings (torch.profiler): where the time goes.

Usage: ``python scripts/profile_step.py --pe nonepe,rpe --model base --tokens 16384 --length 128
[--device cuda] [--out FILE]``; see :mod:`posenc.analysis.bench.profile`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posenc.analysis.bench.profile import profile_step
from posenc.analysis.bench.runner import BenchSettings
from posenc.config import reference_encoding


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pe",
        default=reference_encoding(),
        help="comma-separated encodings (default: the reference)",
    )
    parser.add_argument("--model", default="small", help="configs/model/NAME.yaml")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per side per batch")
    parser.add_argument("--length", type=int, default=128, help="tokens per sentence")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument(
        "--compile", action="store_true", help="the step through torch.compile(model)"
    )
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    names = args.pe.split(",")
    settings = BenchSettings(
        encodings=names,
        tokens=args.tokens,
        model=args.model,
        device=args.device,
        precision=args.precision,
        compile=args.compile,
    )
    parts = []
    for name in names:
        found = profile_step(settings, name, args.length, steps=args.steps)
        parts.append(
            f"## pe={name}, model={args.model}, {found['batch']} x {args.length} tokens, "
            f"{settings.device}, {settings.precision}"
            f"{', torch.compile' if settings.compile else ''}\n\n"
            f"step {1000 * found['step_s']:.1f} ms (profiled), device busy "
            f"{found['device_busy']:.0%} of it\n\n```\n{found['table']}\n```\n"
        )
    report = "\n".join(parts)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
