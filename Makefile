# Each target creates the virtual environment it needs. Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
PIP    := $(VENV)/bin/pip
# The stamp names the hash of pyproject.toml, not its date: a fresh clone (every file dated now) or a restored CI
# cache of .venv (see .ci/run) skips the install when the dependencies did not change.
DEPS   := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP  := $(VENV)/.hybridserve-cpu-$(DEPS)
# pytest-xdist workers: JOBS for the tests that start no server, SLOW_JOBS for the `slow` ones (0: one process).
JOBS      ?= auto
SLOW_JOBS ?= 0

.PHONY: demo test bench-plan bench-transfer clean

$(STAMP):
	rm -f $(VENV)/.hybridserve-cpu*
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first (the wheel on disk); a plain `torch` would pull a multi-GB CUDA build
	$(PIP) install -q --no-compile torch==2.13.0
	# --no-compile here: pip compiles package by package on one core; the compileall step below uses all of them
	$(PIP) install -q --no-compile -e '.[cpu,dev]'
	# the `nixl` import name without its dependencies: the cpu extra already holds the one NIXL build it loads
	$(PIP) install -q --no-compile --no-deps nixl==1.5.1
	# PyPI's torchaudio/torchcodec are CUDA builds that crash `import vllm` beside CPU torch
	$(PIP) uninstall -q -y torchaudio torchcodec || true
	# Bytecode for every installed module, written once now (~400 MB, ~30 s on 2 cores). Under
	# PYTHONDONTWRITEBYTECODE=1 (set on the CI box) Python never writes it on import, so each of a vLLM server's
	# processes (API server, engine core, worker) compiled vllm, torch and transformers from source again: `import
	# vllm.entrypoints.openai.api_server` took 27 s that way, 7 s with bytecode. Skipped: test folders and
	# torch/testing/_internal (one file there is Python 3.12 syntax).
	$(VENV)/bin/python -m compileall -q -j 0 -x '/tests?/|/testing/_internal/' $(VENV)/lib
	touch $(STAMP)

# The main job on the embedded default: launch P/D with the tiny model and send requests through the proxy,
# then validate one plain sync server against P/D with async scheduling (verdict and exit code).
demo: $(STAMP)
	VENV=$(VENV) scripts/demo.sh
	mkdir -p runs
	$(VENV)/bin/hybridserve validate --junit runs/validate.xml

# Two phases, both run even when the first fails. First the tests that start no server, spread over the cores.
# Then the `slow` ones (real vLLM servers, NIXL agents) in one process by default: on two cores, two at once flaked.
# SLOW_JOBS=2 runs them on two workers by xdist group (vLLM-server files on one, NIXL transfer files on the
# other); with pytest-xdist 3.8 the groups were seen split across both workers, so it is not the default.
test: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow" -n $(JOBS) --dist load tests; fast=$$?; \
	$(VENV)/bin/pytest -q -m slow -n $(SLOW_JOBS) --dist loadgroup tests; slow=$$?; \
	test $$fast -eq 0 -a $$slow -eq 0

# plan from a base-only install: no torch, nixl or vllm
bench-plan:
	$(PYTHON) -m venv .venv-plan
	.venv-plan/bin/pip install -q .
	.venv-plan/bin/python benchmarks/plan_grid.py

bench-transfer: $(STAMP)
	$(VENV)/bin/python benchmarks/transfer_dram_1gib.py
	$(VENV)/bin/python benchmarks/transfer_bench.py --memory dram --out benchmarks/results

clean:
	rm -rf $(VENV) .venv-plan build *.egg-info
