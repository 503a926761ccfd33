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
from vriksha.toolcalls import PARSERS

logger = logging.getLogger(__name__)
_DEFAULTS = ServerConfig()


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
        "/v1/models), plus /generate on token ids, /health, /metrics, /flush_cache, /start_profile, /stop_profile.",
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
        "--internal-key",
        default=None,
        help="the key replicas and routers present to each other (K/V transfer, /kv_events/snapshot, the KV "
        "event stream's CURVE keys), never a client's key; needed by --role prefill|decode and "
        "--kv-events-endpoint, and the same on every replica and router of a fleet (default: "
        "$VRIKSHA_INTERNAL_KEY; prefer the variable: a flag shows in the process list)",
    )
    p.add_argument(
        "--weights-key",
        default=None,
        help="the key trainers present to update the weights, pause and resume generation, and reset the "
        "prefix cache; without it those endpoints are closed (default: $VRIKSHA_WEIGHTS_KEY)",
    )
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
    p.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="sequences (prompts x n) allowed to wait for their first token; more get 503 with Retry-After, "
        "and a request that alone asks for more gets 400 (default: 256)",
    )
    p.add_argument(
        "--max-prompt-logprobs",
        type=int,
        default=_DEFAULTS.max_prompt_logprobs,
        metavar="N",
        help="prompt log-probabilities one request may ask for (prompt tokens x (prompt_logprobs + 1), in each "
        f"choice that returns them); more get 400 (default: {_DEFAULTS.max_prompt_logprobs})",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds in-flight requests may run before they are answered with 503 (or an error "
        "event in a stream) and aborted; meanwhile /health says draining (default: 30)",
    )
    p.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(PARSERS),
        help="how the model writes tool calls (default: chosen from the chat template; hermes when it says "
        "nothing)",
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
        "--load-weights-dir",
        default=None,
        metavar="DIR",
        help="at startup, load the newest complete weight version under DIR (the filesystem weight transfer's "
        "directory, e.g. a run's output_dir/weights); versions without their COMPLETE marker are skipped",
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


def handler(args: argparse.Namespace) -> int:
    from vriksha.engine.async_engine import AsyncEngine
    from vriksha.engine.llm_engine import LLMEngine
    from vriksha.net import FrontConfig, from_args, front_config
    from vriksha.server.app import create_app
    from vriksha.server.shutdown import CUT_GRACE_S, GracefulServer

    if args.max_waiting < 0:
        raise ConfigError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    if args.max_prompt_logprobs < 0:
        raise ConfigError(f"--max-prompt-logprobs must be >= 0, got {args.max_prompt_logprobs}")
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if not args.shutdown_timeout >= 0:
        raise ConfigError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    front = from_args(FrontConfig, args)
    front.validate()
    internal_key = args.internal_key or env_key(INTERNAL_KEY_ENV)
    weights_key = args.weights_key or env_key(WEIGHTS_KEY_ENV)
    check_keys(args.api_key or None, internal_key, weights_key)
    config = ServerConfig(
        served_model_names=list(args.served_model_name or []),
        api_key=args.api_key or None,
        internal_key=internal_key,
        weights_key=weights_key,
        auth_exempt=frozenset(args.auth_exempt),
        max_waiting=args.max_waiting,
        max_prompt_logprobs=args.max_prompt_logprobs,
        profile_dir=args.profile_dir,
        shutdown_timeout_s=args.shutdown_timeout,
        tool_call_parser=args.tool_call_parser,
        front=front,
        allow_multiple_weight_clients=args.allow_multiple_weight_clients,
    )
    from vriksha.profiling import ProfileConfig, StepProfiler

    _check_events(args, internal_key)
    from vriksha.server import kv_roles

    role_config = kv_roles.from_args(args, internal_key)
    engine_config = EngineConfig.from_args(args)
    if role_config.role != "both" and not engine_config.enable_prefix_caching:
        raise ConfigError(
            f"--role {role_config.role} needs the prefix cache; drop --no-enable-prefix-caching"
        )
    publisher = _kv_events(args, internal_key)
    logger.info(
        "loading %s; the server listens on %s:%d once it is loaded",
        engine_config.model or "the embedded default model",
        args.host,
        args.port,
    )
    engine = AsyncEngine(LLMEngine(engine_config, cache_events=publisher))
    if args.load_weights_dir:
        from vriksha.weights.fs import restore_latest

        version = restore_latest(engine.engine, args.load_weights_dir)
        logger.warning("weights: version %s from %s", version, args.load_weights_dir)
    step_profiler = StepProfiler(ProfileConfig.from_args(args), rank=0, name="serve")
    if step_profiler.enabled:
        engine.step_hooks.append(step_profiler.step)
        step_profiler.start()
    roles = None if role_config.role == "both" else kv_roles.KVRoles(engine, role_config)
    app = create_app(engine, config, kv_events=publisher, kv_roles=roles)
    state = app.state.vriksha

    level = logging.getLogger().getEffectiveLevel()
    uv_config = front_config(
        app,
        args.host,
        args.port,
        front,
        log_level=max(level, logging.INFO) if level <= logging.INFO else level,
        access_log=level <= logging.DEBUG,
        timeout_graceful_shutdown=int(CUT_GRACE_S),
        lifespan="on",
    )
    server = GracefulServer(
        uv_config,
        front,
        state.drain,
        lambda: state.admission.in_flight,
        lambda: engine.failure,
        ready=f"serving {', '.join(state.model_names)} (POST /v1/chat/completions, /v1/completions, /generate; "
        "GET /v1/models)",
    )
    try:
        server.run()
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
            f"the server did not start on {args.host}:{args.port}; is the port in use? pick another --port"
        )
    return 0


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
