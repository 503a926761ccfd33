"""`vriksha serve` arguments map onto the engine's config and the server's config."""

from __future__ import annotations

import argparse
from dataclasses import fields

from vriksha.engine.config import EngineConfig
from vriksha.server.cli import engine_kwargs, register, server_config_from_args


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_engine_options_are_engine_config_fields():
    args = parse(
        [
            "--dtype", "bfloat16", "--kv-cache-memory-gb", "0.25", "--max-num-seqs", "8",
            "--max-num-batched-tokens", "256", "--chunked-prefill-size", "128", "--max-model-len", "1024",
            "--no-prefix-caching", "--no-fast-linear", "--no-fast-forward", "--no-native-kernels",
        ]
    )  # fmt: skip
    kw = engine_kwargs(args)
    assert set(kw) <= set(EngineConfig.option_names())
    cfg = EngineConfig.from_flat(**kw)
    assert (cfg.dtype, cfg.kv_cache_memory_gb, cfg.max_num_seqs, cfg.max_model_len) == (
        "bfloat16",
        0.25,
        8,
        1024,
    )
    assert cfg.enable_prefix_caching is False and cfg.platform.fast_linear is False
    assert cfg.platform.fast_forward is False and cfg.platform.native_kernels is False
    assert cfg.max_num_batched_tokens == 256 and cfg.chunked_prefill_size == 128


def test_defaults_leave_the_engine_its_own_defaults(monkeypatch):
    for name in ("VRIKSHA_API_KEY", "VRIKSHA_INTERNAL_KEY", "VRIKSHA_WEIGHTS_KEY"):
        monkeypatch.delenv(name, raising=False)
    args = parse([])
    assert engine_kwargs(args) == {}
    config = server_config_from_args(args)
    assert (config.host, config.port, config.max_waiting, args.auth_exempt) == (
        "127.0.0.1",
        8000,
        256,
        ["/health", "/metrics"],
    )
    assert (config.max_prompt_logprobs, config.shutdown_timeout_s, config.api_key) == (1 << 18, 30.0, None)
    assert parse(["--auth-exempt"]).auth_exempt == []
    given = server_config_from_args(
        parse(["--port", "9001", "--max-waiting", "3", "--shutdown-timeout", "2"])
    )
    assert (given.port, given.max_waiting, given.shutdown_timeout_s) == (9001, 3, 2.0)


def test_front_limits_are_flags_of_serve_built_from_front_config():
    from vriksha.net import FrontConfig, flag_name, from_args

    args = parse(["--max-connections", "9", "--header-timeout", "3", "--max-body-bytes", "1000"])
    front = from_args(FrontConfig, args)
    assert (front.max_connections, front.header_timeout_s, front.max_body_bytes) == (9, 3.0, 1000)
    assert from_args(FrontConfig, parse([])) == FrontConfig()
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001
    help_text = serve.format_help()
    for f in fields(FrontConfig):
        assert flag_name(f.name) in help_text


def test_transfer_roles_and_events_need_the_internal_key(monkeypatch):
    """A replica in a transfer role, or publishing cache events, will not start without the internal key; the
    vLLM-format stream (no authentication) binds to this host only; no key may double as another."""
    import pytest

    from vriksha.errors import ConfigError
    from vriksha.server.cli import handler

    monkeypatch.delenv("VRIKSHA_INTERNAL_KEY", raising=False)
    monkeypatch.delenv("VRIKSHA_WEIGHTS_KEY", raising=False)
    with pytest.raises(ConfigError, match="--role decode needs --internal-key"):
        handler(parse(["--role", "decode"]))
    with pytest.raises(ConfigError, match="needs --internal-key"):
        handler(parse(["--kv-events-endpoint", "tcp://127.0.0.1:5999"]))
    key = "k" * 20
    with pytest.raises(ConfigError, match="--api-key and --internal-key must differ"):
        handler(parse(["--api-key", key, "--internal-key", key, "--role", "prefill"]))
    with pytest.raises(ConfigError, match="--internal-key and --weights-key must differ"):
        handler(parse(["--internal-key", key, "--weights-key", key]))
    with pytest.raises(ConfigError, match="at least 16 characters"):
        handler(parse(["--weights-key", "short"]))
    events = ["--internal-key", key, "--kv-events-endpoint", "tcp://127.0.0.1:5999"]
    with pytest.raises(ConfigError, match="this host only"):
        handler(parse([*events, "--kv-events-vllm-endpoint", "tcp://0.0.0.0:5998"]))
    with pytest.raises(ConfigError, match="--kv-peer names the prefill replicas"):
        handler(parse(["--internal-key", key, "--role", "prefill", "--kv-peer", "http://127.0.0.1:1"]))
