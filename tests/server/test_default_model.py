"""`vriksha serve` with no --model serves the embedded SmolLM2-135M-Instruct and answers in real text."""

from __future__ import annotations

import openai
import pytest


@pytest.mark.slow
def test_default_model_chat(server_factory):
    server = server_factory([])
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
        temperature=0,
    )
    text = r.choices[0].message.content
    assert "Paris" in text, text
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
