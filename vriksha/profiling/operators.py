"""Which operators count as compute: the one definition the overhead verdict rests on.

A *compute operator* does arithmetic on tensor data:
- matmul: mm, bmm, addmm, addmv, baddbmm, matmul, linear, einsum, dot, mv, _int_mm, scaled/grouped mm;
- convolution: convolution, conv1d/2d/3d, conv_transpose*, cudnn/mkldnn/miopen convolutions;
- attention: scaled_dot_product_attention and its flash/efficient/math/cudnn kernels;
- elementwise and activation math: add, sub, mul, div, pow, exp, log, sqrt, rsqrt, sin, cos, tanh,
  sigmoid, relu, gelu, silu, softmax, log_softmax, where, clamp, neg, abs, ... (and their in-place `_` forms);
- normalisation and reductions: layer_norm, rms_norm, group_norm, batch_norm, sum, mean, max, min,
  argmax, topk, sort, cumsum, var, norm; loss functions (cross_entropy, nll_loss, mse_loss) and embedding.
Everything else is *not compute*: memory and layout (copy_, to, contiguous, cat, index, view, reshape,
empty, fill_, zero_), host-device synchronisation (item, _local_scalar_dense), Python, the framework.
Backward kernels (`aten::*_backward`) count as compute when their forward does; autograd nodes
(`MmBackward0`, `evaluate_function: ...`) are wrappers whose own time is engine overhead, not compute.
"""

from __future__ import annotations

import re

MATMUL = frozenset(
    "mm bmm addmm addmv addbmm baddbmm matmul linear einsum dot vdot mv _int_mm _scaled_mm "
    "_grouped_mm _scaled_grouped_mm mkldnn_linear _addmm_activation bilinear".split()
)
CONV = frozenset(
    "convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d "
    "cudnn_convolution cudnn_convolution_transpose mkldnn_convolution miopen_convolution "
    "_convolution_mode convolution_overrideable _slow_conv2d_forward slow_conv3d".split()
)
ATTENTION = frozenset(
    "scaled_dot_product_attention _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
    "_scaled_dot_product_attention_math _scaled_dot_product_cudnn_attention "
    "_scaled_dot_product_flash_attention_for_cpu _flash_attention_forward _efficient_attention_forward "
    "_fused_sdp_choice multi_head_attention_forward _native_multi_head_attention".split()
)
ELEMENTWISE = frozenset(
    "add sub rsub mul div true_divide floor_divide remainder fmod pow exp exp2 expm1 log log2 log10 log1p "
    "sqrt rsqrt reciprocal sin cos tan tanh sinh cosh asin acos atan atan2 sigmoid relu relu6 leaky_relu "
    "elu selu celu gelu silu mish hardswish hardsigmoid hardtanh softplus glu softmax _softmax log_softmax "
    "_log_softmax where clamp clamp_min clamp_max clip neg abs sign lerp addcmul addcdiv erf erfc "
    "erfinv maximum minimum floor ceil round trunc frac square logit xlogy sgn logical_not logical_and "
    "logical_or threshold eq ne lt le gt ge masked_fill tril triu polar dropout native_dropout "
    "_fused_dropout bernoulli multinomial".split()
)
NORM_REDUCE = frozenset(
    "layer_norm native_layer_norm rms_norm _fused_rms_norm group_norm native_group_norm batch_norm "
    "native_batch_norm _batch_norm_impl_index instance_norm sum mean prod max min amax amin argmax argmin "
    "topk sort argsort cumsum cumprod var std var_mean std_mean norm linalg_vector_norm logsumexp all any "
    "embedding_dense cross_entropy nll_loss nll_loss_nd nll_loss_forward mse_loss l1_loss smooth_l1_loss "
    "binary_cross_entropy binary_cross_entropy_with_logits kl_div embedding embedding_bag "
    "_embedding_bag".split()
)
COMPUTE_OPS: frozenset[str] = MATMUL | CONV | ATTENTION | ELEMENTWISE | NORM_REDUCE

_NON_COMPUTE_KERNEL = re.compile(r"memcpy|memset|copy_kernel|fill_kernel|Memcpy|Memset", re.IGNORECASE)


def base_name(op: str) -> str:
    """'aten::add_' -> 'add'; 'aten::_softmax.out' -> '_softmax'."""
    name = op.rsplit("::", 1)[-1].split(".", 1)[0]
    if name.endswith("_") and not name.endswith("__") and name[:-1] in COMPUTE_OPS:
        name = name[:-1]
    return name


def is_compute_op(op: str) -> bool:
    """True if the host operator `op` (as named in a trace) is a compute operator."""
    name = base_name(op)
    if name in COMPUTE_OPS:
        return True
    for suffix in ("_backward_data", "_backward_input", "_backward_weight", "_backward"):
        if name.endswith(suffix):
            fwd = name[: -len(suffix)]
            return (
                fwd in COMPUTE_OPS
                or fwd.lstrip("_") in COMPUTE_OPS
                or fwd.replace("native_", "") in COMPUTE_OPS
            )
    return False


def is_compute_kernel(kernel: str, launched_by: str | None) -> bool:
    """A device kernel is compute when the operator that launched it is; unknown launcher: not a copy/fill."""
    if launched_by is not None:
        return is_compute_op(launched_by)
    return _NON_COMPUTE_KERNEL.search(kernel) is None
