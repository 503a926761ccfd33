"""Loading models: the embedded default, Transformers directories and GGUF files, as Transformers modules
and their tokenizers (the engine runs the Transformers classes themselves)."""

from vriksha.artifact_store import cache_dir
from vriksha.loading.loader import (
    DEFAULT_MODEL_NAME,
    LoadedModel,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "LoadedModel",
    "cache_dir",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
