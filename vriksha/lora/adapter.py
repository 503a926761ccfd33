"""A LoRA adapter as one typed record, and PEFT's directory format for it.

    y = x W^T + scaling * (x A^T) B^T,   A: [rank, in_features], B: [out_features, rank]
    scaling = alpha / rank   (alpha / sqrt(rank) with rsLoRA)

`LoraAdapter.modules` holds the A and B of each adapted linear layer, keyed by the base model's module name
(`model.layers.0.self_attn.q_proj`). On disk (what `peft.PeftModel.save_pretrained` writes, and what
`PeftModel.from_pretrained` and vLLM's `--lora-modules` read):

    adapter_config.json         peft_type LORA, r, lora_alpha, target_modules, use_rslora, ...
    adapter_model.safetensors   base_model.model.<module>.lora_A.weight, base_model.model.<module>.lora_B.weight

`load_peft_dir` reads plain LoRA adapters of linear layers; what it cannot apply exactly as PEFT would (DoRA,
per-module ranks, biases, embedding adapters, extra trained modules) is refused with a message that names it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vriksha.errors import VrikshaError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_KEY = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])\.weight")
# adapter_config.json fields whose non-default value changes what the adapter computes beyond plain LoRA
_UNSUPPORTED = {
    "use_dora": (False, "DoRA adapters (use_dora) are not supported; train or export a plain LoRA adapter"),
    "bias": ("none", "adapters that train biases (bias != 'none') are not supported"),
    "lora_bias": (False, "adapters with a bias on lora_B (lora_bias) are not supported"),
    "fan_in_fan_out": (False, "fan_in_fan_out adapters (GPT-2 Conv1D layers) are not supported"),
    "modules_to_save": (
        None,
        "adapters with fully trained extra modules (modules_to_save) are not supported",
    ),
    "rank_pattern": ({}, "per-module ranks (rank_pattern) are not supported; use one rank for every module"),
    "alpha_pattern": ({}, "per-module alphas (alpha_pattern) are not supported; use one lora_alpha"),
    "target_parameters": (None, "adapters of raw parameters (target_parameters) are not supported"),
    "use_qalora": (False, "QA-LoRA adapters (use_qalora) are not supported"),
}


class AdapterError(VrikshaError, ValueError):
    """A LoRA adapter (a directory, its config, a tensor) cannot be used; the message names what and why."""


def peft_key(module: str, part: str) -> str:
    """The safetensors key PEFT gives `module`'s A or B: `base_model.model.<module>.lora_<part>.weight`."""
    return f"{PEFT_PREFIX}{module}.lora_{part}.weight"


def parse_peft_key(key: str) -> tuple[str, str]:
    """`base_model.model.<module>.lora_A.weight` -> (`<module>`, "A"); AdapterError for any other key."""
    m = _KEY.fullmatch(key)
    if m is None:
        raise AdapterError(
            f"tensor {key!r} is not a LoRA weight of a linear layer (expected "
            f"'{PEFT_PREFIX}<module>.lora_A.weight' or '.lora_B.weight')"
        )
    return m["module"], m["part"]


@dataclass(slots=True)
class LoraWeights:
    """One adapted linear layer: `a` [rank, in_features], `b` [out_features, rank]."""

    a: torch.Tensor
    b: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.a.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.b.shape[0])


@dataclass(slots=True)
class LoraAdapter:
    """A LoRA adapter: its name, rank, alpha (and so its scaling), the module names it targets (as its config
    lists them, e.g. `q_proj`), and the A and B of each adapted layer keyed by the base model's module name."""

    name: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    modules: dict[str, LoraWeights] = field(default_factory=dict)
    use_rslora: bool = False
    dropout: float = 0.0  # a training option, recorded in the config
    base_model: str | None = None  # base_model_name_or_path

    @property
    def scaling(self) -> float:
        return self.alpha / math.sqrt(self.rank) if self.use_rslora else self.alpha / self.rank

    @property
    def nbytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for w in self.modules.values())

    def delta(self, module: str) -> torch.Tensor:
        """`scaling * B @ A` of `module` in float32: what merging adds to its weight [out, in]."""
        w = self.modules[module]
        return (w.b.float() @ w.a.float()).mul_(self.scaling)

    def peft_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors under PEFT's keys, in module order (A then B of each)."""
        out: dict[str, torch.Tensor] = {}
        for module, w in self.modules.items():
            out[peft_key(module, "A")] = w.a
            out[peft_key(module, "B")] = w.b
        return out

    @classmethod
    def from_peft_state_dict(
        cls, tensors: Mapping[str, torch.Tensor], *, name: str, rank: int, alpha: float, **config: Any
    ) -> LoraAdapter:
        """An adapter from tensors under PEFT's keys, checked: every key a LoRA weight, A and B of every
        module present with shapes [rank, in] and [out, rank], float and finite."""
        if rank < 1:
            raise AdapterError(f"adapter {name!r}: rank (r) must be >= 1, got {rank}")
        if not math.isfinite(alpha) or alpha <= 0:
            raise AdapterError(f"adapter {name!r}: lora_alpha must be a positive number, got {alpha}")
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            module, part = parse_peft_key(key)
            parts.setdefault(module, {})[part] = t
        if not parts:
            raise AdapterError(f"adapter {name!r} holds no LoRA weights")
        modules: dict[str, LoraWeights] = {}
        for module, ab in parts.items():
            for part in "AB":
                if part not in ab:
                    raise AdapterError(f"adapter {name!r}: {peft_key(module, part)} is missing")
            modules[module] = _checked(name, module, ab["A"], ab["B"], rank)
        targets = config.pop("target_modules", None)
        if targets is None:
            targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
        return cls(name, rank, float(alpha), tuple(targets), modules, **config)

    def check_base(self, shapes: Mapping[str, tuple[int, int]]) -> None:
        """Every adapted module must be a linear layer of the base model, `shapes` giving each one's weight
        shape (out_features, in_features); AdapterError naming the first that is not."""
        for module, w in self.modules.items():
            shape = shapes.get(module)
            if shape is None:
                raise AdapterError(
                    f"adapter {self.name!r} adapts {module!r}, which is not a linear layer of the base model "
                    "(was it trained for another model?)"
                )
            if tuple(shape) != (w.out_features, w.in_features):
                raise AdapterError(
                    f"adapter {self.name!r}: {module} is [{w.out_features} x {w.in_features}] in the adapter "
                    f"but [{shape[0]} x {shape[1]}] in the base model (was it trained for another model?)"
                )

    def peft_config(self) -> dict[str, Any]:
        """`adapter_config.json` as PEFT writes it for this adapter (PEFT's own `LoraConfig.to_dict`)."""
        from peft import LoraConfig

        alpha: float | int = int(self.alpha) if float(self.alpha).is_integer() else self.alpha
        config = LoraConfig(
            task_type="CAUSAL_LM",
            r=self.rank,
            lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT annotates int, reads any number
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            use_rslora=self.use_rslora,
            base_model_name_or_path=self.base_model,
            inference_mode=True,
        )
        out = config.to_dict()
        out["target_modules"] = sorted(out["target_modules"])  # PEFT keeps a set; a stable file
        return {k: (sorted(v) if isinstance(v, set) else v) for k, v in out.items()}


def _checked(name: str, module: str, a: torch.Tensor, b: torch.Tensor, rank: int) -> LoraWeights:
    for part, t in (("A", a), ("B", b)):
        if t.dim() != 2 or not t.is_floating_point():
            raise AdapterError(
                f"adapter {name!r}: {peft_key(module, part)} must be a 2-D float tensor, got "
                f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            )
    if a.shape[0] != rank or b.shape[1] != rank:
        raise AdapterError(
            f"adapter {name!r}: {module} has lora_A {list(a.shape)} and lora_B {list(b.shape)}, but the rank "
            f"(r) is {rank}: expected lora_A [{rank}, in_features] and lora_B [out_features, {rank}]"
        )
    for part, t in (("A", a), ("B", b)):
        if not bool(torch.isfinite(t).all()):
            raise AdapterError(f"adapter {name!r}: {peft_key(module, part)} holds NaN or infinite values")
    return LoraWeights(a, b)


def _natural(key: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise AdapterError(f"{path} has no {CONFIG_FILE}: not a PEFT adapter directory")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{config_path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} must hold a JSON object")
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(
            f"{config_path}: peft_type is {peft_type!r}; only LoRA adapters (LORA) are supported"
        )
    for key, (default, why) in _UNSUPPORTED.items():
        value = config.get(key)
        if value is not None and value is not False and value not in (default, {}, []):
            raise AdapterError(f"{config_path}: {why} (got {key}={value!r})")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise AdapterError(f"{config_path}: {key} must be a number, got {value!r}")
    if not float(config["r"]).is_integer():
        raise AdapterError(f"{config_path}: r must be a whole number, got {config['r']!r}")
    return config


def load_peft_dir(path: str | Path, name: str | None = None) -> LoraAdapter:
    """The adapter in a PEFT directory (`adapter_config.json` + `adapter_model.safetensors`), checked;
    `name` defaults to the directory's name. AdapterError names what is missing or wrong."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"adapter path {str(path)!r} is not a directory")
    config = _read_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        legacy = " (it has adapter_model.bin, PEFT's older pickle format: re-save it with safetensors)"
        raise AdapterError(
            f"{path} has no {WEIGHTS_FILE}" + (legacy if (path / "adapter_model.bin").is_file() else "")
        )
    try:
        with safe_open(str(weights), framework="pt") as f:
            keys = sorted(f.keys(), key=_natural)  # layer 2 before layer 10, as the model runs them
            for key in keys:
                parse_peft_key(key)  # every name checked before any tensor is read
            tensors = {key: f.get_tensor(key) for key in keys}
    except (SafetensorError, OSError) as exc:
        raise AdapterError(f"{weights} cannot be read as safetensors: {exc}") from None
    except AdapterError as exc:
        raise AdapterError(f"{weights}: {exc}") from None
    targets = config.get("target_modules")
    return LoraAdapter.from_peft_state_dict(
        tensors,
        name=name or path.name,
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=tuple(targets) if isinstance(targets, list) else (targets,) if targets else None,
        use_rslora=bool(config.get("use_rslora", False)),
        dropout=float(config.get("lora_dropout") or 0.0),
        base_model=config.get("base_model_name_or_path"),
    )


def save_peft_dir(adapter: LoraAdapter, path: str | Path) -> Path:
    """Write `adapter` in PEFT's format (each file through a temporary name and a rename); returns `path`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: t.detach().contiguous().cpu() for k, t in adapter.peft_state_dict().items()}
    tmp = path / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / WEIGHTS_FILE)
    tmp = path / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(adapter.peft_config(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path / CONFIG_FILE)
    return path
