"""The PrivateUse1 test backend builds, registers, and computes what the CPU computes."""

import pytest
import torch

from tests.device_backend import NAME, compiler_missing, load

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(compiler_missing() is not None, reason=compiler_missing() or ""),
]


@pytest.fixture(scope="module")
def vdev():
    return load()


def test_the_device_is_the_accelerator_torch_reports(vdev):
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == NAME
    assert torch.device(NAME).type == NAME


def test_tensors_live_in_the_backends_memory_and_compute_like_the_cpu(vdev):
    before = vdev.live_allocations()
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    b = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    x, y = a.to(NAME), b.to(NAME)
    assert x.device.type == NAME and vdev.live_allocations() > before
    calls = vdev.fallback_calls()
    out = torch.softmax(x @ y, dim=-1).sum(0)
    assert out.device.type == NAME and vdev.fallback_calls() > calls  # kernels ran through the CPU fallback
    assert torch.equal(out.cpu(), torch.softmax(a @ b, dim=-1).sum(0))
    view = x.view(35)[3:9]
    view.add_(1)
    assert torch.equal(x.cpu().view(35)[3:9], a.view(35)[3:9] + 1)  # views alias the device memory
