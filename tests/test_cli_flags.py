"""Each command keeps its flags and their defaults (tests/cli_flags.py explains the snapshot)."""

import json
from pathlib import Path

import pytest

from tests.cli_flags import flag_table, shown
from vriksha.cli import build_parser

SNAPSHOT = Path(__file__).with_name("cli_flags.json")


def _same(want: object, have: object) -> bool:
    if isinstance(have, dict) and not isinstance(want, dict):  # now declared by a config class
        # a None default may be described in words ("the embedded model")
        return have["declared"] == shown(want) or want is None
    return want == have


def test_every_command_keeps_its_flags_and_defaults():
    want, have = json.loads(SNAPSHOT.read_text()), flag_table()
    assert sorted(have) == sorted(want), "the commands changed"
    for command in want:
        gone = sorted(set(want[command]) - set(have[command]))
        new = sorted(set(have[command]) - set(want[command]))
        assert not gone and not new, f"{command}: flags gone {gone}, new {new}"
        was, now = want[command], have[command]
        moved = {f: (was[f], now[f]) for f in was if not _same(was[f], now[f])}
        assert not moved, f"{command}: defaults changed (was, now): {moved}"


def test_the_removed_sandbox_flag_says_why(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["repo2env", "validate", "DIR", "--sandbox"])
    assert "--sandbox is gone: every test run is sandboxed already" in capsys.readouterr().err


def test_the_router_flags_build_the_config_they_built_before(monkeypatch):
    from vriksha.router.cli import config_from_args

    monkeypatch.delenv("VRIKSHA_API_KEY", raising=False)
    monkeypatch.delenv("VRIKSHA_INTERNAL_KEY", raising=False)
    plain = config_from_args(build_parser().parse_args(["router", "--replica", "http://a:1/"]))
    assert [(r.url, r.events, r.role) for r in plain.replicas] == [("http://a:1", None, "both")]
    assert (plain.policy, plain.model, plain.api_key, plain.internal_key) == ("precise", None, None, None)
    assert (plain.host, plain.port, plain.session_header) == ("127.0.0.1", 8080, "x-session-id")
    assert (plain.health_interval_s, plain.load_interval_s, plain.request_timeout_s) == (1.0, 0.25, 600.0)
    assert (plain.cache_threshold, plain.balance_abs_threshold, plain.balance_rel_threshold) == (0.3, 32, 1.5)
    assert (plain.queue_cost_tokens, plain.kv_cost_tokens, plain.affinity_bound_tokens) == (
        64.0,
        256.0,
        512.0,
    )
    assert (plain.affinity_min_share, plain.pd_threshold_tokens, plain.pd_timeout_s) == (0.3, 256, 30.0)
    flags = [
        "--policy",
        "least_load",
        "--session-header",
        "X-User",
        "--health-interval",
        "2",
        "--kv-cost",
        "9",
    ]
    flags += ["--pd-threshold", "7", "--pd-timeout", "3", "--api-key", "k", "--port", "9000"]
    given = config_from_args(build_parser().parse_args(["router", "--replica", "http://a:1", *flags]))
    assert (given.policy, given.session_header, given.health_interval_s, given.kv_cost_tokens) == (
        "least_load",
        "x-user",
        2.0,
        9.0,
    )
    assert (given.pd_threshold_tokens, given.pd_timeout_s, given.api_key, given.port) == (7, 3.0, "k", 9000)
    monkeypatch.setenv("VRIKSHA_API_KEY", "from-env")
    assert (
        config_from_args(build_parser().parse_args(["router", "--replica", "http://a:1"])).api_key
        == "from-env"
    )


def test_env_serve_flags_build_the_server_config():
    from vriksha.envs.server import EnvServerConfig

    args = build_parser().parse_args(["env", "serve", "arithmetic"])
    plain = EnvServerConfig.from_args(args)
    assert plain == EnvServerConfig()
    assert (plain.host, plain.port, plain.max_sessions, plain.workers) == ("127.0.0.1", 8000, 64, None)
    assert (plain.idle_timeout_s, plain.detach_grace_s, plain.heartbeat_s) == (300.0, 30.0, 15.0)
    flags = [
        "--port",
        "9",
        "--idle-timeout",
        "5",
        "--detach-grace",
        "0",
        "--heartbeat",
        "2",
        "--workers",
        "3",
    ]
    given = EnvServerConfig.from_args(build_parser().parse_args(["env", "serve", "arithmetic", *flags]))
    assert (given.port, given.idle_timeout_s, given.detach_grace_s, given.heartbeat_s, given.workers) == (
        9,
        5.0,
        0.0,
        2.0,
        3,
    )


def test_generate_sampling_flags_build_the_sampling_params():
    from vriksha.engine.cli import GenerateSampling

    plain = GenerateSampling.from_args(build_parser().parse_args(["generate", "--prompt", "x"]))
    assert plain.to_dict() == {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None}
    flags = ["--max-tokens", "4", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "7", "--seed", "3"]
    given = GenerateSampling.from_args(build_parser().parse_args(["generate", "--prompt", "x", *flags]))
    assert given.to_dict() == {"max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "seed": 3}


def test_repo2env_flags_build_the_build_config():
    from vriksha.repo2env.build_config import DEFAULT_PIPELINES, BuildConfig

    plain = BuildConfig.from_args(build_parser().parse_args(["repo2env", "src", "--out", "o"]))
    assert plain == BuildConfig() and plain.pipelines == DEFAULT_PIPELINES
    assert (plain.max_tasks, plain.max_candidates, plain.workers, plain.seed) == (20, None, 1, 0)
    assert (plain.baseline_runs, plain.per_function, plain.timeout_s) == (2, 1, 900.0)
    assert (plain.max_unpacked_mb, plain.max_unpacked_files) == (1024.0, 100_000)
    flags = ["--max-tasks", "3", "--mutations-per-function", "2", "--timeout", "5", "--max-candidates", "9"]
    given = BuildConfig.from_args(build_parser().parse_args(["repo2env", "src", "--out", "o", *flags]))
    assert (given.max_tasks, given.per_function, given.timeout_s, given.max_candidates) == (3, 2, 5.0, 9)


def test_fleet_flags_build_the_fleet_config(monkeypatch):
    from vriksha.router.fleet import FleetConfig

    monkeypatch.setenv("VRIKSHA_API_KEY", "from-env")
    plain = FleetConfig.from_args(build_parser().parse_args(["fleet"]), api_key="from-env")
    assert (plain.replicas, plain.prefill, plain.decode, plain.pd_threshold, plain.model) == (
        2,
        0,
        1,
        None,
        None,
    )
    assert (plain.host, plain.port, plain.policy, plain.startup_timeout_s) == (
        "127.0.0.1",
        8080,
        "precise",
        600.0,
    )
    args = build_parser().parse_args(["fleet", "--prefill", "1", "--startup-timeout", "9", "--api-key", "k"])
    given = FleetConfig.from_args(args, api_key="from-env")
    assert (given.prefill, given.startup_timeout_s, given.api_key) == (1, 9.0, "k")
