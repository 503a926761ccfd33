"""`vdev`: a PrivateUse1 device backend for tests, in the manner of PyTorch's OpenReg.

`load()` compiles `vdev.cpp` once per source and torch version (a C++ compiler is needed; about a
minute) and registers the device with PyTorch under the name "vdev": `torch.device("vdev")`,
`torch.accelerator` reports it, and tensors there live in the backend's own allocator while operators
without a kernel of their own run on the CPU through the fallback.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path

import torch

from vriksha.artifact_store import cache_dir

NAME = "vdev"
_extension = None


def compiler_missing() -> str | None:
    """Why the backend cannot be built here, or None."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler (set CXX or install g++) to build the vdev PrivateUse1 test backend"
    return None


def _device_module() -> types.ModuleType:
    module = types.ModuleType(f"torch.{NAME}")
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module.set_device = lambda index: None
    module.synchronize = lambda device=None: None
    module._is_in_bad_fork = lambda: False
    module.manual_seed_all = lambda seed: None
    module.get_amp_supported_dtype = lambda: [torch.float32, torch.bfloat16]
    return module


def _import_built(library: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("vriksha_vdev", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """Build (once per source and torch version) and register the backend; returns the extension module."""
    global _extension
    if _extension is not None:
        return _extension
    from torch.utils.cpp_extension import load as load_extension

    source = Path(__file__).with_name("vdev.cpp")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    build = cache_dir() / "vdev" / f"torch-{torch.__version__}-{python}-{digest}"
    built, library = build / "built", build / "vriksha_vdev.so"
    if built.is_file() and library.is_file():
        # the same source and torch version, built by any environment: torch's own loader would rebuild it
        # wherever torch's include path differs (every fresh virtualenv), a minute of compiling each time
        _extension = _import_built(library)
    else:
        build.mkdir(parents=True, exist_ok=True)
        _extension = load_extension(
            name="vriksha_vdev",
            sources=[str(source)],
            build_directory=str(build),
            extra_cflags=["-O1"],
            verbose=False,
        )
        built.touch()
    torch.utils.rename_privateuse1_backend(NAME)
    torch._register_device_module(NAME, _device_module())
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    return _extension
