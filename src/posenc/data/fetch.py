"""Get the local mix (``data=local``) anywhere: download the raw originals from their pinned
public URLs, check each one's SHA-256, clean them into the mix and check every file made against
the manifest (:mod:`posenc.data.sources`, :mod:`posenc.data.cleaning`).

``posenc-data fetch [--to DIR] [--mirror URL]`` (or ``python -m posenc.data.fetch``, ``make
data``) writes the mix into ``DIR`` (default ``$POSENC_CACHE/data``, ``~/.cache/posenc/data``).
Downloading, hashing, caching and retrying are :mod:`pooch`'s: the originals are kept under
``DIR``'s sibling ``data-raw/``, each checked against its SHA-256 before use (a wrong byte, a
short read or an HTML error page is refused, naming the file, and nothing of it is used); an
interrupted fetch downloads again only what is missing. The mix is built in a temporary folder
beside ``DIR``, every file checked, then renamed into place, so ``DIR`` is either complete or
absent. A mirror that serves the same paths (``POSENC_DATA_MIRROR`` or ``--mirror``) replaces
``https://raw.githubusercontent.com/``; the tests serve their copies of the originals that way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from filelock import FileLock
from omegaconf import OmegaConf, open_dict

from posenc.config import CONFIG_DIR
from posenc.data.cleaning import RECIPES, CleaningError
from posenc.data.corpus import DataError
from posenc.data.sources import GITHUB_RAW, ORIGINALS, PRODUCTS

MIRROR_ENV = "POSENC_DATA_MIRROR"
MARKER = ".posenc-data.json"
"""Written last into a folder this module built: what it holds and where it came from."""
RETRIES = 2


class DataFetchError(DataError):
    """The mix could not be had: one line naming the file, where it would go and the way out."""


def default_target() -> Path:
    """``CACHE_DIR/data`` with ``train.yaml``'s default ``cache_dir`` (``$POSENC_CACHE``, else
    ``~/.cache/posenc``), where a run looks."""
    cache_dir = OmegaConf.load(CONFIG_DIR / "train.yaml").cache_dir
    return Path(cache_dir).expanduser() / "data"


def base_url(mirror: str | None = None) -> str:
    """Where the originals are downloaded from: ``mirror``, else ``POSENC_DATA_MIRROR``, else
    GitHub's raw host; always ending in ``/``."""
    url = mirror or os.environ.get(MIRROR_ENV) or GITHUB_RAW
    return url if url.endswith("/") else url + "/"


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds every file of the mix at its manifest size (the check a run makes
    before it reads; :func:`fetch` checks the SHA-256 of every file it writes)."""
    for product in PRODUCTS:
        path = folder / product.path
        if not path.is_file() or path.stat().st_size != product.size:
            return False
    return True


def _download(raw: Path, url: str, progress: bool) -> dict[str, bytes]:
    """Every original's bytes, downloaded into ``raw`` (or found there) and hash-checked."""
    import pooch  # only a fetch needs it
    import requests

    pooch.get_logger().setLevel("WARNING")  # a line per file would bury the one that matters
    registry = {o.path: f"sha256:{o.sha256}" for o in ORIGINALS}
    store = pooch.create(path=raw, base_url=url, registry=registry, retry_if_failed=RETRIES)
    print(
        f"posenc-data: {len(ORIGINALS)} originals ({sum(o.size for o in ORIGINALS) / 1e6:.1f} "
        f"MB) from {url}, checked into {raw}",
        file=sys.stderr,
    )
    found: dict[str, bytes] = {}
    for original in ORIGINALS:
        try:
            local = store.fetch(original.path, progressbar=progress)
        except ValueError as err:  # pooch: the downloaded file's hash is not the known one
            raise DataFetchError(
                f"{url}{original.path} is not the pinned file (its SHA-256 differs: a changed, "
                f"truncated or substituted download; {str(err).splitlines()[0]}); nothing of it "
                "was kept: try again, or point POSENC_DATA_MIRROR at a mirror that serves it"
            ) from None
        except (requests.RequestException, OSError) as err:
            raise DataFetchError(
                f"cannot download {url}{original.path} ({type(err).__name__}); the data would go "
                f"to {raw.parent / 'data'}: with no network, set POSENC_DATA to a folder holding "
                f"the local mix, or {MIRROR_ENV} to a mirror of the originals"
            ) from None
        found[original.path] = Path(local).read_bytes()
    return found


def build(originals: dict[str, bytes]) -> dict[str, bytes]:
    """Every file of the mix from the originals' bytes, each checked against the manifest.

    Raises:
        DataFetchError: a file made differs from the manifest's (the recipe or an original
            changed), or an original does not hold what its recipe expects.
    """
    made: dict[str, bytes] = {}
    for product in PRODUCTS:
        sources = [made[s] if s in made else originals[s] for s in product.sources]
        try:
            data = RECIPES[product.recipe](sources)
        except (CleaningError, UnicodeDecodeError) as err:
            raise DataFetchError(f"cannot make {product.path}: {err}") from None
        if hashlib.sha256(data).hexdigest() != product.sha256:
            raise DataFetchError(
                f"{product.path} made from the originals is not the manifest's file (SHA-256 "
                "differs); nothing was written: report it with the originals' versions"
            )
        made[product.path] = data
    return made


def fetch(target: Path | None = None, mirror: str | None = None, progress: bool = False) -> Path:
    """The local mix in ``target`` (default :func:`default_target`), downloaded, checked and
    built unless it is complete there already; returns ``target``.

    Raises:
        DataFetchError: an original could not be downloaded or is not the pinned file, a file
            made is not the manifest's, or ``target`` exists without being a mix this module
            built (nothing is written over it).
    """
    target = (target or default_target()).expanduser()
    if is_complete(target):
        return target
    if target.exists() and not (target / MARKER).is_file():
        raise DataFetchError(
            f"{target} exists but is not a complete local mix that posenc fetched; move it "
            "aside or name another folder (posenc-data fetch --to DIR)"
        )
    url = base_url(mirror)
    made = build(_download(target.parent / "data-raw", url, progress))
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    scratch.chmod(0o755)  # mkdtemp's is private to its owner
    try:
        for path, data in made.items():
            (scratch / path).parent.mkdir(parents=True, exist_ok=True)
            (scratch / path).write_bytes(data)
        marker = {"source": url, "files": {p.path: p.sha256 for p in PRODUCTS}}
        (scratch / MARKER).write_text(json.dumps(marker, indent=1))
        if target.exists():  # an incomplete mix of ours: replaced whole
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def local_mix(cache_dir: str | Path) -> Path:
    """The local mix in ``CACHE_DIR/data``, fetched there first unless complete (one process at
    a time: the jobs of a sweep wait for the first one's fetch)."""
    target = Path(cache_dir).expanduser() / "data"
    if is_complete(target):
        return target
    made = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / ".data.lock"
    try:
        with FileLock(str(lock)):
            return fetch(target, progress=sys.stderr.isatty())
    except DataFetchError:
        _tidy(target.parent, lock, made)
        raise


def _tidy(cache: Path, lock: Path, made: bool) -> None:
    """After a failed fetch, remove what it left that holds nothing: empty download folders,
    the lock, and ``cache`` itself when this fetch made it and it is empty now (originals that
    did arrive stay, for the next fetch)."""
    raw = cache / "data-raw"
    if raw.is_dir():
        for folder, _, _ in sorted(os.walk(raw), key=lambda entry: -len(entry[0])):
            with contextlib.suppress(OSError):
                Path(folder).rmdir()  # only an empty folder
    lock.unlink(missing_ok=True)
    if made:
        with contextlib.suppress(OSError):
            cache.rmdir()


def local_data_dir() -> Path:
    """The local mix a script reads when it is given no folder: ``POSENC_DATA`` when set, else
    :func:`local_mix` in the default cache (fetched there unless complete)."""
    named = os.environ.get("POSENC_DATA")
    return Path(named).expanduser() if named else local_mix(default_target().parent)


def use_local_mix(cfg: Any) -> None:
    """Give a composed config (an OmegaConf node, changed in place) with ``data=local`` and no
    ``data.dir`` (nor ``POSENC_DATA``, which sets it) the local mix in ``CACHE_DIR/data``
    (:func:`local_mix`, fetched there unless complete), so that the run's config records the
    folder it read.

    Raises:
        DataFetchError: the mix is missing and cannot be fetched (one line).
    """
    if cfg.data.get("kind") == "local" and not cfg.data.get("dir"):
        with open_dict(cfg):
            cfg.data.dir = str(local_mix(cfg.cache_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="posenc-data", description=__doc__.splitlines()[0].rstrip(":")
    )
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("fetch", help="download, check and clean the local mix")
    get.add_argument("--to", type=Path, default=None, help="default: $POSENC_CACHE/data")
    get.add_argument("--mirror", default=None, help=f"a mirror of the originals ({MIRROR_ENV})")
    args = parser.parse_args(argv)
    try:
        target = fetch(args.to, args.mirror, progress=sys.stderr.isatty())
    except DataFetchError as err:
        print(f"posenc-data: {err}", file=sys.stderr)
        return 1
    print(f"the local mix ({len(PRODUCTS)} files, checked) is in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
