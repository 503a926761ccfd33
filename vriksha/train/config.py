"""Training configuration: one pydantic model per component, read from TOML or YAML, overridable with `--set`.

Every option has a default that runs on a 2-core CPU; every bad value is rejected with a
`ConfigError` that names the field (`grpo.clip_low: ...`): non-finite numbers anywhere (`.inf`,
`.nan`), counts past sane bounds (`MAX_STEPS`, ...), seeds outside 0..2^63-1. YAML files are read
without aliases (`*name`): a few lines of them can expand into billions of values.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from vriksha.engine.config import EngineConfig
from vriksha.errors import ConfigError
from vriksha.train.config_launch import LaunchConfig
from vriksha.train.config_yaml import load_yaml

__all__ = ["TrainConfig", "load_config", "apply_overrides", "parse_override", "engine_overrides"]

# engine options that follow the policy model (its path, dtype and device), not set for the rollout engine
POLICY_ENGINE_OPTIONS = ("model", "dtype", "device")


# upper bounds that no run reaches: a value past one is a typo or an attack (1e18 steps), not a plan
MAX_STEPS = 10_000_000
MAX_SEED = 2**63 - 1  # torch.manual_seed takes 64 bits; numpy's generators are seeded from hashes of it
MAX_TOKENS = 1 << 20
MAX_COUNT = 1 << 20  # prompts, completions, episodes, groups per step


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LoraSection(_Section):
    """LoRA (low-rank adapters, through PEFT): train `rank`-r adapters on the frozen base model's linear layers
    instead of every weight (see docs/training.md, "LoRA")."""

    rank: int = Field(
        0, ge=0, le=4096, description="adapter rank r; 0 (the default) trains every weight (full fine-tuning)"
    )
    alpha: float = Field(
        32.0, gt=0.0, description="lora_alpha: the adapter's output is scaled by alpha / rank"
    )
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input in the update's forwards (0: none)"
    )
    target_modules: list[str] | None = Field(
        None,
        description="linear layers to adapt, by name or name suffix (e.g. [q_proj, v_proj]); "
        "null: every linear layer of the decoder (attention and MLP projections; not the LM head)",
    )
    init: Literal["default", "gaussian"] = Field(
        "default",
        description="initialisation of A (B starts at zero, so step 0 is the base model): default = PEFT's "
        "Kaiming-uniform, gaussian = normal with std 1/rank",
    )
    use_rslora: bool = Field(
        False, description="rank-stabilised scaling alpha / sqrt(rank) instead of alpha / rank"
    )
    init_b_std: float = Field(
        0.0,
        ge=0.0,
        description="std of a normal draw for B at the start (0: zero, so step 0 is the base model; > 0: a "
        "perturbed model, e.g. a student that distillation brings back to its teacher)",
    )
    lr: float | None = Field(
        None,
        gt=0.0,
        description="peak learning rate of the adapters (null: optim.lr); adapters usually want about 10x "
        "full fine-tuning's, so a config can set both and switch with model.lora.rank alone",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and (not names or any(not n.strip() for n in names)):
            raise ValueError("name at least one module (or null for every linear layer of the decoder)")
        return names

    @property
    def enabled(self) -> bool:
        return self.rank > 0


class ModelConfig(_Section):
    """The policy: a Transformers directory, a GGUF file, or null for the embedded default."""

    path: str | None = Field(
        None, description="model path (HF directory or .gguf); null = embedded SmolLM2-135M"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    mixed_precision: Literal["auto", "none", "autocast", "bfloat16"] = Field(
        "auto",
        description="compute dtype of the update: auto = bf16 autocast over fp32 master weights where this "
        "machine's bf16 is measured faster, else fp32; none = fp32; autocast = bf16 autocast; "
        "bfloat16 = FSDP2 casts the parameters to bf16 for compute",
    )
    random_init: dict[str, Any] | None = Field(
        None,
        description="build a randomly initialised model from these Transformers config values "
        "(e.g. {model_type: llama, hidden_size: 64, num_hidden_layers: 2}) with the path's tokenizer; for tests",
    )
    lora: LoraSection = Field(
        default_factory=LoraSection, description="LoRA adapters instead of full fine-tuning (rank > 0)"
    )


class EnvConfig(_Section):
    """The environment episodes come from."""

    name: str = Field("arithmetic", description="registered environment name or 'package.module:Class'")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for make_env")
    options: dict[str, Any] = Field(default_factory=dict, description="reset options (e.g. level)")
    servers: list[str] = Field(
        default_factory=list,
        description="base URLs of `vriksha env serve` processes to play episodes on (empty: in this process)",
    )
    train_split: str = Field("train", description="split episodes are drawn from for training")
    eval_split: str = Field("test", description="held-out split for evaluation")


def _engine_config(value: Any) -> EngineConfig:
    if isinstance(value, EngineConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of engine options, got {value!r}")
    policy = [k for k in POLICY_ENGINE_OPTIONS if k in value]
    if policy:
        raise ValueError(
            f"{policy[0]}: the rollout engine runs the policy itself; set model.{'path' if policy[0] == 'model' else policy[0]} "
            "instead (the engine follows it)"
        )
    try:
        return EngineConfig.from_dict(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


# in files and dumps: the options that differ from the engine's defaults
EngineSection = Annotated[
    EngineConfig,
    PlainValidator(_engine_config),
    PlainSerializer(lambda c: c.to_dict(changed_only=True), return_type=dict),
]


class RolloutConfig(_Section):
    """How episodes are sampled from the engine."""

    group_size: int = Field(8, ge=2, le=MAX_COUNT, description="completions per prompt (the GRPO group)")
    prompts_per_step: int = Field(8, ge=1, le=MAX_COUNT, description="prompts per step across all ranks")
    max_new_tokens: int = Field(32, ge=1, le=MAX_TOKENS, description="tokens generated per turn")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature (> 0)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    max_turns: int = Field(4, ge=1, le=MAX_COUNT, description="turns per multi-turn episode (tool calls)")
    chat_template: bool = Field(True, description="wrap text prompts in the tokenizer's chat template")
    system_prompt: str | None = Field(None, description="system message prepended to chat prompts")
    describe_tools: bool = Field(
        False, description="add the episode's tools and the <tool_call> format to the system message"
    )
    dynamic_sampling_rounds: int = Field(
        0,
        ge=0,
        le=MAX_COUNT,
        description="DAPO's dynamic sampling: while fewer of a step's groups than prompts_per_step have "
        "rewards that differ, play up to K more rounds of fresh prompts and train on the groups that do "
        "(0: off)",
    )
    engine: EngineSection = Field(
        default_factory=EngineConfig,
        description="options of the colocated engine (EngineConfig fields; model, dtype and device follow the policy)",
    )
    mode: Literal["colocated", "server"] = Field(
        "colocated",
        description="colocated: an engine inside the trainer; server: `vriksha serve` processes (rollout.servers)",
    )
    servers: list[str] = Field(
        default_factory=list,
        description="server mode: base URLs of `vriksha serve` (empty: the trainer starts one on a free port)",
    )
    router: str | None = Field(
        None, description="server mode: a `vriksha router` over rollout.servers that generation goes through"
    )
    recovery_timeout_s: float = Field(
        300.0,
        gt=0.0,
        description="server mode: how long a rollout server or router that stopped answering may take to come "
        "back (it is then re-synced to the current weights and the request repeated)",
    )
    weight_backend: Literal["auto", "shm", "gloo", "fs"] = Field(
        "auto",
        description="server mode: how weights reach the servers (auto: shm on the same node, else gloo)",
    )
    weight_bucket_mb: float = Field(64.0, gt=0.0, description="server mode: gloo bucket size in MiB")
    verify_weights: bool = Field(
        False,
        description="server mode: after each push, check every server parameter's sha256 against the trainer's",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="0: on-policy (play, then train); K >= 1: off-policy, the next steps' episodes are played "
        "while this step trains, each under weights K versions old; older rollouts are dropped and counted",
    )
    release_during_update: bool = Field(
        False,
        description="colocated: free the engine's KV pool (and on accelerators the allocator's cache) before "
        "the policy update's forward and backward, and allocate it again after (vLLM's sleep mode; the prefix "
        "cache is dropped, as at every update); also written rollout.engine.release_during_update",
    )

    @model_validator(mode="before")
    @classmethod
    def _release_in_engine_section(cls, data: Any) -> Any:
        """`rollout.engine.release_during_update` is this option (the engine's own options stay the engine's)."""
        engine = data.get("engine") if isinstance(data, dict) else None
        if not isinstance(engine, dict) or "release_during_update" not in engine:
            return data
        data, engine = dict(data), dict(engine)
        value = engine.pop("release_during_update")
        if "release_during_update" in data and data["release_during_update"] != value:
            raise ValueError(
                "release_during_update is given twice, in rollout and in rollout.engine, with different values"
            )
        data["release_during_update"], data["engine"] = value, engine
        return data

    @model_validator(mode="after")
    def _release_needs_the_colocated_engine(self) -> RolloutConfig:
        if self.release_during_update and self.mode != "colocated":
            raise ValueError(
                "release_during_update frees the colocated engine's KV pool; in server mode the servers hold "
                "theirs: drop release_during_update or use rollout.mode=colocated"
            )
        if self.release_during_update and self.max_staleness > 0:
            raise ValueError(
                "release_during_update frees the engine's pool while the policy updates, and off-policy "
                "rollouts (max_staleness > 0) play during the update: drop one of them"
            )
        return self


class OptimConfig(_Section):
    lr: float = Field(1e-5, gt=0.0, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon")
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description="decay after warmup")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="linear warmup steps")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="final lr / peak lr for linear and cosine")
    max_grad_norm: float | None = Field(1.0, description="gradient clipping norm (null: none)")

    @model_validator(mode="after")
    def _check(self) -> OptimConfig:
        b1, b2 = self.betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas: each must be in [0, 1), got {self.betas}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm: must be > 0 or null, got {self.max_grad_norm}")
        return self


# one more completion forward of the update costs about this many positions' worth of work (a 135M model's
# fixed cost per forward and backward on a Zen 1 core is about 3 positions: generous, so that only long tails
# run apart; see logprobs.py)
SUB_BATCH_OVERHEAD_TOKENS = 64


class GRPOConfig(_Section):
    """The objective."""

    loss_type: str = Field(
        "dapo",
        description="the policy loss, by its name in vriksha/train/losses/: grpo (per-sequence token mean), "
        "dr_grpo (/ max_completion_length), dapo (token sum / the step's tokens; the default), bnpo "
        "(per micro-batch token mean), gspo (sequence-level ratio), cispo (clipped, detached weight); "
        "see docs/training.md for the formulas",
    )
    clip_low: float = Field(0.2, ge=0.0, lt=1.0, description="ratio lower bound is 1 - clip_low")
    clip_high: float = Field(0.28, ge=0.0, description="ratio upper bound is 1 + clip_high")
    cispo_cap: float = Field(
        5.0,
        gt=0.0,
        description="cispo: the largest weight min(ratio, cispo_cap) (TRL's epsilon_high for cispo)",
    )
    kl_coef: float = Field(
        0.0, ge=0.0, description="weight of the k3 KL to the initial model (0: no reference)"
    )
    kl_importance_correction: bool = Field(
        True,
        description="multiply the per-token KL by the ratio pi_theta / pi_old (TRL's use_bias_correction_kl: "
        "the unbiased reverse-KL gradient of DeepSeek-V3.2)",
    )
    entropy_coef: float = Field(
        0.0, ge=0.0, description="entropy bonus: subtract coef x the mean per-token entropy (0: off)"
    )
    scale_rewards: bool = Field(True, description="divide advantages by the group's reward std")
    mask_truncated_completions: bool = Field(
        False,
        description="leave completions that ran out of tokens (finish reason length) out of the loss (DAPO)",
    )
    max_completion_length: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS,
        description="dr_grpo's constant divisor (null: rollout.max_new_tokens)",
    )
    importance_correction: bool = Field(
        True,
        description="weight tokens by pi_old / mu (the engine's sampling probability) to correct mismatch",
    )
    importance_level: Literal["token", "sequence"] = Field(
        "token",
        description="token: one weight per token; sequence: one weight per completion, exp of the summed "
        "log-ratios (TRL's vllm_importance_sampling_mode token_* / sequence_*)",
    )
    importance_mode: Literal["truncate", "mask"] = Field(
        "truncate",
        description="truncate: clamp the weight to [importance_min, importance_cap]; mask: weights outside "
        "are set to 0 (TRL's *_truncate / *_mask)",
    )
    importance_cap: float | None = Field(
        2.0, gt=0.0, description="upper bound of the importance weight, C_max (null: none)"
    )
    importance_min: float | None = Field(
        None, ge=0.0, description="lower bound of the importance weight, C_min (null: none)"
    )
    off_policy_mask_threshold: float | None = Field(
        None,
        ge=0.0,
        description="DeepSeek-V3.2's off-policy sequence mask: leave out completions with A < 0 whose mean "
        "KL(mu || pi_theta) per token exceeds this (null: off)",
    )
    on_policy: Literal["default", "exact"] = Field(
        "default",
        description="exact: rollouts run the trainer's own forward (same module, kernels, shapes and call order), "
        "so the sampling log-probs equal the trainer's bit for bit (one process, single-turn, colocated, "
        "top_p 1; much slower rollouts; see docs/training.md)",
    )
    epochs_per_batch: int = Field(
        1, ge=1, le=MAX_COUNT, description="optimizer steps on each batch of rollouts"
    )
    micro_batch_groups: int = Field(
        2, ge=1, le=MAX_COUNT, description="groups per forward/backward (gradient accumulation)"
    )
    logprob_chunk_tokens: int = Field(
        512,
        ge=0,
        description="tokens per LM-head chunk of the log-probs (recomputed in backward; 0: all at once)",
    )
    logprob_split_overhead_tokens: int = Field(
        SUB_BATCH_OVERHEAD_TOKENS,
        ge=0,
        description="what one more completion forward costs, in positions, when completions of very "
        "different lengths may run as sub-batches each to its own longest (0: every length apart)",
    )

    @field_validator("loss_type")
    @classmethod
    def _known_loss(cls, name: str) -> str:
        from vriksha.train.losses import loss_names

        if name not in loss_names():
            raise ValueError(f"unknown loss; choose one of {', '.join(loss_names())}")
        return name

    @model_validator(mode="after")
    def _check_importance(self) -> GRPOConfig:
        low, high = self.importance_min, self.importance_cap
        if low is not None and high is not None and low > high:
            raise ValueError(f"importance_min: {low} is above importance_cap {high}")
        if self.importance_correction and low is None and high is None:
            raise ValueError(
                "importance_cap: set importance_cap or importance_min (both null bound nothing), or set "
                "importance_correction: false"
            )
        return self


class ParallelConfig(_Section):
    """How the ranks are arranged: the mesh `(dp_replicate, dp_shard, tp)`, whose product is the
    number of processes (see docs/training.md, "Parallelism")."""

    dp_replicate: int = Field(1, ge=1, description="replicas of the sharded model (HSDP); 1: plain FSDP")
    dp_shard: int = Field(-1, ge=-1, description="FSDP2 shard degree; -1: every rank the others leave")
    tp: int = Field(
        1, ge=1, description="tensor-parallel degree (must divide attention heads, KV heads, MLP width)"
    )
    shard_vocab: bool = Field(
        True, description="with tp > 1: split the embedding and LM head over the vocabulary (else replicate)"
    )

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        if self.dp_shard == 0:
            raise ValueError("dp_shard: must be >= 1 or -1 (the remaining ranks), got 0")
        return self


class TrainerConfig(_Section):
    steps: int = Field(10, ge=1, le=MAX_STEPS, description="GRPO steps")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed for episodes, sampling and initialisation")
    eval_interval: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="evaluate every N steps (0, or more than steps: before and after only)",
    )
    eval_episodes: int = Field(
        32, ge=0, le=MAX_COUNT, description="held-out episodes per evaluation (0: no eval)"
    )
    eval_max_new_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="defaults to rollout.max_new_tokens"
    )
    eval_samples: int = Field(
        0,
        ge=0,
        le=MAX_COUNT,
        description="K: each evaluation also samples every held-out episode K times at rollout.temperature "
        "and logs pass@k (unbiased estimator) and avg@K beside the greedy success (0: greedy only)",
    )
    checkpoint_interval: int = Field(
        0, ge=0, le=MAX_STEPS, description="checkpoint every K steps (0: only at the end)"
    )
    checkpoint_at_end: bool = Field(
        True,
        description="checkpoint a finished run (false: a run that will not be resumed writes no final "
        "checkpoint; one stopped by stop_after still does)",
    )
    output_dir: str = Field("runs/grpo", description="where metrics, plots, checkpoints and the export go")
    export: bool = Field(True, description="save the final model as a Transformers directory")
    tensorboard: bool = Field(True, description="write TensorBoard logs when tensorboard is installed")
    progress: bool = Field(True, description="show a progress bar on rank 0")
    stop_after: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="stop (as if interrupted) after this many steps of this invocation; resume later",
    )


class SFTConfig(_Section):
    """`algorithm: sft`: supervised fine-tuning on chat JSONL or saved trajectories, loss on the assistant's
    tokens alone (see docs/training.md, "SFT")."""

    data: list[str] = Field(
        default_factory=list,
        description="JSONL files: chat lines ({messages: [...], tools: [...]?}) or trajectories written by "
        "`vriksha env eval --save` (token ids with their loss mask)",
    )
    only_successful: bool = Field(
        True, description="trajectories: train on the successful episodes alone (chat lines are all kept)"
    )
    batch_size: int = Field(8, ge=1, le=MAX_COUNT, description="sequences per step across all ranks")
    micro_batch_size: int = Field(4, ge=1, le=MAX_COUNT, description="sequences per forward/backward")
    max_length: int = Field(
        2048, ge=2, le=MAX_TOKENS, description="tokens per sequence at most (longer ones are cut at the end)"
    )
    shuffle: bool = Field(
        True, description="a fresh order of the examples each epoch (seeded by trainer.seed)"
    )

    @field_validator("data")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        if any(not p.strip() for p in paths):
            raise ValueError("an empty path; name each JSONL file")
        return paths


class OPDConfig(_Section):
    """`algorithm: opd`: on-policy distillation, the student's own samples scored by a teacher token by token
    (per-token reverse KL; see docs/training.md, "On-policy distillation")."""

    teacher: str | None = Field(
        None,
        description="the teacher: a model path (HF directory or .gguf), a packaged model name, null for the "
        "embedded model, or the http(s) URL of a `vriksha serve` (scored through its echo log-probs); it must "
        "share the student's tokenizer",
    )
    teacher_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="parameter dtype of a local teacher"
    )
    kl_coef: float = Field(
        1.0, gt=0.0, description="scale of the per-token reverse KL taken as a negative advantage"
    )
    request_timeout_s: float = Field(
        300.0, gt=0.0, description="a served teacher: seconds per scoring request"
    )


class TrainConfig(_Section):
    """A whole run: GRPO (the default), SFT or on-policy distillation (`algorithm`)."""

    algorithm: Literal["grpo", "sft", "opd"] = Field(
        "grpo",
        description="grpo: rewards from the environment; sft: supervised on the `sft` section's data; opd: "
        "on-policy distillation from the `opd` section's teacher",
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    opd: OPDConfig = Field(default_factory=OPDConfig)

    @model_validator(mode="after")
    def _check_algorithm(self) -> TrainConfig:
        if self.algorithm == "sft" and not self.sft.data:
            raise ValueError("sft.data: algorithm sft trains on JSONL files; name at least one")
        if self.algorithm == "opd":
            if self.grpo.on_policy == "exact":
                raise ValueError("grpo.on_policy: algorithm opd runs with on_policy default")
            if self.grpo.kl_coef > 0:
                raise ValueError("grpo.kl_coef: algorithm opd's KL is to the teacher; set grpo.kl_coef=0")
        return self

    @model_validator(mode="after")
    def _check_exact(self) -> TrainConfig:
        """`grpo.on_policy: exact` plays every group as one lockstep request on the trainer's own module:
        what that cannot do is refused here, by the option to change."""
        if self.grpo.on_policy != "exact":
            return self
        r = self.rollout
        wrong = [
            ("rollout.mode", r.mode, "colocated", "the exact engine runs in the trainer's process"),
            ("rollout.max_turns", r.max_turns, 1, "a later turn's prompt forward is not the trainer's"),
            ("rollout.max_staleness", r.max_staleness, 0, "stale weights differ from pi_old anyway"),
            ("rollout.top_p", r.top_p, 1.0, "the exact engine samples the full distribution"),
            ("parallel.tp", self.parallel.tp, 1, "one process runs the forwards"),
        ]
        for name, got, want, why in wrong:
            if got != want:
                raise ValueError(f"{name}: grpo.on_policy exact needs {name}={want!r} ({why}); got {got!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def loss_config(self) -> GRPOConfig:
        """The `grpo` section with what it leaves to other sections filled in (max_completion_length)."""
        if self.grpo.max_completion_length is not None:
            return self.grpo
        return self.grpo.model_copy(update={"max_completion_length": self.rollout.max_new_tokens})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown option (check the spelling; see docs/training.md)"
        elif err["type"] != "missing" and not isinstance(err.get("input"), dict):
            msg += f" (got {err['input']!r})"
        # validators of a whole section start their message with the field name: "betas: ..."
        field, colon, rest = msg.partition(": ")
        if colon and field.replace("_", "").replace(".", "").isalnum() and " " not in field:
            loc, msg = (f"{loc}.{field}" if loc else field), rest
        lines.append(f"{loc or 'config'}: {msg}")
    return "invalid training config: " + "; ".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`grpo.kl_coef=0.05` -> (["grpo", "kl_coef"], 0.05); values are parsed as YAML scalars/lists."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set optim.lr=1e-5")
    try:
        value = load_yaml(raw, key.split(".")) if raw.strip() else None
    except ConfigError as exc:
        raise ConfigError(f"--set {item!r}: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        value = raw
    if isinstance(value, str) and raw.strip().lower() in ("none", "null"):
        value = None
    # YAML 1.1 reads 1e-5 as a string; accept it as a float
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml", ".json"):
            data = load_yaml(text) or {}
        else:
            raise ConfigError(f"config file {str(path)!r}: use a .toml, .yaml or .yml file")
    except ConfigError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config file {str(path)!r} is nested too deeply to read") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"config file {str(path)!r} does not parse: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: the top level must be a mapping of sections")
    return data


def engine_overrides(given: dict[str, Any]) -> list[str]:
    """Engine flags given on the command line (`EngineConfig.given_args`) as `--set rollout.engine.X=V` items
    (`rollout.engine.platform.X=V` for an option of the platform section)."""
    return [f"rollout.engine.{EngineConfig.option_path(k)}={json.dumps(v)}" for k, v in given.items()]


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Read `path` (TOML or YAML; None: defaults), apply `--set` overrides, validate."""
    data = read_config_file(path) if path is not None else {}
    return TrainConfig.from_dict(apply_overrides(data, list(overrides or [])))
