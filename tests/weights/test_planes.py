"""The data planes in one process: every tensor arrives bit-equal, in place, with one copy per side."""

from __future__ import annotations

import threading

import pytest
import torch

from vriksha.weights.counters import CopyCounter
from vriksha.weights.fs import MARKER, FsReceiver, FsSender, latest_complete
from vriksha.weights.plan import TensorSpec, WeightTransferError, buckets, check_specs, digest, layout
from vriksha.weights.shm import ShmReceiver, ShmSender, shm_available


def _tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(50, 16, generator=g)),
        ("norm.weight", torch.randn(16, generator=g).to(torch.bfloat16)),  # odd size: alignment matters
        ("odd.bias", torch.randn(7, generator=g)),
        ("proj.weight", torch.randn(33, 16, generator=g)),
    ]


def _targets() -> dict[str, torch.Tensor]:
    return {n: torch.zeros_like(t) for n, t in _tensors(0)}


def _model_bytes() -> int:
    return sum(t.nbytes for _, t in _tensors(0))


def _assert_equal(sent: list[tuple[str, torch.Tensor]], target: dict[str, torch.Tensor]) -> None:
    for n, t in sent:
        assert digest(target[n]) == digest(t), n


def test_layout_is_aligned_and_buckets_cover_every_tensor_once():
    specs = [TensorSpec.of(n, t) for n, t in _tensors(0)]
    offsets, size = layout(specs)
    assert all(o % 64 == 0 for o in offsets) and size >= sum(s.nbytes for s in specs)
    plan = buckets(specs, 2048)
    assert [s.name for b in plan for s in b.specs] == [s.name for s in specs]
    assert len(plan) > 1 and all(b.nbytes <= max(2048, max(s.nbytes for s in b.specs) + 64) for b in plan)
    with pytest.raises(WeightTransferError, match="bucket_bytes"):
        buckets(specs, 0)


def test_check_specs_names_the_mismatch():
    target = _targets()
    specs = [TensorSpec.of(n, t) for n, t in _tensors(0)]
    check_specs(specs, target)
    with pytest.raises(
        WeightTransferError,
        match=r"proj.weight: the update sends float32\[32, 16\] but the engine holds float32\[33, 16\]",
    ):
        check_specs([*specs[:3], TensorSpec("proj.weight", "float32", (32, 16))], target)
    with pytest.raises(WeightTransferError, match="lacks 1 parameter"):
        check_specs(specs[:3], target)


@pytest.mark.skipif(not shm_available(), reason="no writable /dev/shm")
def test_shared_memory_one_copy_per_side_and_buffer_reused():
    sender, receiver = ShmSender(), ShmReceiver()
    target = _targets()
    ptrs = {n: t.data_ptr() for n, t in target.items()}
    try:
        for seed in (1, 2):
            sent = _tensors(seed)
            cs, cr = CopyCounter(), CopyCounter()
            info = sender.prepare(sent, cs)
            names = receiver.receive(info, target, cr)
            assert sorted(names) == sorted(target)
            _assert_equal(sent, target)
            assert cs.bytes_copied == cr.bytes_copied == _model_bytes()
            assert cs.copies == cr.copies == len(sent)
        assert {n: t.data_ptr() for n, t in target.items()} == ptrs  # in place
        assert len(receiver._maps) == 1  # one mapping, reused by the second update
    finally:
        sender.close()
    assert not sender.path.exists()


def test_filesystem_marker_written_last_and_torn_version_refused(tmp_path):
    sender, receiver = FsSender(tmp_path, keep=2), FsReceiver()
    target = _targets()
    for v in (1, 2, 3):
        sent = _tensors(v)
        cs, cr = CopyCounter(), CopyCounter()
        info = sender.prepare(sent, cs, version=v)
        receiver.receive(info, target, cr)
        _assert_equal(sent, target)
        assert cr.bytes_copied >= _model_bytes() and cr.bytes_copied <= 2 * _model_bytes()
    assert latest_complete(tmp_path)[0] == 3
    assert not (tmp_path / "v00000001").exists()  # pruned: keeps the last two
    (tmp_path / "v00000003" / MARKER).unlink()
    assert latest_complete(tmp_path)[0] == 2
    with pytest.raises(WeightTransferError, match="incomplete"):
        receiver.receive({"dir": str(tmp_path / "v00000003")}, target, CopyCounter())


@pytest.mark.parametrize("bucket_bytes", [1024, 1 << 20])
def test_gloo_buckets_double_buffered_bit_equal(bucket_bytes):
    from vriksha.weights.gloo import GlooReceiver, GlooSender

    sender = GlooSender("127.0.0.1", bucket_bytes=bucket_bytes, timeout_s=30)
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", GlooReceiver(sender.init_info())))
    t.start()
    sender.connect()
    t.join(30)
    receiver = box["r"]
    target = _targets()
    for seed in (3, 4):
        sent = _tensors(seed)
        cs, cr = CopyCounter(), CopyCounter()
        info = sender.prepare(sent, cs)
        err: list = []

        def recv(info=info, cr=cr, err=err) -> None:
            try:
                receiver.receive(info, target, cr)
            except BaseException as exc:  # noqa: BLE001
                err.append(exc)

        rt = threading.Thread(target=recv)
        rt.start()
        sender.transmit(sent, cs)
        rt.join(30)
        assert not err and not rt.is_alive()
        _assert_equal(sent, target)
        assert cs.bytes_copied == cr.bytes_copied == _model_bytes()
        assert (
            cs.bytes_moved
            == cr.bytes_moved
            == sum(b.nbytes for b in buckets([TensorSpec.of(n, x) for n, x in sent], bucket_bytes))
        )
    assert len(receiver._bufs) == (2 if bucket_bytes == 1024 else 1)
    sender.close()
    receiver.close()
