# One task runner. `make run` runs the whole system locally; `make test` runs the suite.
SHELL := /bin/bash
TOOLS := .tools
# One uv everywhere: this version, the Dockerfile's UV_IMAGE tag and pyproject.toml's
# [tool.uv] required-version agree (tests/deploy/test_images.py checks it).
UV_VERSION := 0.13.9
# uv on PATH when it is the pinned version, else the one `make` installs into .tools/
UV := $(shell [ "$$(uv --version 2>/dev/null | cut -d' ' -f2)" = "$(UV_VERSION)" ] && command -v uv || echo $(TOOLS)/bin/uv)
UV_BOOTSTRAP := $(if $(filter $(TOOLS)/bin/uv,$(UV)),$(TOOLS)/uv-$(UV_VERSION))
PYTEST_ARGS ?=
# Trust the system certificate store (corporate proxies and mirrors put their CA there).
export UV_SYSTEM_CERTS ?= 1

.PHONY: help setup run-env run ai-check demo test token lint typecheck bench soak scaling mutants clean

help:
	@echo "make run    - embedded PostgreSQL + RabbitMQ + every service, logs here, Ctrl-C stops"
	@echo "make ai-check - check the configured AI server (strict JSON output, 1536-dim embeddings)"
	@echo "make demo   - walk the README's 'Try it' against a running 'make run'"
	@echo "make test   - install and run the whole test suite"
	@echo "make token  - mint a bearer token for local use (SUBJECT=local-user)"
	@echo "make lint / typecheck / bench / soak / scaling"
	@echo "make mutants - break each lease/fencing guarantee in a copy, check the suite turns red"

# A fresh machine has no uv: install the pinned one with the python3 it has. Errors only
# (-qq): a pip configuration's warnings (an index location that is not there) would
# otherwise stand before a failed start's one line.
$(TOOLS)/uv-$(UV_VERSION):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -qq uv==$(UV_VERSION)
	touch $@

setup: $(UV_BOOTSTRAP)
	$(UV) sync --frozen

# What running needs and nothing more: no dev group (test and lint tools). --inexact keeps
# the dev tools of an existing `make setup` environment instead of uninstalling them.
# Quiet: a failed start's one line is then the only line on stderr (uv still prints errors).
run-env: $(UV_BOOTSTRAP)
	@echo "run: installing what running needs (uv sync --frozen --no-dev)"
	@$(UV) sync --frozen --no-dev --inexact --quiet

run: run-env
	$(UV) run --frozen --no-sync python dev/run_local.py

ai-check: run-env
	@$(UV) run --frozen --no-sync san-ai-check

demo: run-env
	@$(UV) run --frozen --no-sync python dev/demo.py

test: setup
	$(UV) run --frozen pytest $(PYTEST_ARGS)

token: run-env
	@$(UV) run --frozen --no-sync san-token $(or $(SUBJECT),local-user)

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

# Every service as its own process under 100 jobs/s for 10 minutes: RSS per service
# (start, peak, end, trend), reported, not asserted; SOAK_ARGS="--minutes 1", "--help".
soak: setup
	$(UV) run --frozen python -m benchmarks.soak $(SOAK_ARGS)

# Cost curves as the tables grow (docs/scaling.md): 10k / 100k / 1M jobs, 10k / 100k cards;
# SCALING_ARGS="--cards 1000000", "--help".
scaling: setup
	$(UV) run --frozen python -m benchmarks.scaling $(SCALING_ARGS)

clean:
	rm -rf .venv $(TOOLS) .data .pytest_cache .mypy_cache .ruff_cache
