# One task runner. `make run` runs the whole system locally; `make test` runs the suite.
SHELL := /bin/bash
TOOLS := .tools
UV := $(shell command -v uv 2>/dev/null || echo $(TOOLS)/bin/uv)
PYTEST_ARGS ?=
# Trust the system certificate store (corporate proxies and mirrors put their CA there).
export UV_SYSTEM_CERTS ?= 1

.PHONY: help setup run test token lint typecheck bench mutants clean

help:
	@echo "make run    - embedded PostgreSQL + RabbitMQ + every service, logs here, Ctrl-C stops"
	@echo "make test   - install and run the whole test suite"
	@echo "make token  - mint a bearer token for local use (SUBJECT=local-user)"
	@echo "make lint / typecheck / bench"
	@echo "make mutants - break each lease/fencing guarantee in a copy, check the suite turns red"

$(TOOLS)/bin/uv:
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet uv

setup: $(if $(shell command -v uv 2>/dev/null),,$(TOOLS)/bin/uv)
	$(UV) sync --frozen

run: setup
	$(UV) run --frozen python dev/run_local.py

test: setup
	$(UV) run --frozen pytest $(PYTEST_ARGS)

token: setup
	@$(UV) run --frozen san-token $(or $(SUBJECT),local-user)

lint: setup
	$(UV) run --frozen ruff check .
	$(UV) run --frozen ruff format --check .

typecheck: setup
	$(UV) run --frozen mypy libs/common/src services/*/src

# Not part of `make test`: each mutation re-runs its catching tests in a mutated copy.
mutants: setup
	$(UV) run --frozen python -m tests.faults.mutations $(MUTANTS_ARGS)

# SAN side by side with procrastinate, pgqueuer, Celery and Dramatiq (installed from PyPI
# into .bench/peers-venv), then SAN's own ratios; BENCH_ARGS="--runs 5", "--help".
bench: setup
	UV=$(UV) $(UV) run --frozen python -m benchmarks.run $(BENCH_ARGS)

clean:
	rm -rf .venv $(TOOLS) .data .pytest_cache .mypy_cache .ruff_cache
