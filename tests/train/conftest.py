"""Fixtures of the trainer tests: the tiny digit model their runs train."""

from __future__ import annotations

import pytest
import torch

from tests.tiny_llama import embedded_tokenizer, save_model_dir, tiny_llama


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return digit_model_dir(tmp_path_factory.mktemp("tiny") / "model")


def digit_model_dir(out):
    """A tiny random Llama whose output layer gives weight only to the ten digit tokens.

    Completions are one token long, so one-digit arithmetic episodes score sometimes and groups carry a
    learning signal."""
    tok = embedded_tokenizer()
    model = tiny_llama(tok, tie_word_embeddings=False)
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    # every prompt ends with the same assistant header, so the last hidden state hardly varies:
    # digit rows along it get logits near 12, every other row 0, so digits take nearly all the mass
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 2 + 3."}], add_generation_prompt=True, tokenize=False
    )
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([tok(prompt)["input_ids"]])).last_hidden_state[0, -1]
        w = model.lm_head.weight
        w.zero_()
        g = torch.Generator().manual_seed(0)
        for d in digits:
            w[d] = 12.0 * h / h.dot(h) + 0.05 * torch.randn(h.shape, generator=g)
    return save_model_dir(model, tok, out)
