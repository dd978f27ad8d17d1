# One command per intent; each runs its set-up first so it works on a fresh machine.
# `make demo` has a lean environment of its own (.venv-demo: server, UI, sample photographs, classical
# models; no torch) and needs only redis-server; everything else uses the full .venv (`make setup`).
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
DEMO_VENV  := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup setup-demo demo up test test-fast lint format bench loadtest loadtest-short clean

setup: $(STAMP)
	@bash scripts/ensure_system_deps.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch and torchvision as a matching pair first, so nothing pulls another build.
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	# Everything: the client (base), the server, UI, demo, models and export extras, and the dev tools.
	$(PIP) install -q -e '.[demo,models,export,dev]'
	# The test code (harness/, loadtest/, tests/, benchmarks/) is not in the distribution: the checkout
	# itself goes on this venv's path, so `python benchmarks/x.py` and locust find it from anywhere.
	$(PY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "hitl-checkout.pth").write_text("$(CURDIR)\n")'
	@touch $(STAMP)

# What `hitl demo` runs and nothing more: `pip install '.[demo]'` (no torch, no dev tools), redis-server.
setup-demo: $(DEMO_STAMP)
	@bash scripts/ensure_system_deps.sh demo

$(DEMO_STAMP): pyproject.toml
	@test -x $(DEMO_VENV)/bin/python || python3 -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install -q --upgrade pip
	$(DEMO_VENV)/bin/pip install -q -e '.[demo]'
	@touch $(DEMO_STAMP)

demo: setup-demo
	$(DEMO_VENV)/bin/hitl demo

up: setup
	$(VENV)/bin/hitl up

test: setup
	# Two lanes side by side: browser + Ray tests; the others, then the longest Ray modules (scripts/run_tests.sh).
	PY=$(PY) scripts/run_tests.sh $(PYTEST_ARGS)

# The quick loop: real redis-server (and the 3-node cluster), no Ray, no browser, nothing slow.
test-fast: setup
	# With bytecode caches even where the environment says PYTHONDONTWRITEBYTECODE (scripts/run_tests.sh says why).
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider -m "not ray and not browser and not slow" $(PYTEST_ARGS)

# ruff (lint + format check) and mypy (strict on statecore/ and client/, see pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Benchmarks print tables and write JSON under benchmarks/out/ (git-ignored).
bench: setup
	$(PY) benchmarks/consume_pause.py --seconds 5 --clients 50 --json benchmarks/out/consume_pause.json
	$(PY) benchmarks/e2e.py --jobs 24 --concurrency 6 --delay-ms 80 --json benchmarks/out/e2e.json
	$(PY) benchmarks/batch.py --json benchmarks/out/batch.json
	$(PY) benchmarks/bench_interventions.py --jobs 60 --json benchmarks/out/bench_interventions.json
	$(PY) benchmarks/gpu_sam.py --device cpu --tiny --json benchmarks/out/gpu_sam_cpu.json
	$(PY) benchmarks/metrics_scrape.py --json benchmarks/out/metrics_scrape.json
	$(PY) benchmarks/cutout_quality.py --json benchmarks/out/cutout_quality.json

# A fresh `hitl up --no-ui`, locust headless, the invariant checker, then
# benchmarks/bench_interventions.py against the same server (--no-bench skips it).
LOADTEST_ARGS ?= --seconds 60 --users 50
loadtest: setup
	$(PY) -m loadtest.run $(LOADTEST_ARGS)

# The short run `make test` ends its second lane with (scripts/run_tests.sh).
loadtest-short: setup
	$(PY) -m loadtest.run --seconds 20 --users 10 --no-bench

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache
