"""Decode test sets with batched greedy search and score them.

Writes, per split, ``hypotheses.<split>.txt`` and ``references.<split>.txt`` (detokenised) into
the run directory, and ``metrics.json`` with sacreBLEU (and signature), chrF, BERTScore (model,
layer, hash), the test loss, decoding time and speed, and BLEU/loss by source-length bucket.

Standalone: ``python -m posenc.evaluate run_dir=PATH [eval.KEY=VALUE ...]``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from posenc import checkpoint
from posenc.attention_maps import example_attention, plot_attention
from posenc.data import Corpus, TokenBatcher, collate, load_corpora
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


@torch.no_grad()
def sentence_losses(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    targets: list[list[int]],
    batch_tokens: int,
    device: torch.device,
) -> tuple[list[float], list[int]]:
    """Summed teacher-forced NLL and target token count (EOS included) of every pair."""
    model.eval()
    batcher = TokenBatcher(
        [len(s) for s in sources], [len(t) for t in targets], batch_tokens, shuffle=False
    )
    nll = [0.0] * len(sources)
    count = [0] * len(sources)
    for indices in batcher.batches(0):
        src, tgt_in, tgt_out = (
            t.to(device)
            for t in collate(
                [sources[i] for i in indices],
                [targets[i] for i in indices],
                tokenizer.pad_id,
                tokenizer.bos_id,
                tokenizer.eos_id,
            )
        )
        logits = model(src, tgt_in).float()
        token_nll = F.cross_entropy(
            logits.transpose(1, 2), tgt_out, ignore_index=tokenizer.pad_id, reduction="none"
        )
        for row, i in enumerate(indices):
            nll[i] = float(token_nll[row].sum())
            count[i] = int(tgt_out[row].ne(tokenizer.pad_id).sum())
    return nll, count


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
    run_dir: Path,
    split: str,
) -> dict[str, Any]:
    """Decode and score one split; writes its hypothesis and reference files."""
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
    hypotheses = [tokenizer.decode(row) for row in ids]
    (run_dir / f"hypotheses.{split}.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    (run_dir / f"references.{split}.txt").write_text("\n".join(corpus.tgt) + "\n", encoding="utf-8")
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
        "buckets": length_buckets(
            list(eval_cfg.length_buckets),
            [len(s) + 1 for s in sources],
            hypotheses,
            corpus.tgt,
            nll,
            counts,
        ),
    }
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


def load_run_model(run_dir: Path, cfg: DictConfig, which: str, device: torch.device):
    """The tokenizer and the model of a run directory at its ``best`` or ``last`` checkpoint."""
    tokenizer = load_tokenizer(run_dir / "tokenizer")
    path = run_dir / "checkpoints" / f"{which}.pt"
    if not path.exists() and which == "best":
        path = run_dir / "checkpoints" / "last.pt"
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


def evaluate(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Evaluate ``run_dir`` on ``cfg.eval.splits``; writes and returns ``metrics.json``."""
    device = resolve_device(cfg.device)
    tokenizer, model, step, path = load_run_model(run_dir, cfg, cfg.eval.checkpoint, device)
    corpora = load_corpora(cfg.data)
    missing = [s for s in cfg.eval.splits if s not in corpora]
    if missing:
        raise ValueError(f"eval.splits names {missing}, but the data has only {sorted(corpora)}")
    bertscore = BertScore(
        cfg.eval.bertscore.model, cfg.eval.bertscore.layer, cfg.eval.bertscore.batch_size
    )
    metrics: dict[str, Any] = {
        "pe": cfg.pe.name,
        "checkpoint": str(path.name),
        "step": step,
        "splits": {},
    }
    for split in cfg.eval.splits:
        metrics["splits"][split] = evaluate_split(
            model, tokenizer, corpora[split], cfg.eval, bertscore, device, run_dir, split
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
                    run_dir,
                    f"{split}.{name}",
                )
                for split in cfg.eval.splits
            },
        }
    _save_attention_example(
        model, tokenizer, corpora[cfg.eval.splits[0]], cfg, run_dir, device, step
    )
    summary_path = run_dir / "train_summary.json"
    if summary_path.exists():
        metrics["train"] = json.loads(summary_path.read_text())
    tmp = run_dir / ".metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2))
    tmp.replace(run_dir / "metrics.json")
    return metrics


def _save_attention_example(
    model,
    tokenizer,
    corpus: Corpus,
    cfg: DictConfig,
    run_dir: Path,
    device: torch.device,
    step: int,
) -> None:
    """Layer-0 attention of the first sentence pair of ``corpus`` -> npz, PNG and TensorBoard."""
    maps = example_attention(model, tokenizer, corpus.src[0], corpus.tgt[0], device)
    np.savez_compressed(run_dir / "attention.npz", **maps)
    image = plot_attention(
        maps,
        f"{cfg.pe.name}: layer-0 attention on '{corpus.src[0][:60]}'",
        run_dir / "attention.png",
    )
    logger = RunLogger(run_dir / "tb", resume_step=step, resume_seconds=1e12)
    logger.image("attention/layer0", image, step)
    logger.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.evaluate run_dir=PATH [KEY=VALUE ...]``: overrides apply to the run's
    saved config (e.g. ``eval.use_cache=false``, ``eval.splits=[test,long]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    run_args = [a for a in args if a.startswith("run_dir=")]
    if not run_args:
        raise SystemExit("usage: python -m posenc.evaluate run_dir=PATH [eval.KEY=VALUE ...]")
    run_dir = Path(run_args[0].split("=", 1)[1]).expanduser()
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise SystemExit(f"{config_path} not found: is {run_dir} a posenc run directory?")
    overrides = [a for a in args if not a.startswith("run_dir=")]
    cfg = OmegaConf.merge(OmegaConf.load(config_path), OmegaConf.from_dotlist(overrides))
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    metrics = evaluate(cfg, run_dir)
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
