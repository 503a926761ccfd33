"""The tokenizer and tiny base model that the adapter tests build their engines and adapters on."""

from __future__ import annotations

import pytest

from tests.tiny_llama import embedded_tokenizer, tiny_llama


@pytest.fixture(scope="module")
def tok():
    return embedded_tokenizer()


@pytest.fixture(scope="module")
def base(tok):
    return tiny_llama(tok, initializer_range=0.2).eval()
