"""`evaluate(..., save=PATH)` (`vriksha env eval --save`): every played episode as a JSONL line, which SFT
reads back as the same token ids with the loss on the generated tokens."""

from __future__ import annotations

import json

import pytest

llm_mod = pytest.importorskip(
    "vriksha.engine.core.llm", reason="the engine (vriksha.engine.core.llm) has not landed"
)


def test_saved_episodes_are_the_played_ids_and_sft_reads_them(tmp_path):
    from tests.tiny_llama import embedded_tokenizer, tiny_llama
    from vriksha.envs.eval import evaluate
    from vriksha.train.sft_data import read_examples

    tok = embedded_tokenizer()
    llm = llm_mod.LLM.from_module(tiny_llama(tok, max_position_embeddings=2048).eval(), tok)
    path = tmp_path / "out" / "episodes.jsonl"
    res = evaluate("calculator_tools", llm, episodes=2, max_tokens=6, progress=False, samples=2, save=path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["seed"], r["sample"]) for r in rows] == [(0, None), (1, None), (0, 0), (0, 1), (1, 0), (1, 1)]
    greedy = rows[:2]
    assert [r["completions"] for r in greedy] == [r.completions for r in res.records]
    assert [r["reward"] for r in greedy] == [r.reward for r in res.records]
    for r in rows:
        assert r["env"] == "calculator_tools" and len(r["loss_mask"]) == len(r["completion_ids"])
        assert tok.decode(
            [t for t, m in zip(r["completion_ids"], r["loss_mask"], strict=True) if m]
        ) == "".join(r["completions"])
    examples = read_examples(tok, path, only_successful=False)
    assert [e.ids for e in examples] == [
        r["prompt_ids"] + r["completion_ids"] for r in rows if any(r["loss_mask"])
    ]
    assert all(
        e.mask == [0] * len(r["prompt_ids"]) + r["loss_mask"] for e, r in zip(examples, rows, strict=False)
    )
