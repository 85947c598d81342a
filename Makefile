# AgentVM — two commands set up everything: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Re-install when the dependency list changes.
RUNTIME_STAMP := $(VENV)/.runtime-$(shell cksum pyproject.toml | cut -d' ' -f1)
DEV_STAMP := $(VENV)/.dev-$(shell cksum pyproject.toml | cut -d' ' -f1)
ARGS ?=

.PHONY: serve test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUNTIME_STAMP): $(BIN)/python
	$(BIN)/pip install --quiet -e .
	@rm -f $(VENV)/.runtime-*; touch $@

$(DEV_STAMP): $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.dev-* $(VENV)/.runtime-*; touch $@ $(RUNTIME_STAMP)

serve: $(RUNTIME_STAMP)  ## run avm serve on 127.0.0.1:8080 (data in ~/.agentvm); extra flags via ARGS=...
	$(BIN)/avm serve $(ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check shared local tests

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

unit: $(DEV_STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit  ## install dev dependencies, lint, type-check and run the whole suite

bench: $(DEV_STAMP)  ## full benchmarks; results go to docs/benchmarks.md by hand
	$(BIN)/python -m tests.bench.run $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
