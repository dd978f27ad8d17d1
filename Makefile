# One command per intent; each runs `setup` first so it works on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo up test test-fast lint format bench loadtest loadtest-short clean

setup: $(STAMP)
	@bash scripts/ensure_system_deps.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch and torchvision as a matching pair first, so nothing pulls another build.
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	# Everything: the client (base), server, ui, models and demo extras, and the dev tools.
	$(PIP) install -q -e '.[demo,dev]'
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/hitl demo

up: setup
	$(VENV)/bin/hitl up

test: setup
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The quick loop: real redis-server (and the 3-node cluster), no Ray, no browser, nothing slow.
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not ray and not browser and not slow" $(PYTEST_ARGS)

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

# A fresh `hitl up --no-ui`, locust headless, the invariant checker, then
# benchmarks/bench_interventions.py against the same server (--no-bench skips it).
LOADTEST_ARGS ?= --seconds 60 --users 50
loadtest: setup
	$(PY) -m loadtest.run $(LOADTEST_ARGS)

# The short run CI does after the tests.
loadtest-short: setup
	$(PY) -m loadtest.run --seconds 20 --users 10 --no-bench

clean:
	rm -rf $(VENV) .pytest_cache
