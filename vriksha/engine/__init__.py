"""The serving engine: continuous batching, chunked prefill and a radix prefix cache over Transformers models.

Its rooms, and what a request meets in each (docs/engine.md, "The engine's rooms"):

- `core/`: requests, batches, the scheduler, the cache manager and radix cache, the KV pool, the sampler, the
  engine loop (`core/llm_engine.py`), the offline API (`llm.py`) and the async engine servers drive.
- `runner/`: the load (`load.py`), the flattened batch of a step, and the forward paths behind one protocol,
  assembled once at load into an ordered chain.
- `attention/`: one attention backend interface; a backend per kernel set and KV pool dtype, chosen at load.
- `platform/`: the decisions about this machine (dtype, fp32 precision, KV dtype, threads, malloc, kernel set,
  linear paths, packed weights), taken once at load into one typed plan; the native C kernels and the Triton
  kernels; dense, packed and hub-layer linear paths.
- `speculative/`, `tensor_parallel/`, `kv_transfer/`: speculative decoding, one engine on N ranks, K/V handed
  from a prefill replica to a decode replica.
- `config.py`: `EngineConfig`, whose options also build every command's flags; `cli.py`: `vriksha generate`.

Rules (tests/engine/test_engine_rules.py checks them):

1. The core imports no backend: no module of `core/` imports `platform/`, `attention/`, native kernels or
   Triton; the engine loop reaches the model only through `runner/load.py`, and receives the kernels it uses
   (the sampler's greedy pick and grammar masks) as objects chosen at load.
2. Platform decisions are made once, at load, into `platform.plan.PlatformPlan` (the runner adds its own as it
   assembles); no step decides any of them again. `vriksha generate --verbose` prints the plan; the engine
   logs it.
3. CPU and platform tuning options live in the platform section of the config (`EngineConfig.platform`, a
   `PlatformConfig`), apart from the serving options; each keeps its flag and its name in code and files.
"""
