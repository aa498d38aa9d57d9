# Every target does its own set-up, so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv demo test lint docs jest unit e2e-jh5 bench clean

help:
	@echo "make demo   set up, then run JupyterHub with the GPU pool on simulated GPUs"
	@echo "make test   set up, then run lint, the docs build and every test"
	@echo "make bench  set up, then run the benchmarks (figures printed and saved as JSON)"

DEMO_STAMP := $(VENV)/.installed-demo

# the demo needs the package and JupyterLab; the tests need everything. Quiet apart from real
# errors: setuptools' notice that an editable install uses an import finder is not one.
$(DEMO_STAMP): pyproject.toml labextension/pyproject.toml $(wildcard labextension/jupyterlab_gpupool/*.py)
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -e '.[demo]'
	@$(BIN)/python -m pip install --quiet ./labextension
	@touch $(DEMO_STAMP)

$(STAMP): pyproject.toml labextension/pyproject.toml $(wildcard labextension/jupyterlab_gpupool/*.py)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,docs,demo]'
	$(BIN)/python -m pip install --quiet ./labextension
	touch $(STAMP) $(DEMO_STAMP)

# JupyterHub 5.x (what zero-to-jupyterhub ships) for the end-to-end tests; the main venv has 6.x
JH5 := .venv-jh5
JH5_STAMP := $(JH5)/.installed

$(JH5_STAMP): pyproject.toml
	$(PYTHON) -m venv $(JH5)
	$(JH5)/bin/python -m pip install --quiet --upgrade pip
	$(JH5)/bin/python -m pip install --quiet -e . 'jupyterhub>=5.2,<6' 'jupyterlab>=4,<5' \
		pytest 'pytest-xdist>=3.5' 'psycopg[binary]>=3.1' 'jupyterhub-kubespawner>=7,<8' 'kubernetes-validate>=1.35'
	touch $(JH5_STAMP)

CHP := .node/node_modules/.bin/configurable-http-proxy

$(CHP):
	npm install --silent --no-audit --no-fund --prefix .node configurable-http-proxy@^4

# axe-core, injected into the pages of the browser tests (the lab extension's accessibility)
AXE := .node/node_modules/axe-core/axe.min.js

$(AXE):
	npm install --silent --no-audit --no-fund --prefix .node axe-core@^4

# Debian's Chromium for the browser tests (Playwright drives it; never `playwright install`)
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null || \
		(apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null); \
	else echo "no $(CHROMIUM) and not root: install Debian's chromium package for the browser tests"; fi

# Prometheus' promtool (Debian's prometheus package) checks and unit-tests the shipped alert rules
PROMTOOL := /usr/bin/promtool

$(PROMTOOL):
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q --no-install-recommends prometheus >/dev/null || \
		(apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends prometheus >/dev/null); \
	else echo "no $(PROMTOOL) and not root: install Debian's prometheus package for the alert rule tests"; fi

venv: $(STAMP)

# a second `make demo` while one runs refuses with one line (and make's own Error line)
demo: $(DEMO_STAMP) $(CHP)
	@$(BIN)/jupyterhub-gpupool demo --state-dir .demo $(DEMO_ARGS)

# the lab extension's node packages (Jest, eslint, prettier); jlpm comes with JupyterLab, the
# lock file pins the rest. Defined before lint and jest, whose prerequisites name it.
LAB_MODULES := labextension/node_modules/.yarn-state.yml

$(LAB_MODULES): labextension/package.json labextension/yarn.lock | $(STAMP)
	cd labextension && PATH="$(abspath $(BIN)):$$PATH" jlpm install --immutable

# deptry: every import of the installed code is a declared dependency of the install that
# ships it (missing, unused and transitive-only ones fail), for both distributions. mypy and
# vulture read their files and settings from pyproject.toml ([tool.mypy], [tool.vulture]).
# The front end: prettier and eslint over the lab extension's TypeScript and the service's
# browser scripts (labextension/eslint.config.mjs, from the lab's node_modules).
lint: $(STAMP) $(LAB_MODULES)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/deptry .
	cd labextension && ../$(BIN)/deptry .
	$(BIN)/mypy
	$(BIN)/vulture
	cd labextension && PATH="$(abspath $(BIN)):$$PATH" jlpm lint:check

docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs/source docs/build/html

# the lab extension's UI logic (Jest)
jest: $(STAMP) $(LAB_MODULES)
	cd labextension && PATH="$(abspath $(BIN)):$$PATH" jlpm test

# Every core runs tests (pytest-xdist): one file's tests stay on one worker, so a module's
# hub fixture starts once. Ports, folders and PostgreSQL databases are unique per test.
# `make unit PYTEST_WORKERS=0` runs them one after another in this process.
PYTEST_WORKERS ?= auto
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

unit: $(STAMP) $(CHP) $(AXE) $(CHROMIUM) $(PROMTOOL)
	$(BIN)/pytest $(XDIST) tests

e2e-jh5: $(JH5_STAMP) $(CHP)
	$(JH5)/bin/pytest -p no:cacheprovider $(XDIST) -m e2e tests/integration/test_spawn_e2e.py \
		tests/integration/test_kube_spawner.py tests/integration/test_reclaim_e2e.py \
		tests/integration/test_two_hubs.py

test: lint docs jest unit e2e-jh5

bench: $(STAMP)
	$(BIN)/python benchmarks/allocator_scale.py
	$(BIN)/python benchmarks/packing.py

clean:
	rm -rf $(VENV) $(JH5) .demo docs/build .pytest_cache .ruff_cache .mypy_cache
