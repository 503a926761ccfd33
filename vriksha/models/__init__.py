from vriksha.models.loader import (
    DEFAULT_MODEL_NAME,
    LoadedModel,
    cache_dir,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = ["DEFAULT_MODEL_NAME", "LoadedModel", "cache_dir", "load_model", "load_tokenizer", "resolve_model_path"]
