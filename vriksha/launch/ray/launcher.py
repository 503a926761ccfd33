"""`vriksha train CONFIG --launcher ray` and `vriksha fleet --launcher ray`: one placement group holds a bundle per
actor (trainer ranks, rollout servers, the router, environment servers; or a fleet's replicas and router), each
reserving its role's CPUs and custom resources from the config's `launch.ray` section.

Training: environment and rollout servers start first, then the router over the rollout servers, then the
trainer ranks (rank 0 publishes its node's address and a free port for the process group; every rank sets the
torch.distributed variables and runs today's trainer with the servers' URLs in its config). The driver waits:
- a rollout server, router or environment server that dies is started again in its bundle at its URL (the
  trainer waits for it, re-syncs its weights to the current version and repeats what was lost);
- a trainer rank that dies stops the job: every actor ends, the group is removed, and the message names the
  last verified checkpoint, which the next submission with --resume continues from.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from vriksha.errors import ConfigError, VrikshaError
from vriksha.launch.protocol import FleetJob, TrainJob
from vriksha.launch.ray.services import LaunchLog, Service, Services
from vriksha.net.launch import StopSignals

logger = logging.getLogger(__name__)

__all__ = ["RayLauncher"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--launcher ray needs Ray: pip install 'vriksha[ray]'") from None
    return ray


def _connect(address: str, namespace: str) -> Any:
    ray = _ray()
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=True)
    return ray


def _bundle(num_cpus: float, resources: dict[str, float]) -> dict[str, float]:
    return {"CPU": num_cpus, **resources}


def _placement(
    ray: Any, bundles: list[dict[str, float]], strategy: str, timeout_s: float, log: LaunchLog
) -> Any:
    from ray.util.placement_group import placement_group

    t0 = time.monotonic()
    pg = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise VrikshaError(
            f"the cluster could not place {len(bundles)} bundles ({bundles}) within {timeout_s:.0f} s; add nodes or "
            "lower the launch.ray roles' num_cpus and resources"
        )
    log.write("placed", bundles=len(bundles), seconds=round(time.monotonic() - t0, 3))
    return pg


class RayLauncher:
    name = "ray"

    # ---- training -----------------------------------------------------------------------------------
    def train(self, job: TrainJob) -> int:
        from vriksha.launch.ray.training import TrainingOnRay

        return TrainingOnRay(job, _connect).run()

    # ---- a serving fleet ----------------------------------------------------------------------------
    def fleet(self, job: FleetJob, args: argparse.Namespace) -> int:
        ray = _connect("auto", "vriksha")
        log = LaunchLog(None)
        cpus = float(job.extra.get("replica_cpus", 1.0))  # type: ignore[arg-type]
        bundles = [_bundle(cpus, {}) for _ in job.roles] + [_bundle(1.0, {})]
        pg = _placement(ray, bundles, "SPREAD", job.startup_timeout_s, log)
        services = Services(pg, "vriksha", log, job.startup_timeout_s, job.secrets)
        signals = StopSignals()
        try:
            replicas = [
                Service(
                    role if role != "both" else "replica", i, replica_argv(role, job.serve_args), cpus, {}, i
                )
                for i, role in enumerate(job.roles)
            ]
            services.start(replicas)
            specs: list[str] = []
            for s, role in zip(replicas, job.roles, strict=True):
                specs += ["--prefill", s.url] if role == "prefill" else ["--replica", f"{s.url},{events(s)}"]
            argv = ["router", "--host", "{host}", "--port", "{port}", *specs, *job.router_args]
            router = Service("router", 0, argv, 1.0, {}, len(job.roles), (job.port or None, None))
            services.start([router])
            logger.warning(
                "fleet of %d replicas behind %s on Ray; Ctrl-C stops it", len(replicas), router.url
            )
            print(json.dumps({"router": router.url, "replicas": [s.url for s in replicas]}), flush=True)
            while not signals.stopping:
                done, _ = ray.wait(services.watches(), num_returns=1, timeout=0.5)
                for ref in done:
                    s = services.find(ref)
                    if s is not None:
                        logger.error("%s stopped; starting it again", s.name)
                        services.restart(s, max_restarts=1000)
            return 0
        finally:
            services.stop()
            ray.util.remove_placement_group(pg)


def events(s: Service) -> str:
    """The KV events endpoint of a replica started with `replica_argv`."""
    return f"tcp://{s.info['host']}:{s.info['ports'][1]}"


def replica_argv(role: str, serve_args: list[str]) -> list[str]:
    """`vriksha serve` on the actor's address, publishing KV events on its second port (decode and colocated)."""
    argv = ["serve", "--host", "{host}", "--port", "{port}"]
    if role != "prefill":
        argv += ["--kv-events-endpoint", "tcp://{host}:{port2}"]
    if role != "both":
        argv += ["--role", role]
    return [*argv, *serve_args]


def resolve_paths(cfg: dict[str, Any]) -> dict[str, Any]:
    """Paths of the config made absolute (actors run in their own working directories)."""
    out = json.loads(json.dumps(cfg))
    out["trainer"]["output_dir"] = str(Path(out["trainer"]["output_dir"]).resolve())
    path = out["model"].get("path")
    if path and Path(path).exists():
        out["model"]["path"] = str(Path(path).resolve())
    return out
