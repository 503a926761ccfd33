"""Repo2Env: turn a Python repository and its tests into validated, leak-free coding tasks.

`vriksha repo2env SOURCE --out DIR` builds a dataset; `vriksha.envs.make_env("repo", dataset=DIR)` serves it.
"""

from vriksha.repo2env.builder import BuildConfig, build_dataset
from vriksha.repo2env.dataset import Dataset
from vriksha.repo2env.dataset_check import validate_dataset

__all__ = ["BuildConfig", "build_dataset", "Dataset", "validate_dataset"]
