"""Pools whose replicas the router starts itself: every pool with a `fleet` section gets its replicas from
the package's fleet launcher (vriksha/router/fleet.py), the cores of this process shared out over all of
them, before the router binds; they are stopped when it exits (and die with it: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import logging
from pathlib import Path

from vriksha.errors import ConfigError
from vriksha.net.launch import StartupError, stop_all
from vriksha.router.fleet import Member, core_shares, spawn_replica, usable_cores
from vriksha.semantic.config import Pool, RoutesConfig

logger = logging.getLogger(__name__)


class PoolFleets:
    def __init__(self, cfg: RoutesConfig, secrets: dict[str, str] | None = None) -> None:
        self.cfg = cfg
        self.secrets = secrets or {}  # the members' keys, as environment variables (fleet_secrets)
        self.members: list[Member] = []
        self.pools = [p for p in cfg.pools if p.fleet is not None]

    def model(self, pool: Pool) -> str | None:
        assert pool.fleet is not None
        m = pool.fleet.model
        if m is None or Path(m).is_absolute():
            return m
        local = self.cfg.resolve(m)
        return str(local) if local.exists() else m

    def start(self) -> None:
        """Start every fleet pool's replicas, wait until each is healthy and fill in the pool's `replicas`;
        on any failure stop what was started and raise."""
        if not self.pools:
            return
        total = sum(p.fleet.replicas for p in self.pools if p.fleet)
        shares = iter(core_shares(usable_cores(), total))
        try:
            by_pool: dict[str, list[Member]] = {}
            for p in self.pools:
                assert p.fleet is not None
                model = self.model(p)
                common = ["--model", model] if model else []
                for i in range(p.fleet.replicas):
                    m = spawn_replica(
                        f"pool {p.name} replica {i}",
                        next(shares),
                        [*common, *p.fleet.serve_args],
                        "both",
                        p.fleet.threads,
                        self.secrets,
                    )
                    self.members.append(m)
                    by_pool.setdefault(p.name, []).append(m)
            for p in self.pools:
                assert p.fleet is not None
                for m in by_pool[p.name]:
                    m.wait_healthy(
                        p.fleet.startup_timeout_s, hint="; raise the pool's fleet.startup_timeout_s"
                    )
                p.replicas = [m.spec for m in by_pool[p.name]]
                if p.tokenizer is None:
                    p.tokenizer = self.model(p)
                logger.info(
                    "pool %s: started %d replicas (%s)", p.name, len(p.replicas), ", ".join(p.replicas)
                )
        except (ConfigError, StartupError) as exc:
            self.stop()
            raise ConfigError(f"starting the fleet pools failed: {exc}") from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.members:
            logger.info("stopping %d fleet replicas", len(self.members))
            stop_all(self.members)
            self.members = []
