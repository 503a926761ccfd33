"""Host malloc tuning: a CPU engine keeps freed activation pages mapped, so prefill steps stop faulting in
fresh pages (measured in fresh processes: the setting is process-wide), and the user's own allocator
settings are left alone."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from vriksha.engine import host_memory

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only"
)

PREFILLS = """
import json, resource, sys, torch
from vriksha import LLM, SamplingParams
llm = LLM(host_malloc_tuning=sys.argv[1] == "on")
g = torch.Generator().manual_seed(0)
prompts = [{"prompt_token_ids": torch.randint(100, 40000, (544,), generator=g).tolist()} for _ in range(2)]
params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
faults = []
for _ in range(4):  # two 512-token chunks in one 1,024-token step, then their last 32 tokens
    llm.flush_cache()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    llm.generate(prompts, params)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": llm.engine.host_malloc.tuned, "faults": faults}))
"""


def _prefill_faults(setting: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PREFILLS, setting], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prefill_steps_stop_faulting_in_pages():
    drop = {*host_memory.USER_SETTINGS, "LD_PRELOAD", "VRIKSHA_DTYPE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    on = _prefill_faults("on", env)  # first: it also fills the timing caches, whose measuring at load would
    off = _prefill_faults("off", env)  # raise glibc's own adaptive thresholds in the process that measures
    print(f"minor page faults per 1,024-token prefill: default {off['faults']}, tuned {on['faults']}")
    assert not off["tuned"] and on["tuned"]
    assert min(off["faults"][1:]) > 10_000  # tens of MiB of activations faulted in and zeroed every time
    assert max(on["faults"][2:]) < min(off["faults"][1:]) / 10


def test_the_users_settings_are_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_choice", None)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    choice = host_memory._tune()
    assert not choice.tuned and "MALLOC_TRIM_THRESHOLD_" in choice.reason
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    for name in host_memory.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")
    choice = host_memory._tune()
    assert not choice.tuned and "tcmalloc" in choice.reason
    assert not host_memory.keep_freed_memory(enabled=False).tuned
