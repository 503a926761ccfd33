from __future__ import annotations

import pytest

from vriksha.profiling.operators import is_compute_kernel, is_compute_op


@pytest.mark.parametrize(
    "op",
    [
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::linear",
        "aten::convolution",
        "aten::add_",
        "aten::mul",
        "aten::_softmax",
        "aten::gelu",
        "aten::native_layer_norm",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::sum",
        "aten::threshold_backward",
        "aten::convolution_backward",
        "aten::embedding",
        "mkldnn::_linear_pointwise",
        "aten::_weight_int8pack_mm",
        "triton_poi_fused_add_mul_0",
        "cpp_fused_silu_1",
    ],
)
def test_compute_operators(op):
    assert is_compute_op(op)


@pytest.mark.parametrize(
    "op",
    [
        "aten::copy_",
        "aten::to",
        "aten::_to_copy",
        "aten::empty",
        "aten::view",
        "aten::cat",
        "aten::index",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::fill_",
        "MmBackward0",
        "autograd::engine::evaluate_function: MmBackward0",
        "engine.forward",
        "cudaLaunchKernel",
        "Torch-Compiled Region: 0/0",
    ],
)
def test_not_compute(op):
    assert not is_compute_op(op)


def test_kernels_follow_their_launching_operator_else_their_name():
    assert is_compute_kernel("void at::native::elementwise_kernel", "aten::add")
    assert not is_compute_kernel("void at::native::elementwise_kernel", "aten::copy_")
    assert is_compute_kernel("sm90_xmma_gemm_bf16", None)
    assert not is_compute_kernel("Memcpy HtoD (Pageable -> Device)", None)
