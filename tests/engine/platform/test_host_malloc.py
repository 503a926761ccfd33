"""Host malloc tuning: a CPU engine raises glibc's mmap and trim thresholds once per process, so blocks freed
by one step are reused by the next instead of being faulted in again (counted in fresh processes: the
setting is process-wide), and the user's own allocator settings are left alone. What it saves in the engine
itself depends on the kernels' allocations (docs/engine.md measures a prefill step)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from tests.engine.conftest import ENGINE_TEST_OPTIONS, tiny_model
from vriksha import LLM
from vriksha.engine.platform import host_malloc

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

GROWING_BLOCKS = """
import ctypes, resource, sys
from vriksha.engine.platform import host_malloc
if sys.argv[1] == "on":
    assert host_malloc.keep_freed_memory().tuned
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for mib in range(1, 21):  # a step's activations growing: each block written, then freed
    p = libc.malloc(mib << 20)
    ctypes.memset(p, 1, mib << 20)
    libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(setting: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in {*host_malloc.USER_SETTINGS, "LD_PRELOAD"}}
    out = subprocess.run(
        [sys.executable, "-c", GROWING_BLOCKS, setting], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


def test_freed_blocks_are_reused_not_faulted_in_again():
    default, tuned = _faults("off"), _faults("on")
    print(f"minor page faults over blocks of 1..20 MiB: default {default}, tuned {tuned}")
    assert default > 40_000  # 210 MiB: every block mapped afresh (each above the threshold its last free set)
    assert tuned < default / 4  # the heap grows to the largest block once (20 MiB, ~5,000 pages)


def test_a_cpu_engine_applies_it_and_says_so(default_tokenizer):
    model = tiny_model("llama", 256)
    with LLM.from_module(model, default_tokenizer, **ENGINE_TEST_OPTIONS) as llm:
        choice = llm.engine.host_malloc
    assert choice.describe().startswith("host malloc")
    clean = not any(name in os.environ for name in host_malloc.USER_SETTINGS) and not os.environ.get(
        "LD_PRELOAD"
    )
    assert choice.tuned == clean, choice.reason
    with LLM.from_module(model, default_tokenizer, host_malloc_tuning=False, **ENGINE_TEST_OPTIONS) as llm:
        assert not llm.engine.host_malloc.tuned and "off" in llm.engine.host_malloc.reason


def test_the_users_settings_are_left_alone(monkeypatch):
    monkeypatch.setattr(host_malloc, "_choice", None)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    choice = host_malloc._tune()
    assert not choice.tuned and "MALLOC_TRIM_THRESHOLD_" in choice.reason
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    for name in host_malloc.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")
    choice = host_malloc._tune()
    assert not choice.tuned and "tcmalloc" in choice.reason
