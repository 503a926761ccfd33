"""Layers from local kernel repositories, bound in place of the model's: the Hugging Face `kernels` package's
layer mapping, for kernels already on disk (no hub access at run time).

A mapping names a layer kind (`RMSNorm`, or a module class name) and, per device type, a
`kernels.LocalLayerRepository` (a directory with `metadata.json` and a Python package whose `layers`
namespace holds stateless `nn.Module` classes). The engine loads each layer with the `kernels` package,
binds its `forward` on every matching module of the model (recorded in the engine's `ModuleInstallation`,
undone on close), and the lean forward's kernel set calls those modules. The engine option
`kernel_layers="RMSNorm=/dir[:Layer],..."` builds such a mapping.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import MethodType
from typing import Any

import torch
from torch import nn

from vriksha.engine.platform.kernel_sets import TorchKernels
from vriksha.engine.platform.module_installation import ModuleInstallation
from vriksha.errors import ConfigError

logger = logging.getLogger(__name__)


def _kernels_package():
    try:
        import kernels
    except ImportError as exc:
        raise ConfigError(
            "kernel_layers needs the `kernels` package (pip install kernels, or vriksha[kernels])"
        ) from exc
    return kernels


def parse(spec: str, device: torch.device) -> dict[str, dict[str, Any]]:
    """`NAME=DIR[:LAYER],...` as the `kernels` package's mapping {NAME: {device type: LocalLayerRepository}}."""
    kernels = _kernels_package()
    mapping: dict[str, dict[str, Any]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, target = item.partition("=")
        if not sep or not name or not target:
            raise ConfigError(f"kernel_layers entry {item!r} must read NAME=DIR or NAME=DIR:LAYER")
        directory, _, layer = target.partition(":")
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise ConfigError(f"kernel_layers: {path} is not a directory (a local kernel repository)")
        repo = kernels.LocalLayerRepository(repo_path=path, layer_name=layer or name)
        mapping[name] = {device.type: repo}
    if not mapping:
        raise ConfigError("kernel_layers is empty; give NAME=DIR[:LAYER],...")
    return mapping


def layer_kind(module: nn.Module) -> set[str]:
    """The names a mapping may use for this module: its `kernels` layer name, its class name, and `RMSNorm`
    for any RMSNorm class."""
    cls = type(module)
    kinds = {cls.__name__}
    if getattr(cls, "kernel_layer_name", None):
        kinds.add(cls.kernel_layer_name)
    if cls.__name__.endswith("RMSNorm"):
        kinds.add("RMSNorm")
    return kinds


def _repository(name: str, per_device: dict, device: torch.device):
    repo = per_device.get(device.type)
    if repo is None:
        repo = next((r for key, r in per_device.items() if getattr(key, "type", None) == device.type), None)
    if isinstance(repo, dict):  # {Mode: repository}: inference first, then the fallback
        kernels = _kernels_package()
        repo = repo.get(kernels.Mode.INFERENCE, repo.get(kernels.Mode.FALLBACK))
    if repo is None:
        raise ConfigError(f"kernel mapping for {name} has no repository for device type {device.type}")
    if not type(repo).__name__.startswith("Local"):
        raise ConfigError(
            f"kernel mapping for {name}: {repo} is not a local repository; the engine loads no kernels "
            "from the hub at run time (download it, then use kernels.LocalLayerRepository)"
        )
    return repo


def _load(name: str, repo) -> type[nn.Module]:
    try:
        layer = repo.load()
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"kernel layer {name} could not be loaded from {repo}: {exc}") from exc
    if not (isinstance(layer, type) and issubclass(layer, nn.Module)):
        raise ConfigError(f"kernel layer {name} from {repo} is not an nn.Module class")
    if layer.__init__ is not nn.Module.__init__:
        raise ConfigError(
            f"kernel layer {name} from {repo} has its own __init__; kernel layers are stateless"
        )
    return layer


class LayerKernels(TorchKernels):
    """A kernel set whose RMSNorm calls the model's modules that carry a bound kernel layer; every other
    operation is the base set's."""

    def __init__(self, base: TorchKernels, bound: set[int], names: list[str]) -> None:
        self.base = base
        self.bound = bound
        self.names = names
        self.name = base.name

    def rms_norm(
        self, x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        if id(norm) not in self.bound:
            return self.base.rms_norm(x, norm, residual)
        if residual is not None:
            x.add_(residual)
        return norm(x)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.base.rope(x, cos, sin)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.base.silu_mul(gate, up)

    def decode_attention_for(self, dtype: torch.dtype):
        return self.base.decode_attention_for(dtype)

    def prefill_attention_for(self, dtype: torch.dtype):
        return self.base.prefill_attention_for(dtype)

    def linear_for(self, dtype: torch.dtype):
        return self.base.linear_for(dtype)

    def describe(self) -> str:
        return f"{self.base.describe()}, with kernel layers {', '.join(self.names)}"


def bind_mapping(
    model: nn.Module, mapping: dict[str, dict], installation: ModuleInstallation, base: TorchKernels
) -> LayerKernels:
    """Bind each mapped layer's `forward` on the model's matching modules; the kernel set that calls them."""
    device = next(model.parameters()).device
    bound: set[int] = set()
    for name, per_device in mapping.items():
        layer = _load(name, _repository(name, per_device, device))
        targets = [m for m in model.modules() if name in layer_kind(m)]
        if not targets:
            kinds = sorted({k for m in model.modules() for k in layer_kind(m) if k.endswith(("Norm", "MLP"))})
            raise ConfigError(f"no layer of this model is a {name}; its layers include {', '.join(kinds)}")
        for module in targets:
            installation.replace_forward(module, MethodType(layer.forward, module))
            bound.add(id(module))
        logger.info("kernel layer %s bound on %d modules", name, len(targets))
    return LayerKernels(base, bound, list(mapping))


def bind(model: nn.Module, spec: str, installation: ModuleInstallation, base: TorchKernels) -> LayerKernels:
    """`bind_mapping` for the engine option's `NAME=DIR[:LAYER],...` string."""
    device = next(model.parameters()).device
    return bind_mapping(model, parse(spec, device), installation, base)
