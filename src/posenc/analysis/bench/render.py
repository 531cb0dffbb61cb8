"""The benchmark's markdown tables: milliseconds and ratio to the reference encoding per
encoding and length, speed-target verdicts, extra memory, failures."""

from __future__ import annotations

from typing import Any

from posenc.analysis.bench.efficiency import efficiency_lines
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
        f"{machine['cpus_available']} CPUs; load average at start {machine['load_average']}; "
        f"{_device(settings, machine)}.",
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
    lines += efficiency_lines(result)
    memory = result["memory_mb"]
    if memory:
        what = "GPU memory (allocator peak)" if machine.get("gpu") else "resident memory"
        lines += ["", f"## Extra {what} of one training step (MB)", ""]
        lines.append("| pe | " + " | ".join(f"L={length}" for length in lengths) + " |")
        lines.append("|" + "---|" * (len(lengths) + 1))
        for name, per_length in memory.items():
            cells = [str(per_length.get(length, "-")) for length in lengths]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result["errors"]:
        lines += ["", "## Failed", ""]
        lines += [f"- {name}: {error}" for name, error in result["errors"].items()]
    if result.get("peers"):
        lines += peers_table(result["peers"], lengths)
    return "\n".join(lines) + "\n"


def _device(settings: dict[str, Any], machine: dict[str, Any]) -> str:
    """Where it ran and in which precision the training step computed."""
    where = f"GPU {machine['gpu']} (CUDA {machine['cuda']})" if machine.get("gpu") else "CPU"
    precision = settings.get("precision", "fp32")
    step = "bf16 autocast" if precision == "bf16" else "fp32"
    if settings.get("compile"):
        step += ", torch.compile"
    return f"on the {where}, training steps in {step}, decoding in fp32"


def _shape(shape: dict[str, Any]) -> str:
    norm = "pre-norm" if shape["norm_first"] else "post-norm"
    return (
        f"d {shape['d_model']}, {shape['encoder_layers']}+{shape['decoder_layers']} layers, "
        f"{shape['n_heads']} heads, FFN {shape['d_ff']}, dropout {shape['dropout']}, {norm}"
    )


def _cell(figures: dict[str, Any] | None) -> str:
    if not figures or figures.get("ratio") is None:
        return "-"
    return f"{figures['ratio']:.2f} {figures.get('verdict', '-')}".removesuffix(" -")


def _ms(medians: dict[str, float]) -> str:
    return ", ".join(f"{key} {1000 * seconds:.1f} ms" for key, seconds in medians.items())


def peers_table(peers: dict[str, Any], lengths: list[str]) -> list[str]:
    """The peers' lines and their one table of ratios (see :mod:`.peers`)."""
    torch_, xt, seed = peers["torch"], peers["x_transformers"], peers["seed"]
    setting = seed["setting"]
    lines = [
        "",
        "## Peers, timed in the same repetitions",
        "",
        f"- `torch.nn.Transformer`: model `{torch_['model']}` ({_shape(torch_['shape'])}), "
        f"{torch_['positions']} positions, {torch_['parameters']:,} parameters; training step "
        f"{_ms({f'L={k}': v for k, v in torch_['median_s']['train'].items()})}.",
    ]
    if xt["installed"]:
        lines.append(
            f"- x-transformers {xt['version']}: `XTransformer` of the same shape, with each "
            "encoding's options (configs/bench/peers.yaml; all of them in the JSON)."
        )
    else:
        lines.append(f"- {xt['message']}.")
    lines.append(
        f"- The seed report's approach (re-implemented): model `{setting['model']}` "
        f"({_shape(setting['shape'])}), batches of {setting['batch']} x {setting['length']} "
        f"tokens, decoding {setting['batch']} sources into {setting['length']} tokens without a "
        f"cache; training step {_ms(seed['median_s'].get('train', {}))}; "
        f"decoding {_ms(seed['median_s'].get('decode', {}))}."
    )
    lines += [
        "",
        "Training steps: posenc's time over the peer's (targets: <= "
        f"{torch_['max_ratio']:.2f} of nn.Transformer's, <= "
        f"{peers['x_transformers'].get('max_ratio', 0.0):.2f} of x-transformers'); seed "
        "decoding: the seed's uncached time over posenc's cached (target >= "
        f"{seed['min_decode_speedup']:.1f}).",
        "",
    ]
    header = ["pe", *(f"nn.Transformer L={length}" for length in lengths)]
    if xt["installed"]:
        header += [f"x-transformers L={length}" for length in lengths]
    header += ["seed setting: train", "seed setting: decoding speed-up"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, per_length in torch_["ratios"].items():
        cells = [name, *(_cell(per_length.get(length)) for length in lengths)]
        if xt["installed"]:
            cells += [_cell(xt["ratios"].get(name, {}).get(length)) for length in lengths]
        compared = seed["ratios"].get(name, {})
        cells += [_cell(compared.get("train")), _cell(compared.get("decode_speedup"))]
        lines.append("| " + " | ".join(cells) + " |")
    for name in sorted(seed["ratios"].keys() - torch_["ratios"].keys()):
        compared = seed["ratios"][name]
        cells = [name, *["-"] * (len(header) - 3)]
        cells += [_cell(compared.get("train")), _cell(compared.get("decode_speedup"))]
        lines.append("| " + " | ".join(cells) + " |")
    if peers["errors"]:
        lines += ["", "Peers that failed:", ""]
        lines += [f"- {key}: {error}" for key, error in peers["errors"].items()]
    return lines
