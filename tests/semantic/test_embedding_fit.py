"""The packaged embedding model, the micro-batcher, `vriksha route fit` and `vriksha route eval`."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from vriksha.cli import main
from vriksha.errors import ModelLoadError
from vriksha.router.semantic.batcher import EmbedBatcher
from vriksha.router.semantic.embedder import Embedder, packaged_model_dir

PROMPTS = Path(__file__).resolve().parents[2] / "vriksha/router/semantic/prompts"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(device="cpu")


def test_matches_sentence_transformers(embedder: Embedder):
    from sentence_transformers import SentenceTransformer

    texts = [
        "What is the derivative of x^2?",
        "hey, how's it going",
        "Write a SQL query for the top customers",
    ]
    ours = embedder.encode(texts)
    theirs = torch.tensor(
        SentenceTransformer(str(packaged_model_dir()), device="cpu").encode(texts, normalize_embeddings=True)
    )
    assert ours.shape == (3, 384)
    assert torch.allclose(ours, theirs, atol=1e-5)
    sims = ours @ ours.T
    assert float(sims[0, 1]) < 0.5  # different intents are far apart


def test_batcher_batches_concurrent_requests(embedder: Embedder):
    sizes: list[int] = []
    texts = [f"question number {i} about geography" for i in range(8)]

    async def run() -> list[torch.Tensor]:
        b = EmbedBatcher(
            embedder.encode, max_batch=32, max_wait_ms=50, on_batch=lambda n, _s: sizes.append(n)
        )
        b.start()
        try:
            return await asyncio.gather(*(b.embed(t) for t in texts))
        finally:
            await b.stop()

    out = asyncio.run(run())
    assert sum(sizes) == 8 and len(sizes) < 8
    alone = embedder.encode([texts[3]])[0]
    assert torch.allclose(out[3], alone, atol=1e-5)


def test_broken_model_dir_is_a_clear_error(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="could not load the embedding model"):
        Embedder(tmp_path)


def _subset(src: Path, dst: Path, per_label: int) -> None:
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    kept, seen = [], {}
    for r in rows:
        if seen.get(r["label"], 0) < per_label:
            kept.append(r)
            seen[r["label"]] = seen.get(r["label"], 0) + 1
    dst.write_text("".join(json.dumps(r) + "\n" for r in kept))


def test_fit_then_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    routes = tmp_path / "routes.yaml"
    shutil.copy(PROMPTS / "routes.yaml", routes)
    _subset(PROMPTS / "train.jsonl", tmp_path / "train.jsonl", 14)
    _subset(PROMPTS / "heldout.jsonl", tmp_path / "heldout.jsonl", 5)
    assert main(["route", "fit", str(routes), str(tmp_path / "train.jsonl")]) == 0
    head = tmp_path / "routes.intent.static.safetensors"  # the default mode's head
    assert head.is_file()
    out = capsys.readouterr().out
    assert "fitted intent on 70 examples" in out
    assert main(["route", "eval", str(routes), str(tmp_path / "heldout.jsonl")]) == 0
    out = capsys.readouterr().out
    acc = float(out.split("accuracy ")[1].split()[0])
    assert acc >= 0.7, out
    assert "confusion" in out and "embedding" in out and "classification" in out and "decision" in out
    # a head fitted for other labels is refused
    cfg = yaml.safe_load(routes.read_text())
    cfg["signals"]["classifier"][0]["labels"].append("poetry")
    routes.write_text(yaml.safe_dump(cfg))
    assert main(["route", "eval", str(routes), str(tmp_path / "heldout.jsonl")]) == 1
    assert "was fitted for labels" in capsys.readouterr().err


def test_a_missing_head_is_fitted_at_start_from_the_named_examples(tmp_path: Path, embedder: Embedder):
    from vriksha.router.semantic.classify import RouteClassifier
    from vriksha.router.semantic.config import load_routes

    _subset(PROMPTS / "train.jsonl", tmp_path / "train.jsonl", 10)
    shutil.copy(PROMPTS / "routes.yaml", tmp_path / "routes.yaml")
    cfg = load_routes(tmp_path / "routes.yaml")
    assert cfg.signals.classifier[0].examples == "train.jsonl"
    cfg.embedding.mode = "transformer"
    rc = RouteClassifier(cfg, embedder)
    assert (tmp_path / "routes.intent.safetensors").is_file()
    result = rc.decide("Integrate x^2 from 0 to 3", embedder.encode(["Integrate x^2 from 0 to 3"])[0])
    assert result.routes[0].pool == "careful" and result.routes[0].decision == "maths"
    result = rc.decide("hey, how was your weekend?", embedder.encode(["hey, how was your weekend?"])[0])
    assert result.routes[0].pool == "fast"
