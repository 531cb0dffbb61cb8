"""The prepared corpus at scale: preparation time and memory, a run's time to its first step and
its memory, two torchrun ranks' memory, for synthetic corpora of several sizes
(:mod:`posenc.analysis.bench.corpus`). Nothing else may run meanwhile.

Usage: ``python scripts/bench_data.py [--sizes 1000000,4000000,16000000] [--ranks]``; writes
``--out`` (JSON) and a markdown table beside it.
"""

import argparse
from pathlib import Path

from posenc.analysis.bench.corpus import bench_size, write
from posenc.data.fetch import local_data_dir

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--sizes", default="1000000,4000000,16000000", help="pairs, comma-separated"
    )
    parser.add_argument("--train-sentences", type=int, default=1_000_000, help="BPE sample")
    parser.add_argument("--ranks", action="store_true", help="also two torchrun ranks")
    parser.add_argument("--threads", type=int, default=2, help="the training run's threads")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="default: POSENC_DATA, else the fetched mix"
    )
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench_data")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / "corpus.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    data_dir = args.data_dir or local_data_dir()
    results = []
    for count in sizes:
        results.append(
            bench_size(data_dir, args.work, count, args.train_sentences, args.ranks, args.threads)
        )
        settings = {k: getattr(args, k) for k in ("sizes", "train_sentences", "ranks", "threads")}
        write(results, args.out, settings)  # after every size: a long run keeps what it measured
        print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
