"""The job's services on Ray: each a named `ServiceActor` in its own bundle of the placement group, watched by
the driver; one that dies is started again in the same bundle (so on the same node) at the same ports (so at the
same URL), up to `max_restarts` times. Every start and restart is written to `launch.jsonl`."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vriksha.errors import VrikshaError
from vriksha.launch.ray.actors import ServiceActor

logger = logging.getLogger(__name__)

__all__ = ["LaunchLog", "Service", "Services"]

NAME_RELEASE_S = 60.0  # how long a restart waits for a dead actor's name before it takes another


class LaunchLog:
    """`launch.jsonl`: one JSON line per placement, start, restart or stop, with the seconds it took."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.t0 = time.monotonic()

    def write(self, event: str, **fields: Any) -> None:
        row = {"event": event, "t": round(time.monotonic() - self.t0, 3), **fields}
        logger.info("%s", row)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


@dataclass(slots=True)
class Service:
    role: str
    index: int
    argv: list[str]
    num_cpus: float
    resources: dict[str, float]
    bundle: int
    ports: tuple[int | None, int | None] = (None, None)  # fixed ports; None: a free one on its node
    actor: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    watch: Any = None
    restarts: int = 0

    @property
    def name(self) -> str:
        return f"vriksha-{self.role}-{self.index}"

    @property
    def url(self) -> str:
        return str(self.info["url"])


class Services:
    def __init__(
        self,
        pg: Any,
        namespace: str,
        log: LaunchLog,
        startup_timeout_s: float,
        secrets: dict[str, str] | None = None,
    ) -> None:
        self.pg, self.namespace, self.log, self.timeout_s = pg, namespace, log, startup_timeout_s
        self.secrets = dict(
            secrets or {}
        )  # keys every service gets in its environment, never on its command line
        self.all: list[Service] = []

    def _actor(self, s: Service, ports: tuple[int | None, int | None]) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cls = ray.remote(ServiceActor)
        options = {
            "namespace": self.namespace,
            "num_cpus": s.num_cpus,
            "resources": s.resources or None,
            "max_concurrency": 4,  # watch() blocks one thread; describe() and stop() use others
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=s.bundle
            ),
        }
        args = (s.name, s.argv, max(1, int(s.num_cpus)), ports, self.timeout_s, self.secrets)
        deadline = time.monotonic() + NAME_RELEASE_S
        while True:  # a dead actor's name is released once Ray has marked it dead
            try:
                return cls.options(name=s.name, **options).remote(*args)
            except ValueError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        name = f"{s.name}.{s.restarts}"
        logger.warning("the Ray actor name %s is still taken; the new actor is %s", s.name, name)
        return cls.options(name=name, **options).remote(*args)

    def start(self, services: list[Service]) -> None:
        """Start `services` together; return once every one answers /health."""
        import ray

        t0 = time.monotonic()
        for s in services:
            s.actor = self._actor(s, s.ports)
        for s in services:
            s.info = ray.get(s.actor.describe.remote(), timeout=self.timeout_s)
            s.watch = s.actor.watch.remote()
            self.all.append(s)
            self.log.write(
                "started", role=s.role, index=s.index, url=s.url, seconds=round(time.monotonic() - t0, 3)
            )

    def by_role(self, role: str) -> list[Service]:
        return [s for s in self.all if s.role == role]

    def find(self, ref: Any) -> Service | None:
        return next((s for s in self.all if s.watch == ref), None)

    def restart(self, s: Service, max_restarts: int) -> None:
        """Start a dead service again in its bundle at its ports."""
        import ray

        if s.restarts >= max_restarts:
            raise VrikshaError(
                f"{s.name} died {s.restarts + 1} times (launch.ray.max_restarts is {max_restarts}); see {s.info.get('log')}"
            )
        s.restarts += 1
        t0 = time.monotonic()
        ray.kill(s.actor, no_restart=True)  # marks it dead at once, which releases its name
        ports = tuple(s.info["ports"])
        s.actor = self._actor(s, (ports[0], ports[1]))
        s.info = ray.get(s.actor.describe.remote(), timeout=self.timeout_s)
        s.watch = s.actor.watch.remote()
        self.log.write(
            "restarted", role=s.role, index=s.index, url=s.url, seconds=round(time.monotonic() - t0, 3)
        )

    def watches(self) -> list[Any]:
        return [s.watch for s in self.all]

    def stop(self) -> None:
        import ray

        for s in reversed(self.all):
            try:
                ray.get(s.actor.stop.remote(), timeout=60)
            except Exception as exc:  # noqa: BLE001 (a dead actor has nothing left to stop)
                logger.debug("stop %s: %s", s.name, exc)
            ray.kill(s.actor)
        self.all = []
