"""Memory layout of convolutions: the transposes cuDNN / MIOpen add around a convolution whose
tensors are NCHW (contiguous) while its fastest kernel wants NHWC (channels_last).

Read by the `no_channels_last` rule and its inject mechanism.  Names as real traces write them
(../shared/traces, the examples): cuDNN `cudnn::ops::nchwToNhwcKernel<...>` /
`nhwcToNchwKernel<...>` (older cuDNN without the namespace), MIOpen `batched_transpose_*` and
`transpose_NCHW2CNHW` / `transpose_CNHW2NCHW`.  A transpose counts when the convolution launched
it (its enclosing cpu_op is a convolution: `aten::cudnn_convolution`,
`aten::convolution_backward`, `aten::miopen_convolution`, ...); one with no enclosing op
recorded (a GPU-only trace, a launch the profiler did not nest), when the trace runs
convolution kernels at all.
"""

from __future__ import annotations

import numpy as np

from ..trace import Trace
from .signals import cached, compute_rows, name_mask

#: Layout transpose kernels of the convolution libraries.
TRANSPOSE = (r"nchwToNhwcKernel|nhwcToNchwKernel|nchw2nhwc|nhwc2nchw|batched_transpose_"
             r"|transpose_(NCHW2CNHW|CNHW2NCHW|NCHW2NHWC|NHWC2NCHW)")
#: cpu_ops of a convolution (forward and backward; cuDNN and MIOpen).
CONV_OP = r"convolution|conv\d?d\b|cudnn_conv|miopen_conv|mkldnn_conv"
#: Convolution kernels (implicit GEMM, cuDNN's own, MIOpen's igemm / asm / naive ones).
CONV_KERNEL = (r"(?i)(fprop|dgrad|wgrad)_implicit_gemm|ImplicitGemmConvolution|s1688(fprop|dgrad"
               r"|wgrad)|scudnn|convolve_sgemm|igemm_(fwd|bwd|wrw)|miopenSp\dAsmConv|naive_conv")


def conv_transpose_rows(trace: Trace) -> np.ndarray:
    """Layout transpose kernels launched around convolutions, in time order."""
    def make() -> np.ndarray:
        k = compute_rows(trace)
        if not len(k):
            return k
        rows = k[name_mask(trace, TRANSPOSE)[trace.name[k]]]
        if not len(rows):
            return rows
        op = trace.cpu_op[rows]
        conv_op = name_mask(trace, CONV_OP)[trace.name[np.maximum(op, 0)]] & (op >= 0)
        # no enclosing op recorded (a GPU-only trace, a launch the profiler did not nest):
        # the transpose counts when the trace runs convolutions
        has_conv = bool(name_mask(trace, CONV_KERNEL)[trace.name[k]].any())
        return rows[conv_op | ((op < 0) & has_conv)]
    return cached(trace, "layout:conv_transposes", make)


def conv_rows(trace: Trace) -> np.ndarray:
    """Convolution kernels, in time order."""
    def make() -> np.ndarray:
        k = compute_rows(trace)
        return k[name_mask(trace, CONV_KERNEL)[trace.name[k]]] if len(k) else k
    return cached(trace, "layout:conv_kernels", make)


__all__ = ["CONV_KERNEL", "CONV_OP", "TRANSPOSE", "conv_rows", "conv_transpose_rows"]
