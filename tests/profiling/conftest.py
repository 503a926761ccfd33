from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def tiny_decode(steps: int = 8, tokens: int = 60) -> callable:
    """A batch-of-one decode loop: many 1-element ops, Python bookkeeping and a host sync per token."""

    def run(prof: profile) -> None:
        state = torch.zeros(1)
        w = torch.full((1,), 0.5)
        for _ in range(steps):
            with record_function("engine.forward"):
                out: list[int] = []
                for t in range(tokens):
                    state = torch.tanh(state * w + 1.0)
                    tok = int(state.item() * 100) % 7
                    out.append(tok)
                    _ = {"t": t, "tok": tok, "text": str(out[-3:])}
            prof.step()

    return run


def batched_matmul(steps: int = 8, batch: int = 8, n: int = 160) -> callable:
    def run(prof: profile) -> None:
        a = torch.randn(batch, n, n)
        b = torch.randn(batch, n, n)
        for _ in range(steps):
            with record_function("engine.forward"):
                c = torch.bmm(a, b)
                c = torch.bmm(c, b)
            prof.step()

    return run


def record(path: Path, workload, wait: int = 1, warmup: int = 1, active: int = 5) -> Path:
    """Plain torch.profiler code: a scheduled profile of `workload`, exported as a Chrome trace."""
    written: list[Path] = []

    def handler(p: profile) -> None:
        p.export_chrome_trace(str(path))
        written.append(path)

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=handler,
    ) as prof:
        workload(prof)
    assert written, "the profiler schedule never completed"
    return path


@pytest.fixture(scope="session")
def tiny_trace(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("tiny") / "tiny.json", tiny_decode())


@pytest.fixture(scope="session")
def matmul_trace(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("mm") / "matmul.json.gz", batched_matmul())


def _write_trace(path: Path, events: list[dict], **top) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events, **top}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture
def write_trace():
    """Write a hand-made Chrome trace: write_trace(path, events, **top_level_keys) -> path."""
    return _write_trace


def native_linears(steps: int = 8, rows: int = 64, n: int = 512) -> callable:
    """Each step one native linear kernel call, as the engine's steps are a few native calls."""
    from vriksha.engine.platform import native

    lib = native.kernels()
    if lib is None:
        pytest.skip("the native kernels did not build here (no C compiler, or VRIKSHA_NATIVE=0)")
    x, w = torch.randn(rows, n), torch.randn(n, n)

    def run(prof: profile) -> None:
        for _ in range(steps):
            with record_function("engine.forward"):
                for _ in range(4):
                    lib.linear(x, w)
            prof.step()

    return run


@pytest.fixture(scope="session")
def native_trace(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("native") / "native.json", native_linears())
