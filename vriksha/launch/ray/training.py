"""A training job on Ray: place, start the services, run the trainer ranks, supervise (see launcher.py)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vriksha.errors import ConfigError, VrikshaError
from vriksha.launch.protocol import TrainJob
from vriksha.launch.ray.actors import TrainerRank
from vriksha.launch.ray.launcher import _bundle, _placement, events, replica_argv, resolve_paths
from vriksha.launch.ray.services import LaunchLog, Service, Services
from vriksha.net.trust import INTERNAL_KEY_ENV, WEIGHTS_KEY_ENV, env_key, new_key

logger = logging.getLogger(__name__)

__all__ = ["TrainingOnRay", "TrainerDied"]


class TrainerDied(VrikshaError):
    """A trainer rank died: the job stopped; a resubmission with --resume continues from the last checkpoint."""


class TrainingOnRay:
    def __init__(self, job: TrainJob, connect: Callable[[str, str], Any]) -> None:
        self.job = job
        self.rc = job.config.launch.ray
        self.cfg = resolve_paths(job.config.to_dict())
        self.out = Path(self.cfg["trainer"]["output_dir"])
        self.log = LaunchLog(self.out / "launch.jsonl")
        self.ray = connect(self.rc.address, self.rc.namespace)
        self.ranks = job.ranks.nproc * job.ranks.nnodes
        # the rollout servers take weights only from a trainer with this key; the router asks them with the other
        self.secrets = {
            WEIGHTS_KEY_ENV: env_key(WEIGHTS_KEY_ENV) or new_key(),
            INTERNAL_KEY_ENV: env_key(INTERNAL_KEY_ENV) or new_key(),
        }
        if self.rc.rollout.replicas and job.config.model.random_init is not None:
            raise ConfigError(
                "launch.ray.rollout.replicas: rollout servers load model.path; a model.random_init policy has no "
                "directory for them (set launch.ray.rollout.replicas=0 for the colocated engine)"
            )

    # ---- placement ----------------------------------------------------------------------------------
    def _plan(self) -> tuple[list[dict[str, float]], list[Service]]:
        rc, cfg = self.rc, self.job.config
        bundles = [_bundle(rc.trainer.num_cpus, rc.trainer.resources) for _ in range(self.ranks)]
        services: list[Service] = []

        def add(role: str, i: int, argv: list[str], res: Any) -> None:
            services.append(Service(role, i, argv, res.num_cpus, dict(res.resources), len(bundles)))
            bundles.append(_bundle(res.num_cpus, res.resources))

        env_args = [a for k, v in cfg.env.kwargs.items() for a in ("--env-arg", f"{k}={json.dumps(v)}")]
        for i in range(rc.env.replicas):
            add("env", i, ["env", "serve", cfg.env.name, "--host", "{host}", "--port", "{port}",
                           "--max-sessions", "4096", *env_args], rc.env)  # fmt: skip
        from vriksha.train.server_rollout import engine_flags

        serve = (["--model", self.cfg["model"]["path"]] if cfg.model.path else []) + engine_flags(
            cfg.rollout.engine, cfg.model.dtype
        )
        for i in range(rc.rollout.replicas):
            add("rollout", i, replica_argv("both", serve), rc.rollout)
        if rc.rollout.replicas and rc.router.enabled:
            add("router", 0, [], rc.router)  # its replicas are known once they run
        return bundles, services

    def _start_services(self, services: Services, planned: list[Service]) -> None:
        first = [s for s in planned if s.role != "router"]
        services.start(first)
        router = [s for s in planned if s.role == "router"]
        if router:
            specs = [a for s in services.by_role("rollout") for a in ("--replica", f"{s.url},{events(s)}")]
            model = ["--model", self.cfg["model"]["path"]] if self.job.config.model.path else []
            router[0].argv = ["router", "--host", "{host}", "--port", "{port}", *specs, *model]
            services.start(router)
        rollout = services.by_role("rollout")
        if rollout:
            self.cfg["rollout"].update(mode="server", servers=[s.url for s in rollout])
            if router:
                self.cfg["rollout"]["router"] = router[0].url
        if services.by_role("env"):
            self.cfg["env"]["servers"] = [s.url for s in services.by_role("env")]

    # ---- trainer ranks ------------------------------------------------------------------------------
    def _start_trainers(self, pg: Any) -> list[Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        rc = self.rc.trainer
        cls = self.ray.remote(TrainerRank)
        actors = [
            cls.options(
                name=f"vriksha-trainer-{r}",
                namespace=self.rc.namespace,
                num_cpus=rc.num_cpus,
                resources=dict(rc.resources) or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            ).remote(r, self.ranks, max(1, int(rc.num_cpus)))
            for r in range(self.ranks)
        ]
        master = self.ray.get(actors[0].publish_address.remote())  # rank 0's node and a free port there
        nodes = [n for n, _ in self.ray.get([a.where.remote() for a in actors])]
        per_node = Counter(nodes)
        seen: Counter[str] = Counter()
        refs = []
        for r, a in enumerate(actors):
            local = (seen[nodes[r]], per_node[nodes[r]])
            seen[nodes[r]] += 1
            refs.append(a.run.remote(self.cfg, self.job.resume, tuple(master), local, self.secrets))
        self.log.write("trainers", ranks=self.ranks, master=f"{master[0]}:{master[1]}", nodes=len(per_node))
        self._trainer_actors = actors
        return refs

    # ---- the job ------------------------------------------------------------------------------------
    def run(self) -> int:
        bundles, planned = self._plan()
        pg = _placement(self.ray, bundles, self.rc.strategy, self.rc.startup_timeout_s, self.log)
        services = Services(pg, self.rc.namespace, self.log, self.rc.startup_timeout_s, self.secrets)
        self._trainer_actors: list[Any] = []
        try:
            self._start_services(services, planned)
            refs = self._start_trainers(pg)
            return self._supervise(refs, services)
        finally:
            for a in self._trainer_actors:
                self.ray.kill(a)
            services.stop()
            self.ray.util.remove_placement_group(pg)
            self.log.write("stopped")

    def _supervise(self, trainer_refs: list[Any], services: Services) -> int:
        pending = list(trainer_refs)
        while pending:
            done, _ = self.ray.wait(pending + services.watches(), num_returns=1, timeout=1.0)
            for ref in done:
                if ref in pending:
                    pending.remove(ref)
                    self._trainer_result(ref, trainer_refs.index(ref))
                    continue
                s = services.find(ref)
                if s is not None:
                    logger.warning("%s died; starting it again at %s", s.name, s.url)
                    self.log.write("died", role=s.role, index=s.index)
                    services.restart(s, self.rc.max_restarts)
        self.log.write("finished", ranks=len(trainer_refs))
        return 0

    def _trainer_result(self, ref: Any, rank: int) -> None:
        from ray.exceptions import RayActorError, RayTaskError

        try:
            rc = self.ray.get(ref)
        except RayActorError as exc:
            self.log.write("trainer_died", rank=rank)
            raise TrainerDied(f"trainer rank {rank} died ({exc.__class__.__name__}); the job stopped. "
                              f"{self._resume_hint()}") from None  # fmt: skip
        except RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            logger.error("trainer rank %d failed:\n%s", rank, exc)  # with the rank's traceback
            self.log.write("trainer_failed", rank=rank, error=str(cause)[:500])
            if isinstance(cause, VrikshaError):  # a config or run error the trainer explained
                raise VrikshaError(str(cause)) from None
            raise VrikshaError(f"trainer rank {rank} failed: {cause}. {self._resume_hint()}") from None
        if rc:
            raise VrikshaError(f"trainer rank {rank} exited with {rc}. {self._resume_hint()}")

    def _resume_hint(self) -> str:
        from vriksha.train.checkpoint import CheckpointError, find_checkpoint

        try:
            ckpt = find_checkpoint(self.out)
        except CheckpointError:
            return "No checkpoint was written yet: submit the job again to start over."
        return f"Submit it again with --resume to continue from {ckpt} (the last verified checkpoint)."
