# Every target does its own set-up, so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv demo test lint docs unit bench clean

help:
	@echo "make demo   set up, then run JupyterHub with the GPU pool on simulated GPUs"
	@echo "make test   set up, then run lint, the docs build and every test"
	@echo "make bench  set up, then run the benchmarks (figures printed and saved as JSON)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

CHP := .node/node_modules/.bin/configurable-http-proxy

$(CHP):
	npm install --silent --no-audit --no-fund --prefix .node configurable-http-proxy@^4

venv: $(STAMP)

demo: $(STAMP)
	@echo "The embedded demo (JupyterHub + pool service + simulated GPUs) arrives with the spawner issue."
	@echo "Until then: $(BIN)/jupyterhub-gpupool --help"
	@$(BIN)/jupyterhub-gpupool --help

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs/source docs/build/html

unit: $(STAMP) $(CHP)
	$(BIN)/pytest tests

test: lint docs unit

bench: $(STAMP)
	$(BIN)/python benchmarks/allocator_scale.py
	$(BIN)/python benchmarks/packing.py

clean:
	rm -rf $(VENV) docs/build .pytest_cache .ruff_cache
