"""The GRPO loop: rollouts on the colocated engine, group advantages, FSDP2 update, eval, checkpoints.

for step in steps:
    sync the engine's weights with the policy (aliased with one rank, all-gathered otherwise)
    play this rank's prompts x group_size episodes through the engine
      (rollout.max_staleness K >= 1: take the batch a producer thread played ahead, under weights K
       versions old, and hand it this step's weights afterwards; see async_rollout.py)
    group-relative advantages; groups with no reward variance are counted and skipped
    micro-batched GRPO loss (global token normalisation) -> backward -> clip -> AdamW -> schedule
    log; evaluate every eval_interval; checkpoint every checkpoint_interval

With LoRA (`model.lora.rank > 0`, `lora.py`) only the adapters train; the engine plays with the adapter merged
into its weights (taken out bit for bit before each update), servers get the adapter alone, checkpoints hold
the adapter and its optimizer state, and the run ends with the adapter in PEFT's format (`<output_dir>/adapter`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import resource
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

import vriksha.device as devices
from vriksha.envs.pass_at_k import report_ks, sampled_scores
from vriksha.errors import ConfigError
from vriksha.profiling import phase
from vriksha.train.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from vriksha.train.config import OptimConfig, TrainConfig
from vriksha.train.distributed import EngineWeights, ParallelDims, all_reduce, init_distributed, shard_range
from vriksha.train.dynamic_sampling import SampledGroups
from vriksha.train.export import export_model
from vriksha.train.grpo import group_advantages, without_truncated
from vriksha.train.lora import AdapterSync, apply_lora, check_lora_parallel, export_lora
from vriksha.train.lora_producer import producer_engine
from vriksha.train.losses import ReverseKL, build_loss
from vriksha.train.metrics import MetricsWriter, rollout_summary, summary_table, write_plots
from vriksha.train.offpolicy import OffPolicy
from vriksha.train.parallelize import check_tp_degree, parallelize
from vriksha.train.policy import load_run_policy
from vriksha.train.precision import TrainPrecision, resolve_precision
from vriksha.train.rollout import Episode, RolloutWorker, StepRollout, episode_seed
from vriksha.train.rollout_engine import TrainingEngine, build_engine, colocated_engine
from vriksha.train.shared_dir import check_shared_dir
from vriksha.train.step_loop import checkpoint_at_end, checkpoint_due, progress_bar, stamp, step_range
from vriksha.train.step_metrics import StepMetrics
from vriksha.train.teacher import RemoteTeacher, is_remote, load_local_teacher
from vriksha.train.update import Learner, UpdateBatch, policy_update

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from vriksha.lora import LoraAdapter

logger = logging.getLogger(__name__)

__all__ = ["GRPOTrainer", "build_scheduler"]

EVAL_SEED_BASE = 1_000_000_007


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps))
        shape = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _peak_memory_gb(device: torch.device) -> dict[str, float]:
    """This process's peak resident memory so far (and the accelerator's peak allocation), in GiB."""
    out = {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # Linux: KiB
    peak = devices.peak_memory_bytes(device)
    if peak is not None:
        out["device_peak_gb"] = peak / 2**30
    return out


class GRPOTrainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False, profile: Any = None) -> None:
        self.cfg = cfg
        self.resume = resume
        self.profile_cfg = profile
        self.out_dir = Path(cfg.trainer.output_dir)
        par = cfg.parallel
        self.pd: ParallelDims = init_distributed(
            dp_replicate=par.dp_replicate, dp_shard=par.dp_shard, tp=par.tp
        )
        shard_range(cfg.rollout.prompts_per_step, 0, self.pd.world_size)  # fail early on an uneven split
        check_shared_dir(self.out_dir, self.pd.rank, self.pd.world_size)  # before any rank writes there
        self._setup()

    # -- setup ---------------------------------------------------------------

    def _setup(self) -> None:
        cfg, pd = self.cfg, self.pd
        model, self.tokenizer = load_run_policy(cfg, pd.is_main, self.out_dir)
        check_tp_degree(model.config, pd.tp)
        module: nn.Module = model
        module.to(pd.device)  # in place
        # the engine's own full copy: kept in step by full_tensor() of the sharded parameters
        self.engine_module = copy.deepcopy(model).eval().requires_grad_(False)
        # off-policy: the producer's module, loaded only between its batches (so not aliased with the policy)
        off_policy = cfg.rollout.max_staleness > 0
        if off_policy and pd.world_size > 1:
            raise ConfigError(
                f"rollout.max_staleness: off-policy rollouts run with one trainer process in this version "
                f"(got {pd.world_size}); train with --nproc 1 or set rollout.max_staleness=0"
            )
        producer_module = copy.deepcopy(model).eval().requires_grad_(False) if off_policy else None
        chosen = [resolve_precision(cfg.model.mixed_precision, model, pd.device) if pd.is_main else None]
        dist.broadcast_object_list(chosen, src=0)  # one measurement, the same mode on every rank
        precision = chosen[0]
        assert precision is not None  # rank 0's, on every rank
        self.precision: TrainPrecision = precision
        if pd.is_main:
            logger.info("%s", self.precision.describe())
        mp = self.precision.fsdp_param_dtype
        vocab = cfg.parallel.shard_vocab
        self.ref_model = None
        if cfg.grpo.kl_coef > 0:  # the initial model: with LoRA, the base without adapters
            self.ref_model = parallelize(copy.deepcopy(model).requires_grad_(False), pd, mp, vocab)
        self.teacher = self._teacher(mp, vocab) if cfg.algorithm == "opd" else None
        self.lora = cfg.model.lora if cfg.model.lora.enabled else None
        if self.lora is not None:  # after every plain copy above: they stay without adapters
            check_lora_parallel(self.lora, pd.tp)
            apply_lora(model, self.lora, cfg.trainer.seed)
        self.policy = parallelize(model, pd, mp, vocab)
        o = cfg.optim
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        lr = self.lora.lr if self.lora is not None and self.lora.lr is not None else o.lr
        self.optimizer = torch.optim.AdamW(
            trainable, lr=lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = build_scheduler(self.optimizer, o, cfg.trainer.steps)
        self.start_step = 0
        self.state: dict[str, Any] = {}
        if self.resume:
            ckpt = find_checkpoint(self.out_dir)
            self.state = load_checkpoint(
                ckpt,
                self.policy,
                self.optimizer,
                self.scheduler,
                pd.rank,
                trainable_only=self.lora is not None,
            )
            self.start_step = int(self.state["step"])
            if self.start_step > cfg.trainer.steps:
                raise ConfigError(
                    f"trainer.steps: {cfg.trainer.steps} is below the checkpoint's step {self.start_step}"
                )
        self.engine_weights: EngineWeights | AdapterSync = (
            EngineWeights(self.policy, self.engine_module, pd.world_size)
            if self.lora is None
            else AdapterSync.for_run(self.policy, self.engine_module, pd.world_size, cfg, self.out_dir.name)
        )
        self.learner = Learner(
            self.policy,
            self.optimizer,
            ReverseKL.of(cfg) if cfg.algorithm == "opd" else build_loss(cfg.loss_config()),
            cfg.grpo,
            pd.device,
            max_grad_norm=o.max_grad_norm,
            ref_model=self.ref_model,
            dims=pd,
            precision=self.precision,
            teacher=self.teacher,
        )
        self._setup_rollout(producer_module)
        self.metrics = MetricsWriter(
            self.out_dir,
            enabled=pd.is_main,
            tensorboard=cfg.trainer.tensorboard,
            resume_step=self.start_step if self.resume else None,
        )
        self._engine_stale = True
        self._elapsed = float(self.state.get("elapsed_s", 0.0))

    def _teacher(self, param_dtype: torch.dtype | None, shard_vocab: bool) -> nn.Module | RemoteTeacher:
        """`algorithm: opd`: the teacher, on a server or as a frozen model sharded like the reference."""
        opd = self.cfg.opd
        if is_remote(opd.teacher):
            return RemoteTeacher(opd, self.tokenizer)
        model = load_local_teacher(opd, self.tokenizer, self.cfg.trainer.seed)
        check_tp_degree(model.config, self.pd.tp)
        module: nn.Module = model
        module.to(self.pd.device)  # in place
        return parallelize(model, self.pd, param_dtype, shard_vocab)

    def _setup_rollout(self, producer_module: PreTrainedModel | None) -> None:
        """The engine over the engine module (rollouts; evaluation and export always), what each step
        plays, and with off-policy rollouts the producer over its own module and engine."""
        cfg, pd = self.cfg, self.pd
        self.rollout = StepRollout(
            self.tokenizer, cfg.env, cfg.rollout, cfg.trainer.seed, pd.rank, pd.world_size
        )

        def engine_over(
            module: PreTrainedModel, adapter: Callable[[], LoraAdapter | None] | None
        ) -> TrainingEngine:
            return build_engine(
                module,
                self.tokenizer,
                cfg.rollout,
                cfg.model,
                out_dir=self.out_dir,
                rank=pd.rank,
                start_version=self.start_step,
                adapter=adapter,
            )

        weights = self.engine_weights
        own_adapter = (lambda: weights.adapter) if isinstance(weights, AdapterSync) else None
        self.offpolicy: OffPolicy | None = None
        if cfg.grpo.on_policy == "exact":
            self.llm = self._exact_engine()
        elif producer_module is None:
            self.llm = engine_over(self.engine_module, own_adapter)
        else:  # the producer plays on its own engine; evaluation and export run here over the current weights
            self.llm = colocated_engine(self.engine_module, self.tokenizer, cfg.rollout.engine)
        self.worker = RolloutWorker(self.llm, self.tokenizer, cfg.env, cfg.rollout)
        if producer_module is not None:
            tc, k = cfg.trainer, cfg.rollout.max_staleness
            stop_at = step_range(tc, self.start_step).stop - 1
            make_engine, params = producer_engine(
                weights, producer_module, engine_over, colocated=cfg.rollout.mode == "colocated"
            )
            self.offpolicy = OffPolicy(
                producer_module,
                make_engine,
                self.rollout,
                self.engine_weights,
                max_staleness=k,
                start_version=self.start_step,
                # K batches past the last step of this invocation: what a checkpoint there needs next
                last_step=min(tc.steps, stop_at + k),
                saved=self.state,
                params=params,
            )

    def _exact_engine(self) -> TrainingEngine:
        """`grpo.on_policy: exact`: rollouts (and evaluation) sample from the policy module itself, under the
        update's precision, in the lockstep calls the update repeats (see lockstep.py)."""
        from vriksha.train.exact_engine import ExactEngine

        if self.pd.world_size > 1:
            raise ConfigError(
                f"grpo.on_policy: exact runs with one trainer process (got {self.pd.world_size}: each rank "
                "would run its own number of sharded forwards); train with --nproc 1 or set "
                "grpo.on_policy=default"
            )
        device = self.pd.device
        return ExactEngine(self.policy, self.tokenizer, precision=lambda: self.precision.autocast(device))

    # -- pieces of a step ----------------------------------------------------

    @contextlib.contextmanager
    def _pool_released(self) -> Iterator[None]:
        """With rollout.release_during_update: the engine's KV pool freed for the update, taken back after."""
        if not self.cfg.rollout.release_during_update:
            yield
            return
        sleep, wake_up = getattr(self.llm, "sleep", None), getattr(self.llm, "wake_up", None)
        if sleep is None or wake_up is None:
            raise ConfigError(
                f"rollout.release_during_update: this run's engine ({type(self.llm).__name__}) cannot release "
                "its memory; drop the option"
            )
        with phase("train.engine_sleep"):
            sleep()
        try:
            yield
        finally:
            with phase("train.engine_wake_up"):
                wake_up()

    def _sync_engine(self) -> float:
        """Bring the engine up to date before it plays: new weights, or else an empty prefix cache.

        Either way every rollout and evaluation starts from a cold cache, so what it plays depends
        on the weights and seeds alone, not on what this process played before: a prefix reused
        from an earlier play (an evaluation before an unchanged-weights step) gives KV that differs
        in the last bits from a fresh prefill, and a resumed process has no such entries, so it
        would not repeat the uninterrupted run bit for bit.
        """
        if not self._engine_stale:
            if not self.llm.flush_cache():
                logger.warning("prefix cache not fully flushed: requests still hold entries")
            return 0.0
        t0 = time.perf_counter()
        with phase("train.weight_sync"):
            self.engine_weights.sync()
            self.llm.weights_updated()
        self._engine_stale = False
        return time.perf_counter() - t0

    def evaluate(self, step: int) -> dict[str, Any]:
        """Greedy, one episode per held-out seed, split round-robin over ranks."""
        cfg = self.cfg
        n = cfg.trainer.eval_episodes
        t0 = time.perf_counter()
        self._sync_engine()
        mine = [
            episode_seed(EVAL_SEED_BASE, cfg.trainer.seed, i)
            for i in range(self.pd.rank, n, self.pd.world_size)
        ]
        groups = self.worker.play(
            mine, cfg.env.eval_split, 1, greedy=True, max_new_tokens=cfg.trainer.eval_max_new_tokens
        )
        played = [e for g in groups for e in g]
        local = [
            float(len(played)),
            sum(e.success for e in played),
            sum(e.reward for e in played),
            sum(e.num_generated for e in played),
        ]
        episodes, successes, reward, tokens = all_reduce(local, "sum", self.pd.device)
        out = {
            "step": step,
            "episodes": int(episodes),
            "success_rate": successes / max(1, episodes),
            "reward": reward / max(1, episodes),
            "completion_tokens/mean": tokens / max(1, episodes),
            "time/eval_s": time.perf_counter() - t0,
        }
        if cfg.trainer.eval_samples:
            out.update(self._sampled_eval(mine))
            out["time/eval_s"] = time.perf_counter() - t0
        self.metrics.log_eval(out)
        logger.info("eval at step %d: success %.1f%%", step, 100 * out["success_rate"])
        return out

    def _sampled_eval(self, seeds: list[int]) -> dict[str, float]:
        """pass@k and avg@K of the held-out episodes `seeds` (this rank's), each sampled `eval_samples` times
        at the rollout temperature, over all ranks."""
        cfg = self.cfg
        k_max = cfg.trainer.eval_samples
        groups = self.worker.play(
            seeds,
            cfg.env.eval_split,
            k_max,
            sampling_seeds=seeds,
            max_new_tokens=cfg.trainer.eval_max_new_tokens,
        )
        ks = report_ks(k_max)
        local = [0.0] * (len(ks) + 2)
        if groups:
            scores = sampled_scores(
                [[e.success for e in g] for g in groups], [[e.reward for e in g] for g in groups], 1.0, 0
            )
            n = len(groups)
            local = [scores.pass_at[k] * n for k in ks] + [scores.avg_success * n, float(n)]
        *sums, avg, episodes = all_reduce(local, "sum", self.pd.device)
        row = {f"pass@{k}": total / max(1.0, episodes) for k, total in zip(ks, sums, strict=True)}
        row[f"avg@{k_max}"] = avg / max(1.0, episodes)
        return row

    def _tp_gather(self, mine: list[list[Episode]]) -> list[list[Episode]]:
        """Every rank plays its own prompts; the `tp` ranks of a data-parallel group train on the
        union of theirs (consecutive ranks, so in prompt order)."""
        if self.pd.tp == 1:
            return mine
        parts: list[Any] = [None] * self.pd.tp
        dist.all_gather_object(parts, mine, group=self.pd.tp_mesh.get_group())
        return [g for part in parts for g in part]

    def _step(self, step: int) -> dict[str, Any]:
        cfg = self.cfg
        t0 = time.perf_counter()
        taken = None
        sampled: SampledGroups | None  # None: a batch restored from a checkpoint
        if self.offpolicy is None:
            sync_s = self._sync_engine()
            t1 = time.perf_counter()
            played = self.rollout.play(self.llm, step)
            mine, sampled = played.groups, played
            rollout_s = time.perf_counter() - t1
        else:  # played ahead by the producer; a batch past max_staleness is dropped
            sync_s = 0.0
            taken = self.offpolicy.take(step)
            mine, rollout_s, sampled = taken.groups, taken.seconds, taken.sampled
        if self.engine_weights.release():  # LoRA, one process: the base the update reads is the engine's
            self._engine_stale = True
        groups = self._tp_gather(mine)
        own = range(self.pd.tp_rank * len(mine), (self.pd.tp_rank + 1) * len(mine))  # mine within groups
        t2 = time.perf_counter()
        with phase("train.reward"):
            rewards = torch.tensor([[e.reward for e in g] for g in groups], dtype=torch.float64)
            adv = group_advantages(rewards, scale=cfg.grpo.scale_rewards)
            dropped = taken is not None and taken.dropped
            distill = cfg.algorithm == "opd"  # every group trains: the teacher's scores are the signal
            kept = [i for i in range(len(groups)) if (distill or bool(adv.keep[i])) and not dropped]
        trained = [groups[i] for i in kept]
        if cfg.grpo.mask_truncated_completions:
            trained = without_truncated(trained)
        batch = UpdateBatch(
            trained,
            [adv.advantages[i].tolist() for i in kept],
            groups[0],
            self.tokenizer.pad_token_id,
        )
        with self._pool_released():
            result = policy_update(self.learner, batch)
        with warnings.catch_warnings():  # a step whose groups all lacked signal ran no optimizer step
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
            self.scheduler.step()
        self._engine_stale = self._engine_stale or result.optimizer_steps > 0
        t3 = time.perf_counter()
        if self.offpolicy is not None:
            sync_s = self.offpolicy.publish(step)
        with_signal = sum(bool(adv.keep[i]) for i in own)
        local = StepMetrics.of_rank(
            [e for g in mine for e in g],
            [a for i in kept if i in own for a in adv.advantages[i].tolist()],
            result,
            groups=len(mine),
            zero_variance_groups=len(own) - with_signal,
            played_groups=sampled.played if sampled else len(mine),  # None: restored from a checkpoint
            played_with_signal=sampled.with_signal if sampled else with_signal,
            seconds=(sync_s, rollout_s, t3 - t2),
            memory=_peak_memory_gb(self.pd.device),
        )
        total = local.reduce(self.pd.device)
        lr = float(self.scheduler.get_last_lr()[0])
        row = total.row(step, result.grad_norm, lr, time.perf_counter() - t0)
        if taken is not None:
            row.update(taken.metrics.row())
        return row

    # -- the loop ------------------------------------------------------------

    def _checkpoint(self, step: int) -> None:
        state = {"elapsed_s": self._elapsed, "world_size": self.pd.world_size, "mesh": self.pd.shape}
        if self.offpolicy is not None:  # the batches played ahead under older weights (see offpolicy.py)
            state.update(self.offpolicy.state(step))
        save_checkpoint(
            self.out_dir,
            step,
            self.policy,
            self.optimizer,
            self.scheduler,
            state,
            self.pd.rank,
            trainable_only=self.lora is not None,
        )

    def fit(self) -> dict[str, Any]:
        try:
            return self._fit()
        finally:
            if self.offpolicy is not None:
                self.offpolicy.close()
            self.llm.close()  # server mode: stops the server it started

    def _fit(self) -> dict[str, Any]:
        tc = self.cfg.trainer
        profiler = None
        if self.profile_cfg is not None:
            from vriksha.profiling import StepProfiler

            profiler = StepProfiler(self.profile_cfg, rank=self.pd.rank, name="train")
            profiler.start()
        evals = list(self.metrics.evals)
        if tc.eval_episodes and not self.resume:
            evals.append(self.evaluate(0))
        bar = progress_bar(tc, self.start_step, "grpo", self.pd.is_main)
        steps = step_range(tc, self.start_step)
        step = self.start_step
        for step in steps:
            row = self._step(step)
            self._elapsed = stamp(row, self._elapsed, self.precision.mode)
            self.metrics.log_step(row)
            bar.update(1)
            extra = {}
            if "async/staleness_mean" in row:
                extra = {"stale": f"{row['async/staleness_mean']:.1f}", "drop": row["async/dropped_total"]}
            bar.set_postfix(
                reward=f"{row['reward/mean']:.3f}",
                tok_s=f"{row['perf/tokens_per_s']:.0f}",
                skip=f"{row['groups/zero_variance']}/{row['groups/total']}",
                st_h=f"{row['perf/steps_per_hour']:.0f}",
                **extra,
            )
            if profiler is not None:
                profiler.step()
            if tc.eval_episodes and tc.eval_interval and step % tc.eval_interval == 0 and step < tc.steps:
                evals.append(self.evaluate(step))
            if checkpoint_due(tc, step, steps):
                self._checkpoint(step)
        bar.close()
        finished = step == tc.steps
        if finished and tc.eval_episodes and (not evals or evals[-1]["step"] != step):
            evals.append(self.evaluate(step))
        if checkpoint_at_end(tc, step, self.start_step, self.resume):
            self._checkpoint(step)
        if profiler is not None:
            profiler.stop()
        summary: dict[str, Any] = {"step": step, "finished": finished, "precision": self.precision.mode}
        if finished:
            summary.update(self._finish(evals))
        self.metrics.close()
        return summary

    def _finish(self, evals: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if isinstance(self.engine_weights, AdapterSync):  # the adapter always; the merged model on request
            out.update(export_lora(self.engine_weights, self.tokenizer, self.out_dir, self.pd.rank, self.cfg))
        elif self.cfg.trainer.export:
            self._sync_engine()
            path = export_model(
                self.policy, self.engine_module, self.tokenizer, self.out_dir / "final", self.pd.rank
            )
            out["export"] = str(path) if path else None
        if self.pd.is_main:
            plots = write_plots(self.out_dir, self.metrics.history, evals)
            before = next((e for e in evals if e["step"] == 0), None)
            after = evals[-1] if evals and evals[-1]["step"] > 0 else None
            table = summary_table(before, after)
            (self.out_dir / "summary.md").write_text(table + "\n")
            out.update({"plots": [str(p) for p in plots], "table": table, "before": before, "after": after})
            out["rollouts"] = rollout_summary(self.metrics.history)
            (self.out_dir / "summary.json").write_text(json.dumps(out, indent=2, default=str))
        return out
