"""Fixtures of the launcher tests: the trainer tests' tiny digit model."""

from tests.train.conftest import tiny_model_dir  # noqa: F401 (a fixture)
