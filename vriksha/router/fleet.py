"""`vriksha fleet`: N replicas on this machine, each pinned to its share of the cores with as many threads,
each publishing KV events, and `vriksha router` in front of them; SIGINT/SIGTERM stops them all. With
`--prefill N --decode M`, N prefill and M decode replicas (prefill/decode disaggregation) instead."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from vriksha.errors import ConfigError
from vriksha.router.config import POLICIES

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="start N pinned replicas and a router in front of them, on this machine",
        description="Start N `vriksha serve` replicas, each pinned to its share of this process's cores (and "
        "OMP_NUM_THREADS to match) and publishing KV events, then `vriksha router` over them. Stops them all "
        "on SIGINT/SIGTERM. Extra arguments after `--` go to every replica's `vriksha serve`.",
    )
    p.add_argument("--replicas", type=int, default=2, help="number of colocated replicas (default: 2)")
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="prefill/decode disaggregation: this many `--role prefill` replicas (with --decode; replaces "
        "--replicas; default: 0, colocated)",
    )
    p.add_argument(
        "--decode",
        type=int,
        default=1,
        help="with --prefill: this many `--role decode` replicas (default: 1)",
    )
    p.add_argument(
        "--pd-threshold",
        type=int,
        default=None,
        help="with --prefill: the router's --pd-threshold (uncached prompt tokens above which a prompt is "
        "prefilled on a prefill replica)",
    )
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: the embedded model)")
    p.add_argument("--host", default="127.0.0.1", help="the router's address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="the router's port (default: 8080)")
    p.add_argument("--policy", choices=POLICIES, default="precise", help="routing policy (default: precise)")
    p.add_argument("--api-key", default=os.environ.get("VRIKSHA_API_KEY"), help="for the router and replicas")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for each replica")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then flags for every `vriksha serve`")
    p.set_defaults(func=handler)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@dataclass(slots=True)
class Member:
    name: str
    proc: subprocess.Popen
    url: str
    events: str | None = None  # its --kv-events-endpoint (None: a prefill replica publishes none)

    @property
    def spec(self) -> str:
        """As `vriksha router --replica` takes it: URL or URL,EVENTS."""
        return f"{self.url},{self.events}" if self.events else self.url


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cli_base() -> list[str]:
    """`python -m vriksha.cli --log-level LEVEL`, the level this process logs at."""
    level = logging.getLevelName(logging.getLogger().level)
    return [sys.executable, "-m", "vriksha.cli", "--log-level", level]


def spawn_replica(
    name: str,
    share: list[int],
    common: list[str],
    role: str = "both",
    threads: int | None = None,
) -> Member:
    """One `vriksha serve` on free loopback ports, pinned to `share` with `threads` (default: one per core
    of its share) OMP threads; `common`: flags every replica gets (model, API key, extra serve flags)."""
    port, events = _free_port(), _free_port()
    cmd = [*cli_base(), "serve", "--port", str(port)]
    endpoint = f"tcp://127.0.0.1:{events}" if role != "prefill" else None
    if endpoint:
        cmd += ["--kv-events-endpoint", endpoint]
    if role != "both":
        cmd += ["--role", role]
    proc = _spawn([*cmd, *common], share, threads or len(share))
    return Member(f"{name} (cores {share})", proc, f"http://127.0.0.1:{port}", endpoint)


def _spawn(cmd: list[str], cores: list[int] | None, threads: int | None) -> subprocess.Popen:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)

    def prepare() -> None:  # in the child: its cores, and SIGTERM when the fleet process dies (Linux)
        if cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)
        if sys.platform == "linux":
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return subprocess.Popen(cmd, env=env, preexec_fn=prepare)


def wait_healthy(m: Member, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if m.proc.poll() is not None:
            raise ConfigError(
                f"{m.name} exited with status {m.proc.returncode} during startup; see its log above"
            )
        try:
            if httpx.get(f"{m.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ConfigError(f"{m.name} was not healthy after {timeout_s:.0f} s; raise --startup-timeout")


def stop_all(members: list[Member], timeout_s: float = 30.0) -> None:
    """SIGTERM in reverse start order (the router first), then SIGKILL what is left after `timeout_s`."""
    for m in reversed(members):
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for m in reversed(members):
        try:
            m.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %.0f s; killing it", m.name, timeout_s)
            m.proc.kill()
            m.proc.wait(10)


def handler(args: argparse.Namespace) -> int:
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
    if args.prefill < 0 or (args.prefill and args.decode < 1):
        raise ConfigError(
            f"--prefill N needs N >= 0 and --decode M >= 1, got {args.prefill} and {args.decode}"
        )
    # each member's role: colocated replicas, or prefill replicas then decode replicas
    roles = (
        ["prefill"] * args.prefill + ["decode"] * args.decode if args.prefill else ["both"] * args.replicas
    )
    extra = [a for a in args.serve_args if a != "--"]
    shares = core_shares(usable_cores(), len(roles))
    base = cli_base()
    common = (["--model", args.model] if args.model else []) + (
        ["--api-key", args.api_key] if args.api_key else []
    )
    members: list[Member] = []
    stopping = False

    def on_signal(sig: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        specs = []
        for i, (share, role) in enumerate(zip(shares, roles, strict=True)):
            m = spawn_replica(f"{'replica' if role == 'both' else role} {i}", share, [*common, *extra], role)
            members.append(m)
            specs += ["--prefill", m.url] if role == "prefill" else ["--replica", m.spec]
        if args.prefill and args.pd_threshold is not None:
            specs += ["--pd-threshold", str(args.pd_threshold)]
        for m in members:
            wait_healthy(m, args.startup_timeout)
        cmd = [
            *base,
            "router",
            "--host",
            args.host,
            "--port",
            str(args.port),
            "--policy",
            args.policy,
            *specs,
        ]
        cmd += (["--model", args.model] if args.model else []) + (
            ["--api-key", args.api_key] if args.api_key else []
        )
        router = Member("router", _spawn(cmd, None, None), f"http://{args.host}:{args.port}")
        members.append(router)
        wait_healthy(router, args.startup_timeout)
        logger.warning(
            "fleet of %d replicas (%s) behind %s (%s); Ctrl-C stops it",
            len(shares),
            ", ".join(f"{roles.count(x)} {x}" for x in ("both", "prefill", "decode") if x in roles),
            router.url,
            args.policy,
        )
        while not stopping:
            for m in members:
                if m.proc.poll() is not None:
                    logger.error("%s exited with status %s", m.name, m.proc.returncode)
                    if m is router:
                        return 1
            time.sleep(0.5)
        return 0
    finally:
        stop_all(members)
