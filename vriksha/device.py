"""The one place that knows device kinds: everything else asks it, so the engine, the trainer and the
environments run unchanged on any backend PyTorch knows (CPU, CUDA, or a PrivateUse1 device such as a new
accelerator), chosen through `torch.accelerator`.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist

HOST_TYPE = "cpu"


def host() -> torch.device:
    return torch.device(HOST_TYPE)


# the torch device type each Triton backend compiles for (Triton names its backends by vendor; ROCm's
# torch calls its devices cuda too)
TRITON_BACKEND_TYPES = {"nvidia": "cuda", "amd": "cuda", "intel": "xpu"}


def triton_device_types(backends: list[str]) -> set[str]:
    """The torch device types of Triton's installed `backends` (`triton.backends.backends`)."""
    return {TRITON_BACKEND_TYPES[b] for b in backends if b in TRITON_BACKEND_TYPES}


# device types whose torch module captures launches into graphs and replays them (ROCm's devices are cuda too)
GRAPH_TYPES = ("cuda",)


def graph_module(device: torch.device | str) -> ModuleType | None:
    """The torch device module that captures and replays graphs of `device`'s kernel launches (its
    `CUDAGraph`, `graph` and `graph_pool_handle`), or None where the device has none."""
    device = torch.device(device)
    return torch.get_device_module(device.type) if device.type in GRAPH_TYPES else None


def is_host(device: torch.device | str) -> bool:
    """True for the CPU (memory the process can read directly, where the native C kernels run)."""
    return torch.device(device).type == HOST_TYPE


def default_device() -> torch.device:
    """The current accelerator when there is one (CUDA, PrivateUse1, ...), else the CPU."""
    accel = torch.accelerator.current_accelerator(check_available=True)
    return accel if accel is not None else host()


def resolve(device: torch.device | str | None) -> torch.device:
    return default_device() if device in (None, "", "auto") else torch.device(device)


def resolve_or_host(device: torch.device | str | None) -> torch.device:
    """`device`, or the CPU when none is given (data structures that default to host memory)."""
    return host() if device is None else torch.device(device)


def describe(device: torch.device | str) -> str:
    """The hardware behind `device`, as a stable name: the processor's model, or the accelerator's name."""
    device = torch.device(device)
    if is_host(device):
        from vriksha.engine.platform.cpu_features import cpu_features

        return f"{HOST_TYPE}: {cpu_features().model}"
    module = torch.get_device_module(device.type)
    try:
        return f"{device.type}: {module.get_device_name(device.index or 0)}"
    except (AttributeError, RuntimeError, NotImplementedError):
        return device.type


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (nothing to wait for on the CPU)."""
    if not is_host(device):
        torch.accelerator.synchronize(torch.device(device))


def empty_cache(device: torch.device | str) -> None:
    """Hand freed memory back: the accelerator allocator's cached blocks to the device; on the host, the C
    library's free heap pages to the kernel (the engine keeps freed heap mapped between steps otherwise)."""
    if is_host(device):
        from vriksha.engine.platform.host_malloc import return_freed_memory

        return_freed_memory()
    else:
        torch.accelerator.synchronize(torch.device(device))
        torch.accelerator.empty_cache()


def device_count() -> int:
    """How many accelerator devices there are (0 without an accelerator)."""
    if torch.accelerator.current_accelerator(check_available=True) is None:
        return 0
    return torch.accelerator.device_count()


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory on an accelerator, or None where the backend does not say (and on the CPU)."""
    if is_host(device):
        return None
    try:
        free, _total = torch.accelerator.get_memory_info(device)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return int(free)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak allocated accelerator memory since start, or None where the backend does not track it."""
    if is_host(device):
        return None
    try:
        return int(torch.accelerator.max_memory_allocated(device))
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def accelerator_rng_state() -> tuple[str, list[torch.Tensor]] | None:
    """The current accelerator's RNG state on every device, for checkpoints (None without one)."""
    accel = torch.accelerator.current_accelerator(check_available=True)
    module = torch.get_device_module(accel.type) if accel is not None else None
    if module is None or not hasattr(module, "get_rng_state_all"):
        return None
    return accel.type, module.get_rng_state_all()


def set_accelerator_rng_state(saved: tuple[str, list[torch.Tensor]] | None) -> None:
    if not saved:
        return
    kind, states = saved
    accel = torch.accelerator.current_accelerator(check_available=True)
    if accel is not None and accel.type == kind:
        module = torch.get_device_module(kind)
        if hasattr(module, "set_rng_state_all"):
            module.set_rng_state_all(states)


def local_device(local_rank: int, device: str | None = None) -> torch.device:
    """The device a rank computes on: the accelerator at its local rank (made current), or the CPU."""
    if device:
        chosen = torch.device(device)
        if chosen.index is None and not is_host(chosen):
            chosen = torch.device(chosen.type, local_rank)
    else:
        accel = default_device()
        chosen = host() if is_host(accel) else torch.device(accel.type, local_rank)
    if not is_host(chosen):
        torch.accelerator.set_device_index(chosen.index)
    return chosen


def collective_backend(device: torch.device) -> str:
    """The torch.distributed backend for tensors on `device` (gloo on the CPU, NCCL on CUDA, the one a
    PrivateUse1 backend registered); gloo where a backend registered none."""
    try:
        return dist.get_default_backend_for_device(device)
    except (RuntimeError, ValueError):
        return "gloo"


def collective_device(device: torch.device) -> torch.device:
    """Where tensors for the default process group's collectives must live."""
    return device if dist.get_backend() != "gloo" else host()
