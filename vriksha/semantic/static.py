"""A static embedding table distilled from the packaged sentence model (the model2vec idea): every vocabulary
token is run through the transformer once, alone between [CLS] and [SEP], and the output at its own position
kept as its row; the rows are then weighted by an SIF weight from the token's Zipf rank (the vocabulary is in
frequency order after its special tokens and single characters, so a common token counts for less), and
optionally reduced with PCA. A text's embedding is the normalised sum of its tokens' rows (without [CLS] and
[SEP]): no transformer at run time, a tenth of a millisecond a text, tokenising included.

The recipe (output position, no PCA, SIF 1e-5) was chosen by measuring held-out routing accuracy against the
alternatives (mean pooling over the three positions, PCA to 256 or 128 dims, other SIF weights); see
docs/semantic_router.md. The table is built on first use (a progress bar; about a minute of one idle core)
and cached under the vriksha cache dir, keyed by a hash of the model's files and the recipe, so it is rebuilt
only when either changes."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vriksha.artifact_store import cache_dir

logger = logging.getLogger(__name__)

RECIPE_VERSION = 1
CHARS_PER_TOKEN = 16  # a text is cut to max_tokens * this many characters before tokenising (bounds the work)


@dataclass(frozen=True, slots=True)
class Recipe:
    dims: int | None = None  # PCA components kept; None: no PCA, the model's width
    sif: float | None = 1e-5  # SIF coefficient a in a / (a + p(rank)); None: every token weighs the same
    tokens: int | None = None  # distil only the first this many vocabulary ids (tests); None: all

    def key(self) -> str:
        text = repr(sorted({**asdict(self), "version": RECIPE_VERSION}.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_hash(model_dir: Path) -> str:
    """A digest of the files that decide the table: the weights, the tokenizer and the model config."""
    h = hashlib.sha256()
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        path = model_dir / name
        h.update(name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


def table_path(model_dir: Path, recipe: Recipe) -> Path:
    return (
        cache_dir()
        / "static-embeddings"
        / f"{model_dir.name}-{model_hash(model_dir)}-{recipe.key()}.safetensors"
    )


@torch.inference_mode()
def token_outputs(model, tokenizer, tokens: int | None = None, batch: int = 512, progress: bool = True):
    """(vocab, hidden): each token id's output at its own position, [CLS] id [SEP] the whole input."""
    from tqdm import tqdm

    vocab = len(tokenizer) if tokens is None else min(tokens, len(tokenizer))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    device = next(model.parameters()).device
    out = torch.empty(vocab, model.config.hidden_size)
    bar = tqdm(total=vocab, desc="static embedding table", unit="tok", disable=not progress, leave=False)
    for start in range(0, vocab, batch):
        ids = torch.arange(start, min(start + batch, vocab))
        rows = torch.stack([torch.full_like(ids, cls), ids, torch.full_like(ids, sep)], dim=1).to(device)
        hidden = model(input_ids=rows, attention_mask=torch.ones_like(rows)).last_hidden_state
        out[start : start + len(ids)] = hidden[:, 1].float().cpu()
        bar.update(len(ids))
    bar.close()
    return out


def finish(raw: torch.Tensor, recipe: Recipe, first_word: int) -> torch.Tensor:
    """PCA and SIF weights applied to the raw token outputs. `first_word`: the id where the frequency-ordered
    part of the vocabulary begins (its rank 1); earlier ids get the weight of rank 1."""
    table = raw.double()
    if recipe.dims is not None:
        table = table - table.mean(0)
        dims = min(recipe.dims, table.shape[1])
        _, _, v = torch.linalg.svd(table, full_matrices=False)
        table = table @ v[:dims].T
    if recipe.sif is not None:
        rank = (torch.arange(len(table), dtype=torch.float64) - first_word).clamp(min=0) + 1
        p = (1 / rank) / (1 / rank).sum()
        table = table * (recipe.sif / (recipe.sif + p)).unsqueeze(1)
    return table.float().contiguous()


def first_word_id(tokenizer) -> int:
    """The first vocabulary id that is a word of two or more letters (in BERT's vocabulary: 'the')."""
    for i in range(len(tokenizer)):
        tok = tokenizer.convert_ids_to_tokens(i)
        if len(tok) > 1 and tok.isalpha():
            return i
    return 0


def load_or_build(model_dir: Path, model, tokenizer, recipe: Recipe, progress: bool = True) -> torch.Tensor:
    """The cached table for this model and recipe; built (with `model`, a callable that returns it) and stored
    when absent or unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    path = table_path(model_dir, recipe)
    if path.is_file():
        try:
            return load_file(str(path))["table"]
        except (OSError, KeyError, SafetensorError) as exc:
            logger.warning("the static embedding table %s is unreadable (%s); building it again", path, exc)
    logger.info("building the static embedding table of %s (once; cached at %s)", model_dir.name, path)
    raw = token_outputs(model(), tokenizer, recipe.tokens, progress=progress)
    table = finish(raw, recipe, first_word_id(tokenizer))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        save_file({"table": table}, str(tmp), {"recipe": repr(recipe), "model": model_dir.name})
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning(
            "could not cache the static embedding table at %s (%s); using it from memory", path, exc
        )
    return table


class StaticEncoder:
    """`encode(texts)`: the normalised sum of each text's token rows (no [CLS]/[SEP]), a (n, dim) tensor."""

    def __init__(self, tokenizer, table: torch.Tensor, max_tokens: int) -> None:
        self.tokenizer, self.table, self.max_tokens = tokenizer, table, max_tokens
        self.dim = int(table.shape[1])

    @torch.inference_mode()
    def encode(self, texts: list[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        cut = [t[: self.max_tokens * CHARS_PER_TOKEN] for t in texts]
        ids = self.tokenizer(cut, add_special_tokens=False, truncation=True, max_length=self.max_tokens)[
            "input_ids"
        ]
        rows = len(self.table)
        flat = torch.tensor([i for row in ids for i in row if i < rows], dtype=torch.long)
        counts = [sum(i < rows for i in row) for row in ids[:-1]]
        offsets = torch.tensor([0, *counts], dtype=torch.long).cumsum(0)
        summed = torch.nn.functional.embedding_bag(flat, self.table, offsets, mode="sum")
        return torch.nn.functional.normalize(summed, dim=-1)


class StaticEmbedder(StaticEncoder):
    """The static embedding of the packaged model (or a sentence-transformers directory at `path`): its
    tokenizer and the cached table; the transformer is loaded only to build a missing table (on `device`)."""

    mode = "static"
    inline = True  # microseconds: encoded on the event loop, no batching

    def __init__(
        self,
        path: str | Path | None = None,
        device: str | None = None,
        max_tokens: int = 256,
        recipe: Recipe = Recipe(),
        progress: bool = True,
    ) -> None:
        from vriksha import device as devices
        from vriksha.semantic.embedder import load_model, load_tokenizer, packaged_model_dir

        self.path = Path(path) if path else packaged_model_dir()
        self.recipe = recipe
        tokenizer = load_tokenizer(self.path)

        def model():
            return load_model(self.path).to(devices.resolve(device)).eval()

        super().__init__(tokenizer, load_or_build(self.path, model, tokenizer, recipe, progress), max_tokens)
        logger.info("static embedding of %s: %d tokens x %d dims", self.path.name, *self.table.shape)
