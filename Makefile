# Each target creates the virtual environment it needs. Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
PIP    := $(VENV)/bin/pip
UV     := VIRTUAL_ENV=$(VENV) $(VENV)/bin/uv pip
# The stamp names the hash of pyproject.toml, not its date: a fresh clone (every file dated now) or a restored CI
# cache of .venv (see .ci/run) skips the install when the dependencies did not change.
DEPS   := $(shell sha256sum pyproject.toml | cut -c1-16)
STAMP  := $(VENV)/.hybridserve-cpu-$(DEPS)
# pytest-xdist workers: JOBS for the tests that start no server, SLOW_JOBS for the server tests (0: one process).
JOBS      ?= auto
SLOW_JOBS ?= 0

.PHONY: demo test bench-plan bench-transfer clean

$(STAMP):
	rm -f $(VENV)/.hybridserve-cpu*
	$(PYTHON) -m venv $(VENV)
	# CPU torch first, with pip: pip's configuration names the wheel on disk; a plain `torch` would pull a
	# multi-GB CUDA build. Then uv for the rest: the same 169 packages as pip resolves, in 10 s instead of 29 s
	# (BENCHMARKS.md, CI). No compile step in either: the compileall step below uses every core.
	$(PIP) install -q --no-compile torch==2.13.0 uv==0.13.9
	$(UV) install -q -e '.[cpu,dev,ray]'
	# PyPI's torchaudio/torchcodec are CUDA builds that do not load beside CPU torch. A pip user keeps them (launch's
	# servers treat them as absent: core/vllm_plugin/unloadable_extensions.py); here they go, so that the tests that
	# import vLLM in-process do not meet them either.
	$(UV) uninstall -q torchaudio torchcodec || true
	# Bytecode for every installed module, written once now (281 MB of source, 23 s on 2 cores). Under
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

# Two streams at once, both run to the end. Main: the tests that start vLLM servers (`slow and not nixl_agents`),
# in one process by default: on two cores two deployments at once flaked, and with pytest-xdist 3.8
# `SLOW_JOBS=2 --dist loadgroup` split the server group across workers (CI errors), so it is not the default. Its 12
# slowest tests are listed at its end: where the loop's time goes.
# Beside it, at nice 10: the tests that start no server (on JOBS xdist workers), then the NIXL agent tests (no vLLM
# server; their own ports). The servers wait on requests more than they compute (a serial run before bytecode used
# 0.4 of the 2 cores), and the nice level keeps them first when both want a core. The side stream's output goes to
# runs/test-side.log, printed once the main stream is done.
# The side stream's torch runs one thread a process: two xdist workers (or up to six NIXL rank processes) on two
# cores, each with torch's two OpenMP threads that spin after every parallel region, spent 85 CPU-s on what takes
# 60 with one thread (no-server tests alone: 49 -> 37 s; NIXL tests: 121 -> 69 CPU-s, 74 -> 58 s). The vLLM
# servers are not in it: launch binds their threads (VLLM_CPU_OMP_THREADS_BIND).
# Files whose every test is slow: the no-server stream does not even import them (each xdist worker would import
# vLLM and NIXL for them: collection 6.3 s -> 3.3 s a process). A slow test elsewhere is still deselected by -m.
SLOW_FILES := test_validate_pd test_chaos test_bench_served test_launch_pd test_gdn_dispatch_server test_transfer_nixl test_transfer_failures \
  test_multihost_netns test_validate_random_pd test_ray_netns test_lease_probes

# First the house's import rules (pyproject.toml [tool.importlinter], docs/layout.md): a second, and a broken rule
# fails the run before any test starts.
test: $(STAMP)
	@mkdir -p runs
	$(VENV)/bin/lint-imports
	OMP_NUM_THREADS=1 nice -n 10 sh -c '$(VENV)/bin/pytest -q -m "not slow" -n $(JOBS) --dist load \
	  $(foreach f,$(SLOW_FILES),--ignore=tests/$(f).py) tests; fast=$$?; \
	  $(VENV)/bin/pytest -q -m "slow and nixl_agents" tests && exit $$fast' > runs/test-side.log 2>&1 & \
	side_pid=$$!; \
	$(VENV)/bin/pytest -q -m "slow and not nixl_agents" -n $(SLOW_JOBS) --dist loadgroup --durations=12 tests; main=$$?; \
	wait $$side_pid; side=$$?; \
	echo "== side stream (tests that start no server, then NIXL agent tests; runs/test-side.log):"; \
	cat runs/test-side.log; \
	test $$main -eq 0 -a $$side -eq 0

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
