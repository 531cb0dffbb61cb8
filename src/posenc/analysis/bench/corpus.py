"""The prepared corpus at scale, against its targets: for synthetic corpora of several sizes,
the time and peak memory of preparing the store, the time and peak memory of a training run
that finds it prepared (to its first optimizer step), and of two torchrun ranks on it.

Synthetic corpora repeat the local training pairs, the ``k``-th repeat of a pair marked
``(k)`` on both sides so that deduplication keeps it. Each measurement is a fresh process whose
process tree is sampled from ``/proc`` every 50 ms: peak RSS of the largest process, and the
peak of the summed RSS and summed PSS (proportional set size: a shared page counted once in
all) over the processes (for torchrun, its ranks). Run nothing else meanwhile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from posenc.data.streams import pairs

ROOT = Path(__file__).resolve().parents[4]
#: the local training stems repeated into synthetic corpora, and the held-out files copied
SOURCE_STEMS = ("tatoeba-fr-en/train", "wmt14-fr-en/train/europarl-v7-sample20k")
HELD_OUT_STEMS = {"valid": "wmt14-fr-en/newstest2013", "test": "wmt14-fr-en/newstest2014"}
SAMPLE_SECONDS = 0.05


@dataclass
class Usage:
    """What one command cost: wall seconds and peak memory in MB (see the module doc)."""

    seconds: float
    peak_rss_mb: float
    peak_rss_sum_mb: float
    peak_pss_sum_mb: float
    returncode: int


@dataclass
class SizeResult:
    """The measurements at one corpus size; ``seconds_to_training``: from the training
    command's start to its log line that the model is built and the first batch is next (the
    ``first_step`` command also validates and saves after its one step). ``prepared_here``:
    the store was made by ``prepare``; when False it was found made (by an earlier call, with
    the same work folder), ``prepare`` measured only finding it, and ``pairs_per_second`` comes
    from the seconds the preparation recorded in the store's ``meta.json``."""

    pairs: int
    store_mb: float
    prepare: Usage
    first_step: Usage
    seconds_to_training: float | None
    pairs_per_second: float
    two_ranks: Usage | None = None
    meta: dict = field(default_factory=dict)
    prepared_here: bool = True


#: the training log line written when set-up is done and the first batch comes next
SET_UP_DONE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[posenc\.training\.loop\]\[INFO\] - model: "
)


def set_up_done(train_log: Path) -> float | None:
    """The time (seconds since the epoch) of the run's set-up-done line, None without one."""
    if not train_log.is_file():
        return None
    for line in train_log.read_text(encoding="utf-8", errors="replace").splitlines():
        found = SET_UP_DONE.match(line)
        if found:
            stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def synthetic_corpus(data_dir: Path, out: Path, count: int) -> str:
    """Write ``count`` distinct pairs repeating the local training pairs as ``out/big{count}.{fr,
    en}`` (plus the held-out files); returns the stem."""
    stem = f"big{count}"
    out.mkdir(parents=True, exist_ok=True)
    for stem_of_split in HELD_OUT_STEMS.values():
        for lang in ("fr", "en"):
            target = out / f"{stem_of_split}.{lang}"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((data_dir / f"{stem_of_split}.{lang}").read_bytes())
    if (out / f"{stem}.en").is_file():
        return stem
    source = [p for s in SOURCE_STEMS for p in pairs(data_dir, s, "fr", "en") if p[0] and p[1]]
    with (
        open(out / f"{stem}.fr.part", "w", encoding="utf-8") as fr,
        open(out / f"{stem}.en.part", "w", encoding="utf-8") as en,
    ):
        for i in range(count):
            repeat, (s, t) = divmod(i, len(source))[0], source[i % len(source)]
            mark = f" ({repeat})" if repeat else ""
            fr.write(f"{s}{mark}\n")
            en.write(f"{t}{mark}\n")
    for lang in ("fr", "en"):
        (out / f"{stem}.{lang}.part").rename(out / f"{stem}.{lang}")
    return stem


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in kB; zeros when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("Rss:", "Pss:"):
            values[parts[0]] = int(parts[1])
    return values.get("Rss:", 0), values.get("Pss:", 0)


def measure(command: list[str], env: dict[str, str], skip_root: bool = False) -> Usage:
    """Run ``command`` and sample its process tree's memory until it ends (``skip_root``: leave
    the launcher itself out of the sums, as for torchrun's agent). Its standard error goes to
    a temporary file, never a pipe: a pipe nobody reads while it runs fills, and the command
    (a long preparation's progress bar) blocks on it for ever."""
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        process = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr
        )
        peak = peak_rss_sum = peak_pss_sum = 0
        while process.poll() is None:
            pids = _tree(process.pid)[1 if skip_root else 0 :]
            usage = [_memory_kb(pid) for pid in pids]
            if usage:
                peak = max(peak, max(rss for rss, _ in usage))
                peak_rss_sum = max(peak_rss_sum, sum(rss for rss, _ in usage))
                peak_pss_sum = max(peak_pss_sum, sum(pss for _, pss in usage))
            time.sleep(SAMPLE_SECONDS)
        seconds = time.perf_counter() - started
        stderr.seek(0)
        errors = stderr.read()
    if process.returncode:
        print(
            f"failed ({process.returncode}): {' '.join(command)}\n{errors[-2000:]}", file=sys.stderr
        )
    return Usage(
        round(seconds, 2),
        round(peak / 1024, 1),
        round(peak_rss_sum / 1024, 1),
        round(peak_pss_sum / 1024, 1),
        process.returncode,
    )


def data_overrides(work: Path, stem: str, train_sentences: int) -> list[str]:
    """``train.py`` overrides that train on the synthetic ``stem`` in ``work``."""
    return [
        "data=local",
        f"data.dir={work}",
        f"data.train=[{stem}]",
        f"data.valid={HELD_OUT_STEMS['valid']}",
        f"data.test={HELD_OUT_STEMS['test']}",
        "~data.holdout",
        f"tokenizer.train_sentences={train_sentences}",
    ]


def bench_size(
    data_dir: Path, work: Path, count: int, train_sentences: int, ranks: bool, threads: int
) -> SizeResult:
    """Prepare, then train one step on, a synthetic corpus of ``count`` pairs."""
    stem = synthetic_corpus(data_dir, work / "corpora", count)
    env = {**os.environ, "POSENC_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1"}
    overrides = data_overrides(work / "corpora", stem, train_sentences)
    python = sys.executable
    made = set((work / "cache" / "stores").glob("*/meta.json"))
    prepare = measure([python, "-m", "posenc.data.prepare", *overrides], env)
    stores = sorted((work / "cache" / "stores").glob("*/meta.json"), key=os.path.getmtime)
    newest = [path for path in stores if path not in made]
    prepared_here = bool(newest)
    found = newest[-1] if newest else _store_of(stores, count)
    store = found.parent
    meta = json.loads(found.read_text())
    seconds = prepare.seconds if prepared_here else float(meta["seconds_total"])
    size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 2**20
    training = [
        *overrides,
        "experiment=compare",
        "trainer.max_steps=1",
        "trainer.progress=false",
        "eval.enabled=false",
        f"threads={threads}",
    ]
    run_dir = work / "runs" / f"{stem}-{time.time_ns()}"
    launched = time.time()
    first_step = measure(
        [python, "train.py", *training, f"hydra.run.dir={run_dir}", f"name={stem}"], env
    )
    done = set_up_done(run_dir / "train.log")
    to_training = None if done is None else round(done - launched, 2)
    two = None
    if ranks:
        torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        two = measure(
            [*torchrun, "train.py", *training, f"hydra.run.dir={run_dir}-ddp", "threads=1"],
            env,
            skip_root=True,
        )
    return SizeResult(
        count,
        round(size, 1),
        prepare,
        first_step,
        to_training,
        round(count / seconds),
        two,
        meta,
        prepared_here,
    )


def _store_of(stores: list[Path], count: int) -> Path:
    """The ``meta.json`` of the store made from ``count`` synthetic pairs (read, then kept)."""
    for path in stores:
        if json.loads(path.read_text()).get("pairs_read") == count:
            return path
    raise FileNotFoundError(f"no store of {count} pairs among {len(stores)}")


def markdown(results: list[SizeResult]) -> str:
    """The results as a markdown table."""
    lines = [
        "| pairs | prepare s | pairs/s | prepare peak RSS MB | store MB | run: start to first "
        "batch s | run: 1 step + validation s | run peak RSS MB | 2 ranks RSS sum MB | "
        "2 ranks PSS sum MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        two = r.two_ranks
        prepared = (
            f"{r.prepare.seconds:.1f}"
            if r.prepared_here
            else f"{r.meta.get('seconds_total')} (earlier)"
        )
        lines.append(
            f"| {r.pairs:,} | {prepared} | {r.pairs_per_second:,} | "
            f"{f'{r.prepare.peak_rss_mb:,.0f}' if r.prepared_here else 'earlier'} | "
            f"{r.store_mb:,.0f} | "
            f"{r.seconds_to_training} | "
            f"{r.first_step.seconds:.1f} | "
            f"{r.first_step.peak_rss_mb:,.0f} | "
            f"{f'{two.peak_rss_sum_mb:,.0f}' if two else ''} | "
            f"{f'{two.peak_pss_sum_mb:,.0f}' if two else ''} |"
        )
    return "\n".join(lines) + "\n"


def write(results: list[SizeResult], out: Path, settings: dict) -> None:
    """``out`` (JSON: the settings and every measurement) and a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {"settings": settings, "results": [asdict(r) for r in results]}
    out.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(markdown(results), encoding="utf-8")
