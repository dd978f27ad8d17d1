# One command per intent; each runs `setup` first so it works on a fresh machine.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup demo up test bench loadtest loadtest-short clean

setup: $(STAMP)
	@bash scripts/ensure_system_deps.sh

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch and torchvision as a matching pair first, so nothing pulls another build.
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/hitl demo

up: setup
	$(VENV)/bin/hitl up

test: setup
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/consume_pause.py --seconds 5 --clients 50 --json benchmarks/out/consume_pause.json

loadtest: setup
	$(PY) -m loadtest.run

clean:
	rm -rf $(VENV) .pytest_cache
