"""`algorithm: sft`: supervised fine-tuning on assistant tokens, with the GRPO trainer's pieces.

for step in steps:
    take the step's `sft.batch_size` examples (a seeded order of every example, epoch after epoch; a
      function of the step alone, so a resumed run trains on what the uninterrupted one would)
    this data-parallel rank's share, each example a one-sequence group (its first token the "prompt")
    the update of `update.py` with the token-mean NLL (`losses/sft.py`) -> clip -> AdamW -> schedule
    log; checkpoint every checkpoint_interval

The same policy loading, LoRA, mesh (FSDP2, tensor parallel), mixed precision, checkpoints and export as GRPO:
`<output_dir>/final` is a Transformers directory (with LoRA: the merged model, and `<output_dir>/adapter`)
that a GRPO config takes as its `model.path`.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vriksha.envs.play import Episode
from vriksha.errors import ConfigError
from vriksha.train.checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from vriksha.train.config import TrainConfig
from vriksha.train.distributed import ParallelDims, all_reduce, init_distributed, shard_range
from vriksha.train.export import export_model
from vriksha.train.lora import AdapterSync, apply_lora, check_lora_parallel, export_lora
from vriksha.train.losses import TokenNLL
from vriksha.train.metrics import MetricsWriter
from vriksha.train.parallelize import check_tp_degree, parallelize
from vriksha.train.policy import load_run_policy
from vriksha.train.precision import TrainPrecision, resolve_precision
from vriksha.train.sft_data import SFTExample, load_examples
from vriksha.train.shared_dir import check_shared_dir
from vriksha.train.step_loop import checkpoint_at_end, checkpoint_due, progress_bar, stamp, step_range
from vriksha.train.trainer import build_scheduler
from vriksha.train.update import Learner, UpdateBatch, policy_update

logger = logging.getLogger(__name__)

__all__ = ["SFTTrainer", "step_indices"]


def step_indices(step: int, batch_size: int, num_examples: int, seed: int, shuffle: bool) -> list[int]:
    """The examples of `step` (1-based): positions [(step-1) B, step B) of the epochs' orders laid end to end,
    epoch e's order a permutation seeded by (seed, e) (or the file order without `shuffle`)."""
    out = []
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, i = divmod(position, num_examples)
        out.append(_epoch_order(num_examples, seed, epoch)[i] if shuffle else i)
    return out


@functools.lru_cache(maxsize=4)
def _epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % 2**63)
    return torch.randperm(num_examples, generator=gen).tolist()


def _episode(index: int, example: SFTExample) -> Episode:
    n = len(example.ids) - 1
    return Episode(
        group=index,
        member=0,
        seed=index,
        prompt_ids=example.ids[:1],
        completion_ids=example.ids[1:],
        engine_logprobs=[0.0] * n,
        loss_mask=example.mask[1:],
    )


class SFTTrainer:
    def __init__(self, cfg: TrainConfig, resume: bool = False, profile: Any = None) -> None:
        if cfg.algorithm != "sft":
            raise ConfigError(f"algorithm: the SFT trainer runs algorithm sft (got {cfg.algorithm})")
        self.cfg = cfg
        self.resume = resume
        self.out_dir = Path(cfg.trainer.output_dir)
        par = cfg.parallel
        self.pd: ParallelDims = init_distributed(
            dp_replicate=par.dp_replicate, dp_shard=par.dp_shard, tp=par.tp
        )
        shard_range(cfg.sft.batch_size, 0, self.pd.dp, "sft.batch_size")  # fail early on an uneven split
        check_shared_dir(self.out_dir, self.pd.rank, self.pd.world_size)
        self._setup()

    def _setup(self) -> None:
        cfg, pd = self.cfg, self.pd
        model, self.tokenizer = load_run_policy(cfg, pd.is_main, self.out_dir)
        self.examples, cut = load_examples(
            self.tokenizer, cfg.sft.data, cfg.sft.only_successful, cfg.sft.max_length
        )
        if pd.is_main:
            logger.info("%d SFT examples (%d cut to %d tokens)", len(self.examples), cut, cfg.sft.max_length)
        check_tp_degree(model.config, pd.tp)
        module: torch.nn.Module = model
        module.to(pd.device)  # in place
        # the export's unsharded module (with LoRA: the base the adapter is merged into)
        self.plain = copy.deepcopy(model).eval().requires_grad_(False)
        chosen = [resolve_precision(cfg.model.mixed_precision, model, pd.device) if pd.is_main else None]
        dist.broadcast_object_list(chosen, src=0)
        precision = chosen[0]
        assert precision is not None
        self.precision: TrainPrecision = precision
        self.lora = cfg.model.lora if cfg.model.lora.enabled else None
        if self.lora is not None:
            check_lora_parallel(self.lora, pd.tp)
            apply_lora(model, self.lora, cfg.trainer.seed)
        self.policy = parallelize(model, pd, self.precision.fsdp_param_dtype, cfg.parallel.shard_vocab)
        o = cfg.optim
        trainable = [p for p in self.policy.parameters() if p.requires_grad]
        lr = self.lora.lr if self.lora is not None and self.lora.lr is not None else o.lr
        self.optimizer = torch.optim.AdamW(
            trainable, lr=lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = build_scheduler(self.optimizer, o, cfg.trainer.steps)
        self.start_step = 0
        state: dict[str, Any] = {}
        if self.resume:
            state = load_checkpoint(
                find_checkpoint(self.out_dir),
                self.policy,
                self.optimizer,
                self.scheduler,
                pd.rank,
                trainable_only=self.lora is not None,
            )
            self.start_step = int(state["step"])
            if self.start_step > cfg.trainer.steps:
                raise ConfigError(
                    f"trainer.steps: {cfg.trainer.steps} is below the checkpoint's step {self.start_step}"
                )
        self.adapter: AdapterSync | None = None
        if self.lora is not None:
            self.adapter = AdapterSync(
                self.policy,
                self.plain,
                pd.world_size,
                self.lora,
                name=self.out_dir.name,
                base_model=cfg.model.path,
                merge=False,
            )
        # the update's options: sft's micro-batches (one sequence a group), one epoch, the grpo log-prob chunks
        options = cfg.grpo.model_copy(
            update={
                "micro_batch_groups": cfg.sft.micro_batch_size,
                "epochs_per_batch": 1,
                "on_policy": "default",
            }
        )
        self.learner = Learner(
            self.policy,
            self.optimizer,
            TokenNLL(),
            options,
            pd.device,
            max_grad_norm=o.max_grad_norm,
            dims=pd,
            precision=self.precision,
        )
        self.metrics = MetricsWriter(
            self.out_dir,
            enabled=pd.is_main,
            tensorboard=cfg.trainer.tensorboard,
            resume_step=self.start_step if self.resume else None,
        )
        self._elapsed = float(state.get("elapsed_s", 0.0))

    def _step(self, step: int) -> dict[str, Any]:
        cfg, pd = self.cfg, self.pd
        t0 = time.perf_counter()
        chosen = step_indices(step, cfg.sft.batch_size, len(self.examples), cfg.trainer.seed, cfg.sft.shuffle)
        mine = [chosen[i] for i in shard_range(len(chosen), pd.dp_rank, pd.dp, "sft.batch_size")]
        groups = [[_episode(i, self.examples[i])] for i in mine]
        batch = UpdateBatch(groups, [[0.0]] * len(groups), groups[0], self.tokenizer.pad_token_id)
        result = policy_update(self.learner, batch)
        self.scheduler.step()
        reports = pd.tp_rank == 0
        local = [result.loss, result.tokens, float(len(groups))] if reports else [0.0, 0.0, 0.0]
        loss, tokens, sequences = all_reduce(local, "sum", pd.device)
        seconds = time.perf_counter() - t0
        return {
            "step": step,
            "loss": loss,  # the mean NLL per target token over the step
            "epoch": (step * cfg.sft.batch_size) / len(self.examples),
            "sequences": int(sequences),
            "target_tokens": int(tokens),
            "grad_norm": result.grad_norm,
            "lr": float(self.scheduler.get_last_lr()[0]),
            "time/step_s": seconds,
            "perf/tokens_per_s": tokens / max(seconds, 1e-9),
        }

    def _checkpoint(self, step: int) -> None:
        state = {"elapsed_s": self._elapsed, "world_size": self.pd.world_size, "mesh": self.pd.shape}
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
        tc = self.cfg.trainer
        bar = progress_bar(tc, self.start_step, "sft", self.pd.is_main)
        steps = step_range(tc, self.start_step)
        step = self.start_step
        for step in steps:
            row = self._step(step)
            self._elapsed = stamp(row, self._elapsed, self.precision.mode)
            self.metrics.log_step(row)
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.4f}", epoch=f"{row['epoch']:.2f}")
            if checkpoint_due(tc, step, steps):
                self._checkpoint(step)
        bar.close()
        finished = step == tc.steps
        if checkpoint_at_end(tc, step, self.start_step, self.resume):
            self._checkpoint(step)
        summary: dict[str, Any] = {"step": step, "finished": finished, "precision": self.precision.mode}
        if finished:
            summary.update(self._finish())
        self.metrics.close()
        return summary

    def _finish(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.adapter is not None:
            out.update(export_lora(self.adapter, self.tokenizer, self.out_dir, self.pd.rank, self.cfg))
        elif self.cfg.trainer.export:
            path = export_model(self.policy, self.plain, self.tokenizer, self.out_dir / "final", self.pd.rank)
            out["export"] = str(path) if path else None
        if self.pd.is_main:
            history = self.metrics.history
            out["loss_first"] = history[0]["loss"] if history else None
            out["loss_last"] = history[-1]["loss"] if history else None
            (self.out_dir / "summary.json").write_text(json.dumps(out, indent=2, default=str))
        return out
