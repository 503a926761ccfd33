"""Settings every test, and every server and trainer the tests start, runs under.

- The suite's engines and trainers compute in fp32, the dtype their reference outputs were written for.
  `dtype="auto"` would pick bf16 on a CPU with fast bf16 (AMX, AVX512-BF16) and change the numbers tests
  compare against fp32 Transformers references; `$VRIKSHA_DTYPE` pins it here (and in the servers and trainers
  the tests start). The tests of the choice itself (tests/engine/test_dtype_auto.py,
  tests/train/test_precision.py) unset it.
- What the suite measures stays with the suite. The engine keeps its measured choices (linear-layer paths,
  native decode, the dtype) as JSON files in `$VRIKSHA_CACHE`, and a suite that runs servers and trainers
  side by side times them on a loaded CPU: kept in the user's cache, such a timing (a 1-row packed matmul
  read 8 ms instead of 24 us) would steer every later engine on the machine. So `$VRIKSHA_CACHE` points at a
  directory of this run, whose built artifacts (converted models, compiled kernels, extensions) are links
  into the user's cache, so nothing is converted or compiled twice. Nor does the suite refuse what it timed
  on its busy CPU (`$VRIKSHA_TIMING_MAX_LOAD=1`): its cache dies with the run, and timing every choice again
  at each engine start would multiply the suite's time. The tests of that refusal
  (tests/engine/test_timing_load.py) set their own limit.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from vriksha.cache import cache_dir

os.environ.setdefault("VRIKSHA_DTYPE", "float32")
os.environ.setdefault("VRIKSHA_TIMING_MAX_LOAD", "1")

SHARED_ARTIFACTS = ("models", "native", "repo2env", "static-embeddings", "vdev")


def _suite_cache() -> None:
    if os.environ.get("VRIKSHA_TEST_CACHE_ISOLATED") == "1":
        return  # a nested pytest run, started by a test, keeps the outer run's directory
    user = cache_dir()
    suite = Path(tempfile.mkdtemp(prefix="vriksha-test-cache-"))
    for name in SHARED_ARTIFACTS:
        try:
            (user / name).mkdir(parents=True, exist_ok=True)
            (suite / name).symlink_to(user / name, target_is_directory=True)
        except OSError:
            pass  # an unwritable user cache: this run builds into its own directory
    os.environ["VRIKSHA_CACHE"] = str(suite)
    os.environ["VRIKSHA_TEST_CACHE_ISOLATED"] = "1"
    atexit.register(shutil.rmtree, suite, True)


_suite_cache()
