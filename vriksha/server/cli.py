"""`vriksha serve`: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from vriksha.errors import ConfigError, VrikshaError

logger = logging.getLogger(__name__)

# engine options passed through to AsyncEngine only when given (the engine's own defaults otherwise)
_ENGINE_OPTIONS = (
    "dtype",
    "device",
    "kv_cache_memory_gb",
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill_size",
    "max_model_len",
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
        "/v1/models), plus /generate on token ids, /health, /metrics, /flush_cache, /start_profile, /stop_profile.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="HF directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; 0.0.0.0 for all)"
    )
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("VRIKSHA_API_KEY"),
        help="require `Authorization: Bearer KEY` on requests (default: $VRIKSHA_API_KEY, else none)",
    )
    p.add_argument(
        "--auth-exempt",
        nargs="*",
        default=["/health", "/metrics"],
        metavar="PATH",
        help="paths that need no key when --api-key is set (default: /health /metrics; "
        "pass the flag alone to protect every path)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model name(s) requests may use; the first is reported by /v1/models "
        "(default: the model's own name)",
    )
    p.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests allowed to wait for their first token; more get 503 with Retry-After (default: 256)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds in-flight requests may run before they are aborted (default: 30)",
    )
    g = p.add_argument_group("engine")
    g.add_argument(
        "--dtype", default=None, help="weights and KV dtype, e.g. float32, bfloat16 (default: engine's)"
    )
    g.add_argument("--device", default=None, help="cpu or cuda (default: engine's choice)")
    g.add_argument(
        "--kv-cache-memory-gb", type=float, default=None, help="KV pool size in GiB (default: engine's)"
    )
    g.add_argument(
        "--max-num-seqs", type=int, default=None, help="most requests decoded at once (default: engine's)"
    )
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="tokens per forward pass (default: engine's)"
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="prompt tokens of one request per step (default: engine's)",
    )
    g.add_argument(
        "--max-model-len", type=int, default=None, help="context length limit (default: the model's)"
    )
    g.add_argument("--no-prefix-caching", action="store_true", help="disable the radix prefix cache")
    g.add_argument(
        "--no-fast-linear",
        action="store_true",
        help="skip the per-shape CPU matmul layouts (saves their copies of the weights, costs speed)",
    )
    g.add_argument(
        "--no-fast-forward",
        action="store_true",
        help="run every step through the Transformers forward instead of the engine's lean loop (Llama, Qwen2, Qwen3)",
    )
    g.add_argument(
        "--no-native-kernels",
        action="store_true",
        help="do not compile and use the engine's C kernels (CPU fp32 decode attention, linear layers); torch's only",
    )
    from vriksha.profiling import add_profile_args

    add_profile_args(p)  # --profile: scheduled capture over engine steps; --profile-dir also for /start_profile
    p.set_defaults(func=handler)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw = {name: getattr(args, name) for name in _ENGINE_OPTIONS if getattr(args, name, None) is not None}
    if getattr(args, "no_prefix_caching", False):
        kw["enable_prefix_caching"] = False
    if getattr(args, "no_fast_linear", False):
        kw["fast_linear"] = False
    if getattr(args, "no_fast_forward", False):
        kw["fast_forward"] = False
    if getattr(args, "no_native_kernels", False):
        kw["native_kernels"] = False
    return kw


def handler(args: argparse.Namespace) -> int:
    import uvicorn

    from vriksha.engine.async_engine import AsyncEngine
    from vriksha.server.app import create_app
    from vriksha.server.config import ServerConfig
    from vriksha.server.shutdown import GracefulServer

    if args.max_waiting < 0:
        raise ConfigError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    config = ServerConfig(
        served_model_names=list(args.served_model_name or []),
        api_key=args.api_key or None,
        auth_exempt=frozenset(args.auth_exempt),
        max_waiting=args.max_waiting,
        profile_dir=args.profile_dir,
        shutdown_timeout_s=args.shutdown_timeout,
    )
    from vriksha.profiling import ProfileConfig, StepProfiler

    engine = AsyncEngine(model=args.model, **engine_kwargs(args))
    step_profiler = StepProfiler(ProfileConfig.from_args(args), rank=0, name="serve")
    if step_profiler.enabled:
        engine.step_hooks.append(step_profiler.step)
        step_profiler.start()
    app = create_app(engine, config)
    state = app.state.vriksha

    def drain() -> None:
        state.admission.draining = True

    level = logging.getLogger().getEffectiveLevel()
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=max(level, logging.INFO) if level <= logging.INFO else level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=max(1, int(round(args.shutdown_timeout))),
        lifespan="on",
    )
    server = GracefulServer(uv_config, on_signal=drain)
    try:
        server.run()
    finally:
        for path in step_profiler.stop():
            logger.warning("trace: %s", path)
    if app.state.startup_error is not None:
        err = app.state.startup_error
        raise err if isinstance(err, VrikshaError) else ConfigError(f"the engine failed to start: {err}")
    if not server.started:
        raise ConfigError(
            f"the server did not start on {args.host}:{args.port}; is the port in use? pick another --port"
        )
    return 0
