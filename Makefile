PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install demo test lint bench

# torch first and pinned: the CPU build of 2.13.0 lies on this machine's disk; an unpinned torch pulls a CUDA build.
install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

demo: install
	vriksha generate --chat --prompt "Write a haiku about trees." --prompt "What is 12 + 30?" --max-tokens 64

test: install
	$(PYTHON) -m pytest -q -ra

lint:
	ruff check vriksha tests benchmarks

bench: install
	$(PYTHON) benchmarks/engine_throughput.py
