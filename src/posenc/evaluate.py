"""Decode test sets with batched greedy search and score them.

Writes, per split, ``hypotheses.<split>.txt`` and ``references.<split>.txt`` (detokenised) and
``metrics.json`` with sacreBLEU (and signature), chrF, BERTScore (model, layer, hash), the test
loss, decoding time and speed, and BLEU/loss by source-length bucket.

The evaluation that training runs goes into the run directory itself; when a continued run is
evaluated again at a later step, the earlier evaluation moves to ``RUN/evals/step=N/`` first.
A standalone evaluation, ``python -m posenc.evaluate run_dir=PATH [KEY=VALUE ...]``, composes
its overrides onto the run's saved config (typos and wrong types refused) and writes into
``RUN/evals/<overrides>,step=N/``: it never replaces what training wrote, and re-running the
same evaluation reads the one already there.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posenc import checkpoint
from posenc.attention_maps import example_attention, plot_attention
from posenc.data import Corpus, TokenBatcher, collate, eval_splits, load_corpora
from posenc.files import read_json, write_json
from posenc.losses import sentence_losses
from posenc.metrics import BertScore, bleu_chrf
from posenc.model import Seq2Seq
from posenc.tblog import RunLogger
from posenc.tokenizer import Tokenizer, load_tokenizer
from posenc.train import build_model, resolve_device

log = logging.getLogger("posenc.evaluate")


def translate(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    batch_tokens: int,
    max_len_a: float,
    max_len_b: int,
    use_cache: bool,
    device: torch.device,
) -> tuple[list[list[int]], float]:
    """Greedy translations of tokenised ``sources`` (in input order) and the seconds it took.

    Sentences are batched by length under a token budget so little compute goes to padding.
    """
    batcher = TokenBatcher(
        [len(s) for s in sources], [0] * len(sources), batch_tokens, shuffle=False
    )
    outputs: list[list[int]] = [[] for _ in sources]
    started = time.perf_counter()
    for indices in batcher.batches(0):
        src, _, _ = collate(
            [sources[i] for i in indices],
            [[] for _ in indices],
            tokenizer.pad_id,
            tokenizer.bos_id,
            tokenizer.eos_id,
        )
        rows = model.generate(src.to(device), max_len_a, max_len_b, use_cache=use_cache)
        for i, row in zip(indices, rows, strict=True):
            outputs[i] = row
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return outputs, time.perf_counter() - started


def length_buckets(
    edges: list[int],
    src_lengths: list[int],
    hypotheses: list[str],
    references: list[str],
    nll: list[float],
    counts: list[int],
) -> list[dict[str, Any]]:
    """BLEU and token loss per source-length bucket ``[edges[i], edges[i+1])`` (tokens)."""
    buckets = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        idx = [i for i, n in enumerate(src_lengths) if low <= n < high]
        if not idx:
            buckets.append({"min": low, "max": high, "sentences": 0, "bleu": None, "loss": None})
            continue
        scores = bleu_chrf([hypotheses[i] for i in idx], [references[i] for i in idx])
        loss = sum(nll[i] for i in idx) / max(sum(counts[i] for i in idx), 1)
        buckets.append(
            {
                "min": low,
                "max": high,
                "sentences": len(idx),
                "bleu": scores["bleu"],
                "loss": round(loss, 5),
            }
        )
    return buckets


def evaluate_split(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    corpus: Corpus,
    eval_cfg: DictConfig,
    bertscore: BertScore,
    device: torch.device,
    out_dir: Path,
    split: str,
) -> dict[str, Any]:
    """Decode and score one split; writes its hypothesis and reference files into
    ``out_dir``."""
    if eval_cfg.max_sentences:
        corpus = Corpus(
            corpus.name, corpus.src[: eval_cfg.max_sentences], corpus.tgt[: eval_cfg.max_sentences]
        )
    sources = tokenizer.encode_batch(corpus.src)
    targets = tokenizer.encode_batch(corpus.tgt)
    ids, seconds = translate(
        model,
        tokenizer,
        sources,
        eval_cfg.batch_tokens,
        eval_cfg.max_len_a,
        eval_cfg.max_len_b,
        eval_cfg.use_cache,
        device,
    )
    hypotheses = tokenizer.decode_batch(ids)
    (out_dir / f"hypotheses.{split}.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    (out_dir / f"references.{split}.txt").write_text("\n".join(corpus.tgt) + "\n", encoding="utf-8")
    nll, counts = sentence_losses(model, tokenizer, sources, targets, eval_cfg.batch_tokens, device)
    generated = sum(len(row) + 1 for row in ids)
    result: dict[str, Any] = {
        "sentences": len(hypotheses),
        **bleu_chrf(hypotheses, corpus.tgt),
        **bertscore(hypotheses, corpus.tgt).as_dict(),
        "loss": round(sum(nll) / max(sum(counts), 1), 5),
        "decode_seconds": round(seconds, 3),
        "decode_tokens_per_s": round(generated / max(seconds, 1e-9), 1),
        "decode_sentences_per_s": round(len(ids) / max(seconds, 1e-9), 2),
        "use_cache": bool(eval_cfg.use_cache),
        "empty_hypotheses": sum(not h.strip() for h in hypotheses),
        "buckets": length_buckets(
            list(eval_cfg.length_buckets),
            [len(s) + 1 for s in sources],
            hypotheses,
            corpus.tgt,
            nll,
            counts,
        ),
    }
    if result["empty_hypotheses"] * 2 > len(hypotheses):
        log.warning(
            "%s: %d of %d hypotheses are empty: the model does not translate yet, so its scores "
            "say little; train longer",
            split,
            result["empty_hypotheses"],
            len(hypotheses),
        )
    log.info(
        "%s: BLEU %.2f chrF %.2f BERTScore-F1 %s (%d sentences, %.1f s)",
        split,
        result["bleu"],
        result["chrf"],
        result["bertscore_f1"],
        len(ids),
        seconds,
    )
    return result


def checkpoint_path(run_dir: Path, which: str) -> Path:
    """``RUN/checkpoints/{which}.pt`` (``best`` falls back to ``last``)."""
    path = run_dir / "checkpoints" / f"{which}.pt"
    if not path.exists() and which == "best":
        path = run_dir / "checkpoints" / "last.pt"
    return path


def load_run_model(run_dir: Path, cfg: DictConfig, which: str, device: torch.device):
    """The tokenizer and the model of a run directory at its ``best`` or ``last`` checkpoint."""
    tokenizer = load_tokenizer(run_dir / "tokenizer")
    path = checkpoint_path(run_dir, which)
    payload = checkpoint.load(path)
    model = build_model(
        cfg, tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    model.load_state_dict(payload["model"])
    return tokenizer, model.to(device).eval(), payload["state"]["step"], path


def variant_model(
    cfg: DictConfig, overrides: Any, model: Seq2Seq, tokenizer: Tokenizer, device: torch.device
) -> Seq2Seq:
    """The trained ``model`` rebuilt with ``pe`` settings changed at test time (e.g. a RoPE
    scaling: ``{scaling: yarn, factor: 4}``); its weights are the trained ones."""
    variant_cfg = OmegaConf.merge(cfg, {"pe": OmegaConf.to_container(overrides)})
    variant = build_model(
        variant_cfg, tokenizer.vocab_size, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    )
    variant.load_state_dict(model.state_dict())
    return variant.to(device).eval()


EVALUATION_FILES = ("metrics.json", "hypotheses.*.txt", "references.*.txt", "attention.*")


def archive_evaluation(run_dir: Path, step: int) -> Path | None:
    """Move the run's own evaluation of another step than ``step`` to ``RUN/evals/step=N/``,
    so a continued run's new evaluation replaces nothing; returns where it went."""
    previous = read_json(run_dir / "metrics.json")
    if previous is None or previous.get("step") == step:
        return None
    target = run_dir / "evals" / f"step={previous.get('step')}"
    target.mkdir(parents=True, exist_ok=True)
    for pattern in EVALUATION_FILES:
        for path in run_dir.glob(pattern):
            path.replace(target / path.name)
    log.info("the evaluation at step %s moved to %s", previous.get("step"), target)
    return target


def evaluate(
    cfg: DictConfig, run_dir: Path, out_dir: Path | None = None, loaded: tuple | None = None
) -> dict[str, Any]:
    """Evaluate ``run_dir`` on ``cfg.eval.splits``; writes ``metrics.json`` and the other
    files into ``out_dir`` (default: the run directory, whose earlier evaluation of another step
    is archived first) and returns the metrics. ``loaded`` is :func:`load_run_model`'s answer
    when the caller has it already."""
    device = resolve_device(cfg.device)
    if loaded is None:
        loaded = load_run_model(run_dir, cfg, cfg.eval.checkpoint, device)
    tokenizer, model, step, path = loaded
    own = out_dir is None
    out_dir = run_dir if own else out_dir
    if own:
        archive_evaluation(run_dir, step)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpora = load_corpora(cfg.data, with_train=False)
    splits = eval_splits(cfg.eval.splits, corpora)
    bertscore = BertScore(
        cfg.eval.bertscore.model, cfg.eval.bertscore.layer, cfg.eval.bertscore.batch_size
    )
    metrics: dict[str, Any] = {
        "pe": cfg.pe.name,
        "checkpoint": str(path.name),
        "step": step,
        "splits": {},
    }
    for split in splits:
        metrics["splits"][split] = evaluate_split(
            model, tokenizer, corpora[split], cfg.eval, bertscore, device, out_dir, split
        )
    variants = cfg.eval.get("pe_variants") or {}
    if variants:
        metrics["variants"] = {}
    for name, overrides in variants.items():
        variant = variant_model(cfg, overrides, model, tokenizer, device)
        metrics["variants"][name] = {
            "pe": dict(overrides),
            "splits": {
                split: evaluate_split(
                    variant,
                    tokenizer,
                    corpora[split],
                    cfg.eval,
                    bertscore,
                    device,
                    out_dir,
                    f"{split}.{name}",
                )
                for split in splits
            },
        }
    _save_attention_example(
        model, tokenizer, corpora[splits[0]], cfg, out_dir, device, step, log_to=run_dir
    )
    summary = read_json(run_dir / "train_summary.json")
    if summary is not None:
        metrics["train"] = summary
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def _save_attention_example(
    model,
    tokenizer,
    corpus: Corpus,
    cfg: DictConfig,
    out_dir: Path,
    device: torch.device,
    step: int,
    log_to: Path,
) -> None:
    """Layer-0 attention of the first sentence pair of ``corpus`` -> npz and PNG in
    ``out_dir``; also to the run's TensorBoard when ``out_dir`` is the run ``log_to`` itself."""
    maps = example_attention(model, tokenizer, corpus.src[0], corpus.tgt[0], device)
    np.savez_compressed(out_dir / "attention.npz", **maps)
    image = plot_attention(
        maps,
        f"{cfg.pe.name}: layer-0 attention on '{corpus.src[0][:60]}'",
        out_dir / "attention.png",
    )
    if out_dir == log_to:
        logger = RunLogger(log_to / "tb", resume_step=step, resume_seconds=1e12)
        logger.image("attention/layer0", image, step)
        logger.close()


USAGE = "usage: python -m posenc.evaluate run_dir=PATH [KEY=VALUE ...]"


def compose_run_config(run_dir: Path, overrides: list[str]) -> DictConfig:
    """The run's saved ``config.yaml`` with ``overrides`` applied by Hydra in struct mode (an
    unknown key is refused), then the schema's type and range checks.

    Raises:
        SystemExit: with one line naming the bad override or value.
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from posenc.schema import check_types

    # eval.pe_variants is a free-form mapping (variant name -> pe settings): replaced whole.
    overrides = [f"++{o}" if o.startswith("eval.pe_variants=") else o for o in overrides]
    try:
        with initialize_config_dir(str(run_dir.resolve()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        check_types(OmegaConf.to_container(cfg, resolve=True))
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = lines[0] if lines else type(err).__name__
        cause = str(err.__cause__ or "").splitlines()
        if cause and "not in struct" in cause[0]:
            unknown = cause[0].replace("is not in struct", "is not in the run's config")
            message = f"{message.rstrip('.')}: {unknown}"
        raise SystemExit(f"posenc.evaluate: {message}") from None
    return cfg


def evaluation_dir(run_dir: Path, overrides: list[str], step: int) -> Path:
    """``RUN/evals/<overrides>,step=N``: one directory per distinct standalone evaluation."""
    items = sorted([*overrides, f"step={step}"])
    name = re.sub(r"[^\w.=,+\-{}:\[\]]", "_", ",".join(items))
    return run_dir / "evals" / name


def check_run_dir(run_dir: Path) -> None:
    """SystemExit (one line) unless ``run_dir`` is a posenc run that did not fail."""
    if not (run_dir / "config.yaml").exists():
        raise SystemExit(f"{run_dir / 'config.yaml'} not found: is {run_dir} a posenc run?")
    failed = read_json(run_dir / "failed.json")
    if failed is not None:
        raise SystemExit(
            f"{run_dir} failed ({failed.get('error')}: {failed.get('message')}); fix the cause "
            "and run its training command again"
        )


def existing_checkpoint(run_dir: Path, which: str) -> Path:
    """The checkpoint ``eval.checkpoint`` names; SystemExit (one line) when there is none."""
    path = checkpoint_path(run_dir, which)
    if not path.exists():
        raise SystemExit(
            f"{run_dir} has no checkpoint ({path.relative_to(run_dir)}); train it first"
        )
    return path


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.evaluate run_dir=PATH [KEY=VALUE ...]``: overrides apply to the run's
    saved config (e.g. ``eval.use_cache=false``, ``eval.splits=[test,long]``); the results go
    to ``RUN/evals/<overrides>,step=N/``."""
    args = list(sys.argv[1:] if argv is None else argv)
    run_args = [a for a in args if a.startswith("run_dir=")]
    if len(run_args) != 1:
        raise SystemExit(USAGE)
    run_dir = Path(run_args[0].split("=", 1)[1]).expanduser()
    overrides = [a for a in args if not a.startswith("run_dir=")]
    check_run_dir(run_dir)
    cfg = compose_run_config(run_dir, overrides)
    existing_checkpoint(run_dir, cfg.eval.checkpoint)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    loaded = load_run_model(run_dir, cfg, cfg.eval.checkpoint, resolve_device(cfg.device))
    out_dir = evaluation_dir(run_dir, overrides, loaded[2])
    metrics = read_json(out_dir / "metrics.json")
    if metrics is not None:
        log.info("%s holds this evaluation already; delete it to evaluate again", out_dir)
    else:
        metrics = evaluate(cfg, run_dir, out_dir, loaded)
        OmegaConf.save(cfg, out_dir / "eval_config.yaml")
        log.info("results in %s", out_dir)
    print(
        json.dumps(
            {
                s: {k: v for k, v in m.items() if k != "buckets"}
                for s, m in metrics["splits"].items()
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
