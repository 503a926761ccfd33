PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test lint bench

# torch first and pinned: the CPU build of 2.13.0 lies on this machine's disk; an unpinned torch pulls a CUDA build.
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

# the main job on the embedded model: a short GRPO training with held-out success before and after
demo: install
	vriksha generate --chat --prompt "What is 7 + 5?" --max-tokens 32
	vriksha train configs/grpo_demo.yaml

test: install
	$(PYTHON) -m pytest -q -ra

lint:
	ruff check vriksha tests benchmarks

bench: install
	$(PYTHON) benchmarks/engine_throughput.py
