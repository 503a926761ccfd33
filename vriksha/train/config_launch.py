"""The `launch` section of a training config: where each role of a job runs under `--launcher ray`.

    launch:
      ray:
        address: auto                    # ray.init's address: a running cluster (`ray start --head`)
        strategy: PACK                   # how the placement group spreads its bundles over nodes
        trainer: {num_cpus: 2}           # per trainer rank (--nproc ranks)
        rollout: {replicas: 1, num_cpus: 2, resources: {rollout_node: 1}}
        router: {enabled: true, num_cpus: 1}
        env: {replicas: 1, num_cpus: 1}

Every role's actor reserves `num_cpus` and the custom Ray `resources` given (a node's label resource pins a
role to a node); the placement group holds one bundle per actor, so the whole job is placed, or waits, at once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LaunchConfig", "RayLaunchConfig", "RoleResources"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RoleResources(_Section):
    num_cpus: float = Field(
        1.0, gt=0.0, description="CPUs each actor of this role reserves (its OMP threads)"
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each actor needs (e.g. {node_a: 1} to pin it)"
    )


class ReplicatedRole(RoleResources):
    replicas: int = Field(
        1, ge=0, le=1024, description="actors of this role (0: the role runs in the trainer)"
    )


class RouterRole(RoleResources):
    enabled: bool = Field(True, description="a `vriksha router` in front of the rollout servers")


class RayLaunchConfig(_Section):
    address: str = Field(
        "auto", description="the Ray cluster to join (ray.init address; auto: a running one)"
    )
    namespace: str = Field("vriksha", description="Ray namespace of the job's named actors")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="placement group strategy over the cluster's nodes"
    )
    trainer: RoleResources = Field(
        default_factory=RoleResources, description="each trainer rank (--nproc ranks)"
    )
    rollout: ReplicatedRole = Field(
        default_factory=ReplicatedRole,
        description="`vriksha serve` rollout servers (0: the colocated engine)",
    )
    router: RouterRole = Field(
        default_factory=RouterRole, description="the router in front of the rollout servers"
    )
    env: ReplicatedRole = Field(
        default_factory=ReplicatedRole,
        description="`vriksha env serve` environment servers (0: in the trainer)",
    )
    max_restarts: int = Field(
        3,
        ge=0,
        le=1000,
        description="restarts of one rollout, router or environment actor before the job stops",
    )
    startup_timeout_s: float = Field(
        600.0, gt=0.0, description="seconds to wait for the placement and the servers"
    )


class LaunchConfig(_Section):
    ray: RayLaunchConfig = Field(default_factory=RayLaunchConfig, description="the Ray launcher's placement")
