"""LoRA training: PEFT's adapter layers on the frozen policy, their tensor-parallel plan, the adapter as a record,
and the engine kept at base + adapter by merging in place.

`apply_lora` injects PEFT's `lora.Linear` layers into the Transformers model in place (no `PeftModel` wrapper:
module names, the forward, FSDP2's blocks, the tensor-parallel plan and the chunked log-prob head stay as they
are) and freezes the base: only A and B train, hold gradients and optimizer state. FSDP2 shards the frozen base
with them (it is never reduced or updated; each rank holds 1/dp of it).

The engine: the rollout engine runs a plain module (no adapter layers, so its fast linear paths and native
decode apply) whose adapted weights hold `W + scaling * B A`, merged in place before it plays
(`vriksha/lora/merge.py`, undone bit for bit). With one process the engine module's weights are the policy's own
storage, so the merge is undone before each update (`AdapterSync.release`); with several, the engine module is
a copy of the base that only ever changes by merging.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from vriksha.errors import ConfigError
from vriksha.lora import LoraAdapter, LoraWeights
from vriksha.lora.merge import MergedWeights
from vriksha.train.config import LoraSection, TrainConfig
from vriksha.train.policy import decoder_layers

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

logger = logging.getLogger(__name__)

__all__ = [
    "AdapterSync",
    "adapter_tensors",
    "apply_lora",
    "gather_adapter",
    "lora_layers",
    "lora_targets",
    "lora_tp_plan",
]

ADAPTER = "default"  # PEFT's name for the one adapter a model trains


def _decoder(model: nn.Module) -> nn.Module:
    return decoder_layers(model, "model.lora", "", "name the layers to adapt in model.lora.target_modules")


def lora_targets(model: nn.Module, names: Sequence[str] | None) -> list[str]:
    """The full names of the linear layers to adapt: every one of the decoder's (`names` None), or those whose
    name is or ends with one of `names`; ConfigError naming a name that matches none."""
    if names is None:
        prefix = "model.layers."
        _decoder(model)
        found = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith(prefix)]
        if not found:
            raise ConfigError(f"model.lora: {type(model).__name__}'s decoder has no linear layers to adapt")
        return found
    linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    found = []
    for want in names:
        hits = [n for n in linear if n == want or n.endswith("." + want)]
        if not hits:
            suffixes = sorted({n.rsplit(".", 1)[-1] for n in linear})
            raise ConfigError(
                f"model.lora.target_modules: {want!r} names no linear layer of the model; its linear layers "
                f"end in {', '.join(suffixes)}"
            )
        found += [n for n in hits if n not in found]
    return sorted(found, key=linear.index)


def apply_lora(model: nn.Module, cfg: LoraSection, seed: int) -> list[str]:
    """Inject rank-`cfg.rank` adapters into `model` in place (A from `seed` on every rank alike, B zero or
    `init_b_std` noise from the same seed), freeze
    everything else, keep A and B in float32; returns the adapted modules' names."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = lora_targets(model, cfg.target_modules)
    config = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # PEFT annotates int, computes with any number
        lora_dropout=cfg.dropout,
        target_modules=targets,
        init_lora_weights=True if cfg.init == "default" else "gaussian",
        use_rslora=cfg.use_rslora,
    )
    with torch.random.fork_rng(devices=[]):  # the run's own random streams are not moved
        torch.manual_seed(seed)
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
        if cfg.init_b_std > 0:
            with torch.no_grad():
                for layer in lora_layers(model).values():
                    b = layer.lora_B[ADAPTER]
                    assert isinstance(b, nn.Linear)
                    b.weight.normal_(0.0, cfg.init_b_std)
    model.requires_grad_(False)
    for layer in lora_layers(model).values():
        for part in (layer.lora_A[ADAPTER], layer.lora_B[ADAPTER]):
            part.float().requires_grad_(True)
        if cfg.dropout > 0:
            layer.lora_dropout[ADAPTER].train()  # the policy is in eval mode; its adapters' dropout is not
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info(
        "LoRA rank %d (alpha %g) on %d linear layers: %d trainable parameters of %d",
        cfg.rank,
        cfg.alpha,
        len(targets),
        trainable,
        sum(p.numel() for p in model.parameters()),
    )
    return targets


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """The adapted layers by module name (empty for a model without adapters)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return {}
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def lora_tp_plan(model: nn.Module, plan: dict[str, ParallelStyle]) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan for a model with adapters: the base layer of an adapted projection takes its
    style, and the adapter follows it without more communication. Column-wise (q/k/v, gate/up): A stays
    replicated on the replicated input and B is split by output columns like W. Row-wise (o, down): A is split
    by input rows like W (its partial sums all-reduced: `rank` numbers per token), B stays replicated."""
    layers = lora_layers(model)
    if not layers:
        return plan
    out: dict[str, ParallelStyle] = {}
    for name, style in plan.items():
        if name not in layers:
            out[name] = style
            continue
        out[f"{name}.base_layer"] = style
        if isinstance(style, ColwiseParallel):
            out[f"{name}.lora_B.{ADAPTER}"] = ColwiseParallel()
        elif isinstance(style, RowwiseParallel):
            out[f"{name}.lora_A.{ADAPTER}"] = RowwiseParallel()
        else:
            raise ConfigError(
                f"model.lora: {name} is split by {type(style).__name__} under tensor parallel, which has no "
                "adapter plan; leave it out of model.lora.target_modules or train with parallel.tp=1"
            )
    return out


def check_lora_parallel(cfg: LoraSection, tp: int) -> None:
    if cfg.dropout > 0 and tp > 1:
        raise ConfigError(
            f"model.lora.dropout: {cfg.dropout} with parallel.tp={tp}: the tensor-parallel ranks would drop "
            "different inputs of their replicated A; set model.lora.dropout=0 or parallel.tp=1"
        )


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor: every rank calls it in the same order)."""
    return p.full_tensor().detach() if isinstance(p, DTensor) else p.detach()


def linear_weight(module: nn.Module) -> torch.Tensor:
    """A linear layer's weight, typed."""
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def gather_adapter(model: nn.Module, name: str, cfg: LoraSection, base_model: str | None) -> LoraAdapter:
    """The policy's current adapter as a record (collective under FSDP2 / tensor parallel). With one process the
    tensors may be the live parameters themselves: copy what must outlive the next update."""
    modules = {
        module: LoraWeights(
            _full(linear_weight(layer.lora_A[ADAPTER])), _full(linear_weight(layer.lora_B[ADAPTER]))
        )
        for module, layer in lora_layers(model).items()
    }
    targets = tuple(sorted({m.rsplit(".", 1)[-1] for m in modules}))
    return LoraAdapter(
        name,
        cfg.rank,
        cfg.alpha,
        targets,
        modules,
        use_rslora=cfg.use_rslora,
        dropout=cfg.dropout,
        base_model=base_model,
    )


def adapter_tensors(adapter: LoraAdapter) -> list[torch.Tensor]:
    """A and B of every module, in module order: what a weight version of the adapter is."""
    return [t for w in adapter.modules.values() for t in (w.a, w.b)]


def _base_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


class AdapterSync:
    """Keeps a plain module that the engine reads at base + the policy's current adapter.

    `sync()` gathers the adapter (collective) and, with `merge` (a colocated engine reads the module), merges it
    into the module in place; `release()` takes it out again where the module's base weights are the policy's
    own storage (one process), which the next update must see unmerged. `full_tensors()` is the adapter as a
    list (the off-policy producer's weight versions)."""

    def __init__(
        self,
        policy: nn.Module,
        engine_module: nn.Module,
        world_size: int,
        cfg: LoraSection,
        *,
        name: str,
        base_model: str | None,
        merge: bool,
    ) -> None:
        self.policy = policy
        self.engine_module = engine_module
        self.cfg = cfg
        self.name = name
        self.base_model = base_model
        self.merge = merge
        self.aliased = world_size == 1 and self._alias()
        targets = list(lora_layers(policy))
        self.merged = MergedWeights({n: linear_weight(engine_module.get_submodule(n)).data for n in targets})
        self.adapter: LoraAdapter | None = None

    @classmethod
    def for_run(
        cls, policy: nn.Module, engine_module: nn.Module, world_size: int, cfg: TrainConfig, name: str
    ) -> AdapterSync:
        """The run's: the adapter named after its output directory; merged into the engine module for a
        colocated engine (servers take the adapter alone)."""
        return cls(
            policy,
            engine_module,
            world_size,
            cfg.model.lora,
            name=name,
            base_model=cfg.model.path,
            merge=cfg.rollout.mode == "colocated",
        )

    def _alias(self) -> bool:
        """One process: the engine module's parameters become the policy's frozen base storage (no copy)."""
        target = dict(self.engine_module.named_parameters())
        pairs = []
        for name, p in self.policy.named_parameters():
            if p.requires_grad:
                continue
            q = target.get(_base_name(name))
            local = p.to_local() if isinstance(p, DTensor) else p.data
            if q is None or local.shape != q.shape or local.dtype != q.dtype or local.device != q.device:
                return False  # not the same layout: the engine module keeps its own copy of the base
            pairs.append((q, local))
        for q, local in pairs:
            q.data = local
        return True

    def gather(self) -> LoraAdapter:
        self.adapter = gather_adapter(self.policy, self.name, self.cfg, self.base_model)
        return self.adapter

    @torch.no_grad()
    def sync(self) -> None:
        adapter = self.gather()
        if self.merge:
            self.merged.unmerge()
            self.merged.merge(adapter)

    def release(self) -> bool:
        """Before an update: the policy's base back to itself (one process); True if the engine module changed."""
        return self.aliased and self.merged.unmerge()

    def full_tensors(self) -> list[torch.Tensor]:
        return adapter_tensors(self.gather())


def export_adapter(sync: AdapterSync, out_dir: Path, rank: int) -> Path | None:
    """Collective: the policy's adapter in PEFT's format under `out_dir` (rank 0 writes); the path on rank 0."""
    from vriksha.lora import save_peft_dir

    adapter = sync.gather()
    if rank == 0:
        save_peft_dir(adapter, out_dir)
        logger.info(
            "saved the adapter (%d modules, %.1f MB) to %s",
            len(adapter.modules),
            adapter.nbytes / 1e6,
            out_dir,
        )
    _barrier()
    return out_dir if rank == 0 else None


def export_merged(sync: AdapterSync, tokenizer: Any, out_dir: Path, rank: int) -> Path | None:
    """Collective: base + adapter merged, as a Transformers directory (`save_pretrained`, the tokenizer, the
    generation config) under `out_dir`; the path on rank 0. The engine module holds the base (a copy, or the
    policy's own storage with one process), into which the adapter is merged for the save."""
    adapter = sync.gather()
    if rank == 0:
        module = sync.engine_module
        was = sync.merged.adapter
        sync.merged.unmerge()
        sync.merged.merge(adapter)
        out_dir.mkdir(parents=True, exist_ok=True)
        cast(Any, module).save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        gen = getattr(module, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(out_dir)
        if was is None:  # as it was: the base alone where nothing was merged
            sync.merged.unmerge()
        logger.info("exported the merged model to %s", out_dir)
    _barrier()
    return out_dir if rank == 0 else None


def export_lora(
    sync: AdapterSync, tokenizer: Any, out_dir: Path, rank: int, cfg: TrainConfig
) -> dict[str, Any]:
    """Collective: the end of a LoRA run: `<out_dir>/adapter` always (megabytes), the merged model in
    `<out_dir>/final` where `trainer.export` asks for a Transformers directory; their paths on rank 0."""
    path = export_adapter(sync, out_dir / "adapter", rank)
    out: dict[str, Any] = {"adapter": str(path) if path else None}
    if cfg.trainer.export:
        path = export_merged(sync, tokenizer, out_dir / "final", rank)
        out["export"] = str(path) if path else None
    return out


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
