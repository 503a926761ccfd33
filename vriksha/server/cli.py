"""`vriksha serve`: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from vriksha.engine.config import EngineConfig
from vriksha.errors import ConfigError, VrikshaError
from vriksha.net.trust import INTERNAL_KEY_ENV, WEIGHTS_KEY_ENV, check_keys, env_key
from vriksha.server.config import ServerConfig

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/responses, "
        "/v1/models), plus /generate on token ids, /health, /metrics, /flush_cache, /start_profile, /stop_profile.",
    )
    ServerConfig.add_arguments(p, exclude=ServerConfig.internal_fields(), title="server")
    p.add_argument(
        "--auth-exempt",
        nargs="*",
        default=["/health", "/metrics"],
        metavar="PATH",
        help="paths that need no key when --api-key is set (default: /health /metrics; "
        "pass the flag alone to protect every path); never the replica-to-replica or weight endpoints",
    )
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="model name(s) requests may use; the first is reported by /v1/models "
        "(default: the model's own name)",
    )
    from vriksha.net import FrontConfig, add_flags

    add_flags(p, FrontConfig, "HTTP front (connection limits)")
    p.add_argument(
        "--allow-multiple-weight-clients",
        action="store_true",
        help="let more than one trainer update the weights (default: the first trainer's transfer is exclusive "
        "until it closes it)",
    )
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT directories: adapter_config.json + adapter_model.safetensors) served from "
        "startup, each selected by a request whose `model` is NAME; also vLLM's JSON form "
        '{"name": ..., "path": ...}; needs --enable-lora',
    )
    EngineConfig.add_arguments(p)
    k = p.add_argument_group("KV cache events (for a router)")
    k.add_argument(
        "--kv-events-endpoint",
        default=None,
        metavar="ZMQ_ENDPOINT",
        help="publish the prefix cache's changes (token-granular, see docs/router.md) on a ZMQ PUB socket "
        "bound here, e.g. tcp://127.0.0.1:5557; also enables GET /kv_events/snapshot (default: off)",
    )
    k.add_argument(
        "--kv-events-vllm-endpoint",
        default=None,
        metavar="ZMQ_ENDPOINT",
        help="also publish vLLM-format block events (BlockStored/BlockRemoved/AllBlocksCleared) here, for "
        "vllm-router's kv_aware policy (needs --kv-events-endpoint; default: off)",
    )
    k.add_argument(
        "--kv-events-block-size",
        type=int,
        default=16,
        help="tokens per block of the vLLM-format stream; pass the same to vllm-router's "
        "--kv-event-block-size (default: 16)",
    )
    from vriksha.server.kv_roles import add_arguments as add_role_arguments

    add_role_arguments(p)
    from vriksha.profiling import add_profile_args

    # --profile: scheduled capture over engine steps; --profile-dir also for /start_profile
    add_profile_args(p)
    # INFO unless --log-level says otherwise: the model, its dtype, quantization, KV pool and threads, the
    # address, and a "ready" line once it accepts requests
    p.set_defaults(func=handler, default_log_level="INFO")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The engine options given on the command line (the engine's own defaults for the rest)."""
    return EngineConfig.given_args(args)


def server_config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The server's config from `vriksha serve`'s flags (keys from the environment where no flag gives them),
    checked."""
    from vriksha.net import FrontConfig, from_args
    from vriksha.profiling import ProfileConfig

    config = ServerConfig.from_args(args)
    if config.max_waiting < 0:
        raise ConfigError(f"--max-waiting must be >= 0, got {config.max_waiting}")
    if config.max_prompt_logprobs < 0:
        raise ConfigError(f"--max-prompt-logprobs must be >= 0, got {config.max_prompt_logprobs}")
    if not 0 <= config.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {config.port}")
    if not config.shutdown_timeout_s >= 0:
        raise ConfigError(f"--shutdown-timeout must be >= 0 seconds, got {config.shutdown_timeout_s}")
    front = from_args(FrontConfig, args)
    front.validate()
    given = ServerConfig.given_args(args)
    api_key = (given["api_key"] if "api_key" in given else os.environ.get("VRIKSHA_API_KEY")) or None
    internal_key = config.internal_key or env_key(INTERNAL_KEY_ENV)
    weights_key = config.weights_key or env_key(WEIGHTS_KEY_ENV)
    check_keys(api_key, internal_key, weights_key)
    return config.replace(
        served_model_names=list(args.served_model_name or []),
        api_key=api_key,
        internal_key=internal_key,
        weights_key=weights_key,
        auth_exempt=frozenset(args.auth_exempt),
        profile_dir=ProfileConfig.from_args(args).dir,
        front=front,
        allow_multiple_weight_clients=args.allow_multiple_weight_clients,
    )


def handler(args: argparse.Namespace) -> int:
    from vriksha.engine.core.async_engine import AsyncEngine
    from vriksha.engine.core.llm_engine import LLMEngine
    from vriksha.profiling import ProfileConfig, StepProfiler
    from vriksha.server import kv_roles
    from vriksha.server.app import create_app
    from vriksha.server.routes_lora import load_at_startup, parse_lora_modules

    config = server_config_from_args(args)
    _check_events(args, config.internal_key)
    role_config = kv_roles.from_args(args, config.internal_key)
    engine_config = EngineConfig.from_args(args)
    if role_config.role != "both" and not engine_config.enable_prefix_caching:
        raise ConfigError(
            f"--role {role_config.role} needs the prefix cache; drop --no-enable-prefix-caching"
        )
    publisher = _kv_events(args, config.internal_key)
    logger.info(
        "loading %s; the server listens on %s:%d once it is loaded",
        engine_config.model or "the embedded default model",
        config.host,
        config.port,
    )
    lora_modules = parse_lora_modules(args.lora_modules or [])
    if lora_modules and not engine_config.enable_lora:
        raise ConfigError("--lora-modules needs --enable-lora")
    engine = AsyncEngine(LLMEngine(engine_config, cache_events=publisher))
    load_at_startup(engine.engine, lora_modules, config.served_model_names or [engine.engine.model_name])
    if config.load_weights_dir:
        from vriksha.weights.fs import restore_latest

        version = restore_latest(engine.engine, config.load_weights_dir)
        logger.warning("weights: version %s from %s", version, config.load_weights_dir)
    step_profiler = StepProfiler(ProfileConfig.from_args(args), rank=0, name="serve")
    if step_profiler.enabled:
        engine.step_hooks.append(step_profiler.step)
        step_profiler.start()
    roles = None if role_config.role == "both" else kv_roles.KVRoles(engine, role_config)
    app = create_app(engine, config, kv_events=publisher, kv_roles=roles)
    try:
        server = _run(app, engine, config)
    finally:
        for path in step_profiler.stop():
            logger.warning("trace: %s", path)
        if publisher is not None:
            publisher.close()
        engine.engine.close()  # a tensor-parallel engine stops its other ranks
    if engine.failure is not None:
        raise engine.failure
    if app.state.startup_error is not None:
        err = app.state.startup_error
        raise err if isinstance(err, VrikshaError) else ConfigError(f"the engine failed to start: {err}")
    if not server.started:
        raise ConfigError(
            f"the server did not start on {config.host}:{config.port}; is the port in use? pick another --port"
        )
    return 0


def _run(app: Any, engine: Any, config: ServerConfig) -> Any:
    """Serve `app` under uvicorn behind the HTTP front until a signal drains it; the server, once stopped."""
    from vriksha.net import front_config
    from vriksha.server.shutdown import CUT_GRACE_S, GracefulServer

    state = app.state.vriksha
    level = logging.getLogger().getEffectiveLevel()
    uv_config = front_config(
        app,
        config.host,
        config.port,
        config.front,
        log_level=max(level, logging.INFO) if level <= logging.INFO else level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=int(CUT_GRACE_S),
        lifespan="on",
    )
    server = GracefulServer(
        uv_config,
        config.front,
        state.drain,
        lambda: state.admission.in_flight,
        lambda: engine.failure,
        ready=f"serving {', '.join(state.model_names)} (POST /v1/chat/completions, /v1/completions, /generate; "
        "GET /v1/models)",
    )
    server.run()
    return server


def _check_events(args: argparse.Namespace, internal_key: str | None) -> None:
    """The event stream carries every cached prompt's tokens: it needs the internal key (its CURVE keys, and
    the snapshot endpoint's credential); the vLLM-format stream, which vllm-router reads without a key, may
    bind to this host only."""
    if args.kv_events_vllm_endpoint and not args.kv_events_endpoint:
        raise ConfigError("--kv-events-vllm-endpoint needs --kv-events-endpoint as well")
    if args.kv_events_block_size < 1:
        raise ConfigError(f"--kv-events-block-size must be >= 1, got {args.kv_events_block_size}")
    if args.kv_events_endpoint and not internal_key:
        raise ConfigError(
            "--kv-events-endpoint publishes the cached prompts' tokens, so it needs --internal-key (or "
            f"${INTERNAL_KEY_ENV}): only routers holding the same key can subscribe or take snapshots"
        )
    if args.kv_events_vllm_endpoint and not loopback_endpoint(args.kv_events_vllm_endpoint):
        raise ConfigError(
            f"--kv-events-vllm-endpoint {args.kv_events_vllm_endpoint}: the vLLM-format stream has no "
            "authentication (vllm-router presents no key), so it binds to this host only: "
            "tcp://127.0.0.1:PORT or ipc://PATH"
        )


def loopback_endpoint(endpoint: str) -> bool:
    """Whether a ZMQ endpoint binds to this host only (loopback TCP, ipc, inproc)."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def _kv_events(args: argparse.Namespace, internal_key: str | None) -> Any:
    """A publisher of the prefix cache's changes (the engine's cache event sink), when --kv-events-endpoint is
    given; its token stream is CURVE-keyed by the internal key."""
    if not args.kv_events_endpoint:
        return None
    from vriksha.kv_events.publisher import KVEventPublisher, PublisherConfig
    from vriksha.net.curve import CurveKeys

    assert internal_key is not None  # _check_events
    keys = CurveKeys.from_key(internal_key)
    try:
        publisher = KVEventPublisher(
            PublisherConfig(
                endpoint=args.kv_events_endpoint,
                vllm_endpoint=args.kv_events_vllm_endpoint,
                vllm_block_size=args.kv_events_block_size,
                keys=keys,
            )
        )
    except Exception as exc:  # zmq.ZMQError: address in use, bad endpoint
        raise ConfigError(
            f"cannot bind the KV events socket {args.kv_events_endpoint}: {exc}; pick a free port "
            "(tcp://127.0.0.1:PORT)"
        ) from exc
    return publisher
