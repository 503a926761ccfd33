"""What a launcher is: it takes a training job or a serving fleet and decides where each part runs.

`torchrun` places training ranks on this node (or on several, through a rendezvous); `ray` places every role
of a job (trainer ranks, rollout servers, router, environment servers) on a Ray cluster. Another backend (an
actor system, a scheduler) is a class with these two methods, added to `LAUNCHERS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vriksha.errors import ConfigError

if TYPE_CHECKING:
    from vriksha.launch.torchrun import TorchrunConfig
    from vriksha.train.config import TrainConfig

__all__ = ["FleetJob", "LAUNCHERS", "Launcher", "TrainJob", "get_launcher"]


@dataclass(slots=True)
class TrainJob:
    """A training as the command line gave it."""

    config: TrainConfig
    argv: list[str]  # what every trainer rank is started with: the config file and its overrides
    resume: bool
    ranks: TorchrunConfig
    profile: object | None = None


@dataclass(slots=True)
class FleetJob:
    """A serving fleet: replicas (by role) behind one router."""

    roles: list[str]  # one per replica: "both", "prefill" or "decode"
    serve_args: list[str]  # flags every `vriksha serve` gets (model, API key, extra flags)
    router_args: list[str]  # flags of `vriksha router` beyond its replicas
    host: str = "127.0.0.1"
    port: int = 8080
    startup_timeout_s: float = 600.0
    extra: dict[str, object] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # keys every member gets in its environment


class Launcher(Protocol):
    name: str

    def train(self, job: TrainJob) -> int: ...

    def fleet(self, job: FleetJob, args: argparse.Namespace) -> int: ...


def _torchrun() -> Launcher:
    from vriksha.launch.local import LocalLauncher

    return LocalLauncher()


def _ray() -> Launcher:
    from vriksha.launch.ray.launcher import RayLauncher

    return RayLauncher()


LAUNCHERS: dict[str, Callable[[], Launcher]] = {"torchrun": _torchrun, "ray": _ray}


def get_launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise ConfigError(f"--launcher: {name!r} is not one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]()
