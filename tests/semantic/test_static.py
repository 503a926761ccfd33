"""The static embedding: the table distilled from the packaged model (deterministic, cached by the model's
hash and the recipe, rebuilt when unreadable), its vectors (shape, unit norm), the `embedding.mode` field,
and the classifier head fitted on it reaching the stated accuracy on the shipped held-out prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vriksha.errors import ConfigError
from vriksha.router.semantic.embedder import load_model, load_tokenizer, packaged_model_dir
from vriksha.router.semantic.static import Recipe, StaticEmbedder, StaticEncoder, load_or_build, table_path

PROMPTS = Path(__file__).resolve().parents[2] / "vriksha/router/semantic/prompts"
SMALL = Recipe(tokens=2100)  # [PAD] .. the first ~100 words: a table built in seconds


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return packaged_model_dir()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return load_tokenizer(model_dir)


def _no_model():
    raise AssertionError("the cached table was rebuilt")


def test_table_is_deterministic_cached_and_rebuilt_when_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path, tokenizer
):
    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "a"))
    calls = []

    def model():
        calls.append(1)
        return load_model(model_dir).eval()

    first = load_or_build(model_dir, model, tokenizer, SMALL, progress=False)
    path = table_path(model_dir, SMALL)
    assert path.is_file() and str(tmp_path / "a") in str(path) and calls == [1]
    assert first.shape == (2100, 384) and torch.isfinite(first).all()
    assert torch.equal(load_or_build(model_dir, _no_model, tokenizer, SMALL, progress=False), first)
    assert table_path(model_dir, Recipe(tokens=2100, dims=128)) != path  # the recipe is in the key

    monkeypatch.setenv("VRIKSHA_CACHE", str(tmp_path / "b"))  # a fresh cache: the same table again
    again = load_or_build(model_dir, model, tokenizer, SMALL, progress=False)
    assert calls == [1, 1] and torch.allclose(again, first, atol=1e-5)

    table_path(model_dir, SMALL).write_bytes(b"not a table")
    rebuilt = load_or_build(model_dir, model, tokenizer, SMALL, progress=False)
    assert calls == [1, 1, 1] and torch.allclose(rebuilt, first, atol=1e-5)


def test_vectors_have_unit_norm_and_do_not_depend_on_the_batch(tokenizer):
    table = torch.randn(len(tokenizer), 64)
    enc = StaticEncoder(tokenizer, table, max_tokens=256)
    texts = ["What is 17 * 23?", "hello there", "What is 17 * 23?", "x" * 50_000]
    out = enc.encode(texts)
    assert out.shape == (4, 64)
    assert torch.allclose(out.norm(dim=-1), torch.ones(4), atol=1e-5)
    assert torch.allclose(out[0], out[2]) and torch.allclose(
        out[1], enc.encode(["hello there"])[0], atol=1e-6
    )
    ids = tokenizer("hello there", add_special_tokens=False)["input_ids"]
    expect = torch.nn.functional.normalize(table[ids].sum(0), dim=0)
    assert torch.allclose(out[1], expect, atol=1e-5)  # the mean of its token rows, normalised
    assert enc.encode([]).shape == (0, 64)
    assert enc.encode([""]).abs().sum() == 0  # nothing to read: no direction, so no signal fires


def test_embedding_mode_and_model_are_checked_by_name():
    from vriksha.router.semantic.config import parse_routes

    base = {"pools": [{"name": "a", "replicas": ["http://127.0.0.1:1"]}], "default": {"pool": "a"}}
    assert parse_routes(base).embedding.mode == "static"
    assert parse_routes({**base, "embedding": {"mode": "transformer"}}).embedding.mode == "transformer"
    with pytest.raises(ConfigError, match=r"embedding\.mode: Input should be 'static' or 'transformer'"):
        parse_routes({**base, "embedding": {"mode": "fast"}})
    with pytest.raises(ConfigError, match=r"embedding\.model: Input should be 'minilm'"):
        parse_routes({**base, "embedding": {"model": "bert"}})


@pytest.mark.slow
def test_static_head_reaches_090_on_the_held_out_prompts_and_heads_keep_their_mode(tmp_path: Path):
    import yaml

    from vriksha.router.semantic.config import load_routes
    from vriksha.router.semantic.examples import encode_all, fit_signal, load_examples
    from vriksha.router.semantic.head import Head

    embedder = StaticEmbedder(device="cpu")  # the real table, from the shared cache (built on first use)
    assert embedder.dim == 384 and embedder.inline
    path = tmp_path / "routes.yaml"
    path.write_text((PROMPTS / "routes.yaml").read_text())
    cfg = load_routes(path)
    sig = cfg.signals.classifier[0]
    train = load_examples(PROMPTS / "train.jsonl", sig.labels)
    head, train_acc = fit_signal(sig, train, embedder.encode)
    held = load_examples(PROMPTS / "heldout.jsonl", sig.labels)
    emb = encode_all(embedder.encode, [e.text for e in held])
    assert torch.allclose(emb.norm(dim=-1), torch.ones(len(held)), atol=1e-5)
    predicted = head.probs(emb).argmax(-1).tolist()
    acc = sum(head.labels[p] == e.label for p, e in zip(predicted, held, strict=True)) / len(held)
    assert train_acc >= 0.95 and acc >= 0.90, (train_acc, acc)

    head_path = cfg.head_path(sig)
    assert head_path.name == "routes.intent.static.safetensors"
    head.save(head_path, {"mode": "static"})
    assert Head.load(head_path, sig.labels, "static").labels == sig.labels
    with pytest.raises(
        ConfigError, match="fitted on static embeddings, the config's embedding.mode is transformer"
    ):
        Head.load(head_path, sig.labels, "transformer")
    data = yaml.safe_load(path.read_text())
    data["embedding"] = {"mode": "transformer"}
    path.write_text(yaml.safe_dump(data))
    assert load_routes(path).head_path(sig).name == "routes.intent.safetensors"
