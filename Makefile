# jobsite build / test / run plumbing.
#
#   make run     serve the embedded setup (SQLite, in-process scheduler, local backend) on 127.0.0.1:$(PORT)
#   make prod    the production topology here: PostgreSQL, Redis, web, scheduler, Celery worker+beat
#   make test    start PostgreSQL/Redis (and install Chromium) if needed, lint, then run pytest
#   make test-fast  the tests marked fast (decisions, services, rules, manifests, estimates; no process started)
#   make chaos   kill -9 the production topology's processes under 300 jobs, default timeouts: all 0 (CHAOS_ARGS: --fast)
#   make lint    ruff check
#   make venv    create .venv and install requirements.txt, and the npm packages of package.json (when changed)
#   make clean   remove var/ and caches (keeps .venv)
#
# Variables: PORT (default 8000), PYTHON (interpreter that creates the venv), PYTEST_ARGS (extra pytest args),
# TEST_DATABASE_URL, TEST_REDIS_URL.

PORT ?= 8000
PYTHON ?= python3
VENV = .venv
PYTEST_ARGS ?=

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/jobsite
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

VENV_PY = $(VENV)/bin/python
PIP = $(VENV_PY) -m pip --disable-pip-version-check
# Stamp files: touched after a successful install, so a later run installs only when a requirements file is newer.
RUNTIME_STAMP = $(VENV)/.requirements.stamp
DEV_STAMP = $(VENV)/.requirements-dev.stamp
# The browser's npm packages (xterm.js for the job's terminal), pinned by package-lock.json; served as static files.
NODE_STAMP = node_modules/.package-lock.stamp

SHELL = /bin/bash
.SHELLFLAGS = -eu -o pipefail -c
.DEFAULT_GOAL = help

.PHONY: help venv venv-dev node_modules run prod test test-fast chaos lint services clean

help:
	@sed -n 's/^#   make /make /p' $(MAKEFILE_LIST)

# --- virtual environment ---------------------------------------------------------------------------------

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

# `pip install -e .` puts the jobctl console script into .venv (packaging in pyproject.toml).
$(RUNTIME_STAMP): requirements.txt pyproject.toml | $(VENV_PY)
	$(PIP) install -r requirements.txt
	$(PIP) install --no-deps -e .
	touch $@

$(DEV_STAMP): requirements.txt requirements-dev.txt pyproject.toml | $(VENV_PY)
	$(PIP) install -r requirements-dev.txt
	$(PIP) install --no-deps -e .
	touch $@ $(RUNTIME_STAMP)

$(NODE_STAMP): package.json package-lock.json
	scripts/ensure-services.sh --npm-only
	npm ci --no-audit --no-fund
	touch $@

node_modules: $(NODE_STAMP)

venv: $(RUNTIME_STAMP) $(NODE_STAMP)

venv-dev: $(DEV_STAMP) $(NODE_STAMP)

# --- run (embedded: SQLite under var/, no PostgreSQL or Redis) --------------------------------------------

# DATABASE_URL and REDIS_URL are dropped from the environment so a leftover export cannot switch `make run`
# away from SQLite and the in-process scheduler. scripts/run_embedded.py migrates, collects static files and seeds
# in the serving process, each only when needed, so a warm start answers in a second or two.
RUN_ENV = env -u DATABASE_URL -u REDIS_URL PORT=$(PORT)

run: venv
	mkdir -p "$${JOBSITE_VAR_DIR:-var}"
	exec $(RUN_ENV) $(VENV_PY) scripts/run_embedded.py

# --- production topology on this machine (PostgreSQL, Redis, web + scheduler + Celery worker/beat) ------

prod: venv
	exec env PORT=$(PORT) scripts/run-prod.sh

# --- lint and test ---------------------------------------------------------------------------------------

lint: venv-dev
	$(VENV)/bin/ruff check .

services:
	scripts/ensure-services.sh

# Steps run in this order even under `make -j`: services, then ruff, then pytest.
test: venv-dev
	scripts/ensure-services.sh
	$(VENV)/bin/ruff check .
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' \
		$(VENV_PY) -m pytest $(PYTEST_ARGS)

# The fast lane is chosen by marker, not by a list of files: a module holds `pytestmark = pytest.mark.fast` when
# its tests are pure or service tests that start no process and no server (no subprocess, browser or sandboxed
# job); a test of such a module that does start one is marked `slow` and left out. tests/conftest.py fails a fast
# test that starts one, so a module marked fast by mistake is caught. Only the files that name the marker are
# collected (importing every test module costs seconds).
FAST_FILES = $(shell grep -rlE --include='test_*.py' 'pytest\.mark\.fast\b' tests)

test-fast: venv-dev
	scripts/ensure-services.sh --no-browser
	$(VENV)/bin/ruff check .
	DATABASE_URL='$(TEST_DATABASE_URL)' REDIS_URL='$(TEST_REDIS_URL)' \
		$(VENV_PY) -m pytest -m 'fast and not slow' $(FAST_FILES) $(PYTEST_ARGS)

# The chaos suite: PostgreSQL database jobsite_chaos (emptied) and Redis db 3 unless CHAOS_ARGS says otherwise; the
# product's default timeouts unless CHAOS_ARGS has --fast (shortened, as CI's short form in tests/e2e/test_chaos.py).
CHAOS_ARGS ?=

chaos: venv
	$(VENV_PY) scripts/chaos.py $(CHAOS_ARGS)

# --- housekeeping ----------------------------------------------------------------------------------------

clean:
	rm -rf var staticfiles test-artifacts .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -type f -name '*.pyc' -exec rm -f {} +
