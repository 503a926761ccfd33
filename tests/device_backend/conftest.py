"""Fixtures shared with the engine tests."""

from tests.engine.conftest import default_tokenizer  # noqa: F401
