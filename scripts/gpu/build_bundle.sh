#!/usr/bin/env bash
# Build gpu_bundle/ (git-ignored): the wheels the GPU machine's image lacks, for CPython 3.12 on
# manylinux x86_64, and the data files its runs read, then print the sizes. Needs the package
# index (pip). PYTHON: whose pip downloads (default .venv/bin/python); arguments go to
# `scripts/gpu/bundle.py build` (--data DIR, default POSENC_DATA, else the fetched local mix;
# --out DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" scripts/gpu/bundle.py build --python "$PYTHON" "$@"
