"""Time the benchmark's training step in several forms, interleaved in one process, and profile
each: where ``model=base``'s step can go faster on a GPU.

Usage: ``python scripts/gpu/step_forms.py [--device cuda] [--model base] [--tokens 16384]
[--length 128] [--pe nonepe,rpe,rope] [--forms eager,bf16_weights,compiled,compiled_graphs]
[--others-form eager] [--out DIR]``. Every form trains the reference encoding's model (same
seed, same batch) as :mod:`posenc.analysis.bench.runner` does; the other encodings of ``--pe``
are timed in ``--others-form``; each median is a ratio to the first form's. The forms:

- ``eager``: the benchmark's step (bf16 autocast on a GPU, fp32 weights);
- ``bf16_weights``: the weights themselves in bf16, no autocast: an upper bound on what
  keeping weights and activations in one dtype saves (its updates are not the training
  loop's: a probe, not a training setting);
- ``compiled``: ``torch.compile(model)``, as ``trainer.compile=true``;
- ``compiled_graphs``: ``torch.compile(model, mode="reduce-overhead")``, the compiled forward
  and backward replayed as CUDA graphs (GPU only);
- ``compiled_loss_graphs``: the model and the loss compiled as one graph
  (:func:`~posenc.training.losses.summed_losses`), replayed as CUDA graphs (GPU only).

Writes ``step_forms.json`` (medians, FLOP/s against the bf16 matrix rate measured in the same
run) and ``step_forms.md`` (the table and each form's profile) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from posenc.analysis.bench.measure import counted_flops, machine_info, matmul_ceiling, timed
from posenc.analysis.bench.runner import BenchSettings, Workload, build_workload, training_batch
from posenc.training.losses import summed_losses

FORMS = ("eager", "bf16_weights", "compiled", "compiled_graphs", "compiled_loss_graphs")
GPU_ONLY = ("compiled_graphs", "compiled_loss_graphs")


def build_form(form: str, name: str, settings: BenchSettings) -> Workload:
    """Encoding ``name``'s workload in ``form`` (see the module docstring)."""
    work = build_workload(name, settings)
    if form == "bf16_weights":
        work.model.to(torch.bfloat16)
        work.amp = None
    elif form == "compiled":
        work.forward = torch.compile(work.model)
    elif form == "compiled_graphs":
        work.forward = torch.compile(work.model, mode="reduce-overhead")
    elif form == "compiled_loss_graphs":
        work.losses = torch.compile(summed_losses, mode="reduce-overhead")
    elif form != "eager":
        raise ValueError(f"unknown form {form!r}; choose from {', '.join(FORMS)}")
    return work


def profile_table(step: Callable[[], None], on_gpu: bool, steps: int = 3, rows: int = 18) -> str:
    """The operator table of ``steps`` calls of ``step``, sorted by device time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    return profiler.key_averages().table(sort_by=key, row_limit=rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", default="base")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--pe", default="nonepe,rpe,rope")
    parser.add_argument("--forms", default=",".join(FORMS[:4]))
    parser.add_argument("--others-form", default="eager", choices=FORMS)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps timed together per round")
    parser.add_argument("--out", type=Path, default=Path("outputs/step_forms"))
    args = parser.parse_args()
    names = args.pe.split(",")
    settings = BenchSettings(
        encodings=names, tokens=args.tokens, model=args.model, device=args.device
    )
    on_gpu = settings.torch_device.type == "cuda"
    forms = [f for f in args.forms.split(",") if on_gpu or f not in GPU_ONLY]
    others_form = args.others_form if on_gpu or args.others_form not in GPU_ONLY else "eager"
    batch = training_batch(max(1, args.tokens // args.length), args.length, settings)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    size = 8192 if on_gpu else 1024
    ceiling = [matmul_ceiling(size, device=settings.torch_device, dtype=dtype)]

    units: dict[str, Workload] = {}
    compile_s: dict[str, float] = {}
    reference = settings.reference
    for form in forms:
        units[f"{reference} {form}"] = build_form(form, reference, settings)
    for name in names:
        if name != reference:
            units[f"{name} {others_form}"] = build_form(others_form, name, settings)
    for label, work in units.items():
        start = time.perf_counter()
        for _ in range(args.warmup):
            work.train_step(batch)
        if on_gpu:
            torch.cuda.synchronize()
        compile_s[label] = time.perf_counter() - start
        print(f"{label}: warm-up {compile_s[label]:.1f} s", flush=True)

    samples: dict[str, list[float]] = {label: [] for label in units}
    labels = list(units)
    for r in range(args.rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            work = units[label]
            seconds = timed(lambda work=work: [work.train_step(batch) for _ in range(args.steps)])
            samples[label].append(seconds / args.steps)
    ceiling.append(matmul_ceiling(size, device=settings.torch_device, dtype=dtype))
    flops = counted_flops(lambda: build_form("eager", reference, settings).train_step(batch))
    rate = max(ceiling)
    first = f"{reference} {forms[0]}"
    base_s = statistics.median(samples[first])
    rows = []
    for label in labels:
        median = statistics.median(samples[label])
        name = label.split()[0]
        row = {
            "label": label,
            "median_s": median,
            "samples_s": samples[label],
            "warmup_s": compile_s[label],
            "of_first": median / base_s,
        }
        if name == reference:
            row["flop_s"] = flops / median
            row["of_matmul_rate"] = flops / median / rate
        rows.append(row)

    machine = machine_info(settings.torch_device)
    gpu = torch.cuda.get_device_name(0) if on_gpu else "none"
    lines = [
        f"# Training-step forms, model={args.model}, {batch[0].shape[0]} x {args.length} tokens",
        "",
        f"{gpu}; torch {torch.__version__}; {dtype} matrix rate {rate / 1e12:.0f} TFLOP/s "
        f"(an {size}^3 product before and after: "
        f"{', '.join(f'{c / 1e12:.0f}' for c in ceiling)}); step FLOPs {flops / 1e12:.2f} T "
        f"(FlopCounterMode, eager); medians of {args.rounds} interleaved rounds of "
        f"{args.steps} steps",
        "",
        f"form | step ms | of {first} | of the matrix rate | warm-up s",
        "--- | --- | --- | --- | ---",
    ]
    for row in rows:
        share = f"{row['of_matmul_rate']:.1%}" if "of_matmul_rate" in row else "-"
        lines.append(
            f"{row['label']} | {1000 * row['median_s']:.1f} | {row['of_first']:.2f}x"
            f" | {share} | {row['warmup_s']:.0f}"
        )
    table = "\n".join(lines)
    print(table, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "machine": machine,
        "gpu": gpu,
        "args": vars(args) | {"out": str(args.out)},
        "matmul_rate": ceiling,
        "flops": flops,
        "rows": rows,
    }
    (args.out / "step_forms.json").write_text(json.dumps(record, indent=1))
    parts = [table]
    (args.out / "step_forms.md").write_text("\n".join(parts) + "\n")
    for label in labels:
        work = units[label]
        parts.append(
            f"\n## Profile: {label}\n\n```\n"
            f"{profile_table(lambda work=work: work.train_step(batch), on_gpu)}\n```"
        )
        (args.out / "step_forms.md").write_text("\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
