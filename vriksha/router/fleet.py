"""`vriksha fleet`: N replicas on this machine, each pinned to its share of the cores with as many threads,
each publishing KV events, and `vriksha router` in front of them; SIGINT/SIGTERM stops them all. With
`--prefill N --decode M`, N prefill and M decode replicas (prefill/decode disaggregation) instead. The
members share one internal key ($VRIKSHA_INTERNAL_KEY, else a fresh one) and the API key, both handed over
in their environment; decode replicas may ask exactly the fleet's prefill replicas (`--kv-peer`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from vriksha.errors import ConfigError
from vriksha.launch.protocol import FleetJob
from vriksha.net.launch import Child, StopSignals, free_port, stop_all, vriksha_command
from vriksha.net.trust import API_KEY_ENV, INTERNAL_KEY_ENV, check_keys, env_key, new_key
from vriksha.options import Options, option
from vriksha.router.config import POLICIES

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class FleetConfig(Options):
    """`vriksha fleet`'s options, declared once with their flags (`vriksha.options`)."""

    options_label: ClassVar[str] = "fleet"
    flag_dest_prefix: ClassVar[str] = "fleet_"

    replicas: int = option(2, "number of colocated replicas")
    prefill: int = option(
        0,
        "prefill/decode disaggregation: this many `--role prefill` replicas (with --decode; replaces --replicas; "
        "0: colocated)",
    )
    decode: int = option(1, "with --prefill: this many `--role decode` replicas")
    pd_threshold: int | None = option(
        None,
        "with --prefill: the router's --pd-threshold (uncached prompt tokens above which a prompt is prefilled "
        "on a prefill replica)",
    )
    model: str | None = option(None, "HF directory or .gguf (default: the embedded model)")
    host: str = option("127.0.0.1", "the router's address")
    port: int = option(8080, "the router's port")
    policy: str = option("precise", "routing policy", choices=POLICIES)
    api_key: str | None = option(
        None,
        "the clients' key, for the router and the replicas (default: $VRIKSHA_API_KEY, else none); the members "
        "also share an internal key of their own ($VRIKSHA_INTERNAL_KEY, else a fresh one)",
    )
    startup_timeout_s: float = option(600.0, "seconds to wait for each replica", flag="startup-timeout")
    launcher: str = option(
        "local",
        "local: child processes of this host; ray: replicas and the router as actors of one Ray placement group on "
        "the cluster (`ray.init(address='auto')`; pip install 'vriksha[ray]')",
        choices=("local", "ray"),
    )
    replica_cpus: float = option(1.0, "with --launcher ray: CPUs each replica's actor reserves")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="start N pinned replicas and a router in front of them, on this machine",
        description="Start N `vriksha serve` replicas, each pinned to its share of this process's cores (and "
        "OMP_NUM_THREADS to match) and publishing KV events, then `vriksha router` over them. Stops them all "
        "on SIGINT/SIGTERM. Extra arguments after `--` go to every replica's `vriksha serve`.",
    )
    FleetConfig.add_arguments(p, title="fleet")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every `vriksha serve`")
    p.set_defaults(func=handler)


def core_shares(cores: list[int], n: int) -> list[list[int]]:
    """`cores` split into `n` contiguous shares, as even as possible; more replicas than cores share cores."""
    if n <= len(cores):
        q, r = divmod(len(cores), n)
        out, start = [], 0
        for i in range(n):
            size = q + (1 if i < r else 0)
            out.append(cores[start : start + size])
            start += size
        return out
    return [[cores[i % len(cores)]] for i in range(n)]


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


class Member(Child):
    """A replica (or the router) of a fleet: its URL and, for a replica that publishes them, its KV events."""

    def __init__(self, cmd: list[str], name: str, url: str, events: str | None = None, **kw: Any) -> None:
        super().__init__(cmd, name, f"{url}/health", **kw)
        self.url, self.events = url, events

    @property
    def spec(self) -> str:
        """As `vriksha router --replica` takes it: URL or URL,EVENTS."""
        return f"{self.url},{self.events}" if self.events else self.url


def _log_level() -> str:
    return logging.getLevelName(logging.getLogger().level)


def _start(
    cmd: list[str],
    name: str,
    url: str,
    cores: list[int] | None,
    threads: int | None,
    events: str | None = None,
    secrets: dict[str, str] | None = None,
) -> Member:
    env = {**os.environ, **(secrets or {})}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)

    def prepare() -> None:  # in the child: its cores, and SIGTERM when the fleet process dies (Linux)
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        if sys.platform == "linux":
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return Member(cmd, name, url, events, env=env, preexec_fn=prepare).start()  # type: ignore[return-value]


def spawn_replica(
    name: str,
    share: list[int],
    common: list[str],
    role: str = "both",
    threads: int | None = None,
    secrets: dict[str, str] | None = None,
) -> Member:
    """One `vriksha serve` on free loopback ports, pinned to `share` with `threads` (default: one per core
    of its share) OMP threads; `common`: flags every replica gets (model, extra serve flags); `secrets`: its
    keys, as environment variables (a flag would show in the process list)."""
    port = free_port()
    cmd = vriksha_command("serve", "--port", str(port), log_level=_log_level())
    endpoint = f"tcp://127.0.0.1:{free_port()}" if role != "prefill" else None
    if endpoint:
        cmd += ["--kv-events-endpoint", endpoint]
    if role != "both":
        cmd += ["--role", role]
    url = f"http://127.0.0.1:{port}"
    name = f"{name} (cores {share})"
    return _start([*cmd, *common], name, url, share, threads or len(share), endpoint, secrets)


def fleet_secrets(api_key: str | None, internal_key: str | None = None) -> dict[str, str]:
    """The keys a fleet's members share, as environment variables: the client API key (when given) and the
    internal key (`internal_key`, else this environment's, else a fresh one: the members start together)."""
    out = {INTERNAL_KEY_ENV: internal_key or env_key(INTERNAL_KEY_ENV) or new_key()}
    if api_key:
        out[API_KEY_ENV] = api_key
    check_keys(api_key, out[INTERNAL_KEY_ENV])
    return out


def fleet_job(args: argparse.Namespace) -> FleetJob:
    """The fleet the flags describe, whichever launcher places it."""
    cfg = FleetConfig.from_args(args, api_key=os.environ.get("VRIKSHA_API_KEY"))
    if cfg.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {cfg.replicas}")
    if cfg.prefill < 0 or (cfg.prefill and cfg.decode < 1):
        raise ConfigError(f"--prefill N needs N >= 0 and --decode M >= 1, got {cfg.prefill} and {cfg.decode}")
    # each member's role: colocated replicas, or prefill replicas then decode replicas
    roles = ["prefill"] * cfg.prefill + ["decode"] * cfg.decode if cfg.prefill else ["both"] * cfg.replicas
    extra = [a for a in args.serve_args if a != "--"]
    common = ["--model", cfg.model] if cfg.model else []
    router = ["--policy", cfg.policy, *common]
    if cfg.prefill and cfg.pd_threshold is not None:
        router += ["--pd-threshold", str(cfg.pd_threshold)]
    return FleetJob(
        roles,
        [*common, *extra],
        router,
        cfg.host,
        cfg.port,
        cfg.startup_timeout_s,
        extra={"policy": cfg.policy, "launcher": cfg.launcher, "replica_cpus": cfg.replica_cpus},
        secrets=fleet_secrets(cfg.api_key),
    )


def handler(args: argparse.Namespace) -> int:
    from vriksha.launch.protocol import get_launcher

    job = fleet_job(args)
    launcher = str(job.extra["launcher"])
    return get_launcher("torchrun" if launcher == "local" else launcher).fleet(job, args)


def run_local_fleet(job: FleetJob, args: argparse.Namespace) -> int:
    """The fleet as child processes of this host, each replica pinned to its share of the cores."""
    roles = job.roles
    shares = core_shares(usable_cores(), len(roles))
    secrets = job.secrets
    members: list[Member] = []
    signals = StopSignals()
    try:
        specs: list[str] = []
        prefill_urls: list[str] = []
        for i, (share, role) in enumerate(zip(shares, roles, strict=True)):
            peers = [x for url in prefill_urls for x in ("--kv-peer", url)] if role == "decode" else []
            name = f"{'replica' if role == 'both' else role} {i}"
            m = spawn_replica(name, share, [*job.serve_args, *peers], role, secrets=secrets)
            members.append(m)
            if role == "prefill":
                prefill_urls.append(m.url)
            specs += ["--prefill", m.url] if role == "prefill" else ["--replica", m.spec]
        for m in members:
            m.wait_healthy(job.startup_timeout_s, hint="; raise --startup-timeout")
        cmd = vriksha_command(
            "router",
            "--host",
            job.host,
            "--port",
            str(job.port),
            *specs,
            *job.router_args,
            log_level=_log_level(),
        )
        router_url = f"http://{job.host}:{job.port}"
        router = _start(cmd, "router", router_url, None, None, secrets=secrets)
        members.append(router)
        router.wait_healthy(job.startup_timeout_s, hint="; raise --startup-timeout")
        logger.warning(
            "fleet of %d replicas (%s) behind %s (%s); Ctrl-C stops it",
            len(shares),
            ", ".join(f"{roles.count(x)} {x}" for x in ("both", "prefill", "decode") if x in roles),
            router_url,
            job.extra["policy"],
        )
        while not signals.stopping:
            for m in members:
                if m.proc is not None and m.proc.poll() is not None:
                    logger.error("%s exited with status %s", m.name, m.proc.returncode)
                    if m is router:
                        return 1
            time.sleep(0.5)
        return 0
    finally:
        stop_all(members)
