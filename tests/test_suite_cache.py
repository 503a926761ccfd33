"""The suite's measured choices stay with the suite (tests/conftest.py)."""

import os
from pathlib import Path

from vriksha.artifact_store import cache_dir


def test_the_suite_measures_into_a_cache_of_its_own_that_links_the_built_artifacts():
    suite = cache_dir()
    assert os.environ["VRIKSHA_TEST_CACHE_ISOLATED"] == "1"
    assert suite != (Path.home() / ".cache" / "vriksha").resolve()
    assert suite.name.startswith("vriksha-test-cache-")
    for name in ("models", "native"):
        link = suite / name
        assert link.is_symlink(), (
            f"{link} should link the user's {name} (else every run converts or compiles again)"
        )
        assert link.resolve() != suite / name
