"""The benchmark's markdown tables: milliseconds and ratio to the reference encoding per
encoding and length, speed-target verdicts, extra memory, failures."""

from __future__ import annotations

from typing import Any

from posenc.analysis.bench.runner import KINDS, TARGET_LENGTH, target_verdict


def markdown(result: dict[str, Any]) -> str:
    """The report's tables: milliseconds and ratio to the reference per encoding and length."""
    settings, machine, summary = result["settings"], result["machine"], result["summary"]
    reference, targets = settings["reference"], result["targets"]["max_ratio"]
    lengths = [str(length) for length in settings["lengths"]]
    n_params = f"{result['parameters'][reference]:,}" if reference in result["parameters"] else "?"
    lines = [
        "# Speed of the positional encodings",
        "",
        f"Model `{settings['model']}` ({n_params} parameters with {reference}), vocabulary "
        f"{settings['vocab_size']}, {settings['tokens']} tokens per side per training batch, "
        f"decoding {settings['decode_batch']} sources of L tokens into L tokens. "
        f"Medians of {settings['repeats']} interleaved repetitions after {settings['warmup']} "
        f"warm-up; torch {machine['torch']}, {machine['torch_threads']} threads, "
        f"{machine['cpus_available']} CPUs; load average at start {machine['load_average']}.",
        f"Each cell: milliseconds (ratio to {reference} measured in the same run).",
    ]
    for kind, title in KINDS.items():
        per_encoding = summary.get(kind, {})
        header = ["pe", *(f"L={length}" for length in lengths)]
        if kind == "train":
            header += [f"target @{TARGET_LENGTH}", "verdict"]
        lines += ["", f"## {title}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        for name, per_length in per_encoding.items():
            cells = [name]
            for length in lengths:
                figures = per_length.get(length)
                if figures is None:
                    cells.append("-")
                    continue
                ratio = figures["ratio"]
                ratio_text = f" ({ratio:.2f})" if ratio is not None else ""
                cells.append(f"{1000 * figures['median_s']:.1f}{ratio_text}")
            if kind == "train":
                target, verdict = target_verdict(name, summary, targets)
                cells += ["-" if target is None else f"<= {target:.2f}", verdict]
            lines.append("| " + " | ".join(cells) + " |")
    memory = result["memory_mb"]
    if memory:
        lines += ["", "## Extra resident memory of one training step (MB)", ""]
        lines.append("| pe | " + " | ".join(f"L={length}" for length in lengths) + " |")
        lines.append("|" + "---|" * (len(lengths) + 1))
        for name, per_length in memory.items():
            cells = [str(per_length.get(length, "-")) for length in lengths]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result["errors"]:
        lines += ["", "## Failed", ""]
        lines += [f"- {name}: {error}" for name, error in result["errors"].items()]
    return "\n".join(lines) + "\n"
