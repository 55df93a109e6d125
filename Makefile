# The two commands that matter: `make demo` and `make test` (both do all set-up first).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/.venv/bin:$(PATH)
export SOLCX_BINARY_PATH := $(CURDIR)/tools/solc
export PYTHONUNBUFFERED := 1

PY := $(CURDIR)/.venv/bin/python

.PHONY: help setup demo demo-escrow up down test lint typecheck pytest compile bench-gas clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: ## install everything this project needs (idempotent)
	@bash scripts/setup.sh

compile: setup ## compile the contracts with the offline npm solc
	ape compile

demo: setup ## the whole grid on a local devnet doing real jobs, end to end
	$(PY) scripts/demo.py

up: setup ## start the whole grid and leave it running (see .run/grid/grid.json)
	$(PY) scripts/grid.py up

down: ## stop the grid `make up` started
	$(PY) scripts/grid.py down

demo-escrow: setup ## one job's on-chain life, step by step, with gas and balances
	$(PY) scripts/demo_escrow.py

test: setup lint typecheck pytest ## all set-up, then every check and test

lint: setup ## ruff
	ruff check .
	ruff format --check .

typecheck: setup ## mypy
	mypy

# Two runs: every test but the contracts' on production's eth-abi (no Ape), then the contract
# tests with Ape's plugin (tests/conftest.py says why). Each prints its slowest tests.
pytest: setup ## the test suite against real local services
	$(PY) -m pytest --durations=15 $(PYTEST_ARGS)
	@# ape-solidity may leave OpenZeppelin unpacked in contracts/.cache/ (its import cache); Ape
	@# then reads those files as project sources and loses contracts/test/'s helpers: start clean
	rm -rf contracts/.cache
	$(PY) -m pytest -p ape.pytest.plugin --durations=10 $(PYTEST_ARGS) tests/contracts

bench-gas: setup ## gas per step of a job's life (bench/gas.py)
	$(PY) bench/gas.py

clean: ## remove build outputs (keeps .venv and node_modules)
	rm -rf .build .setup-stamps .pytest_cache .mypy_cache .ruff_cache contracts/.cache
