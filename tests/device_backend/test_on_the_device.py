"""The vdev checks run in their own process: registering a PrivateUse1 backend makes it the process's
accelerator (`torch.accelerator`), which every later test in the same process would then pick up."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.device_backend import compiler_missing

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.skipif(compiler_missing() is not None, reason=compiler_missing() or "")
def test_vdev_checks_pass_in_their_own_process():
    files = [str(HERE / "checks_vdev.py"), str(HERE / "checks_on_device.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=HERE.parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
