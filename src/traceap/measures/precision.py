"""Numeric precision of the GPU's matrix work: which GEMM / convolution kernels run in FP32
without tensor cores, and how much faster the same GPU runs them on its tensor cores.

Read by the `no_mixed_precision` rule (its time lost) and by its inject mechanism (the
durations it plants), so the rule and the plant use one speed-up.

Kernel names (seen in ../shared/traces and the examples; CUDA and ROCm):

- FP32 without tensor cores, CUDA: cuBLAS `volta_sgemm_128x32_nt`, `ampere_sgemm_32x32_sliced1x4_tn`,
  `cutlass_80_simt_sgemm_*`, the small-N `gemmSN_*` / `gemmk1_kernel` on `<float const>`
  operands; cuDNN `cudnn_ampere_scudnn_128x64_relu_*`, `volta_scudnn_*`,
  `implicit_convolve_sgemm`, `ampere_gcgemm_*` (complex FP32, FFT convolutions); xmma/cutlass
  `*_f32f32_f32f32_*` without `tf32`.  `s1688gemm` / `tensorop` / `xmma ... tf32` names are
  TF32 tensor-core kernels: already fast, not counted.
- FP32, ROCm: hipBLASLt / Tensile `Cijk_<A>_<B>_S_...` / `Cijk_<A>_<B>_SB_...` (data type S;
  `BBS`, `HHS` are bf16 / fp16), MIOpen `igemm_*_fp32_*`, `*Conv*fp32*`, `naive_conv_*_float`.
  On MI200/MI300 these already use FP32 matrix cores, slower than the bf16 ones all the same.
- Names with fp16 / bf16 / half anywhere (`ampere_fp16_sgemm_fp16_*`) are not FP32 work.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace import Trace
from .signals import cached, compute_rows, name_mask

#: FP32 GEMM / convolution kernels that use no tensor core (see the module docstring).
FP32_MATMUL = (r"(?i)(^|[^a-z0-9])((volta|turing|ampere|hopper|maxwell|sm\d+)_)?sgemm"
               r"|simt_sgemm|scudnn|convolve_sgemm|gcgemm"
               r"|(gemmSN|gemmk1)_\w*<float,.*cublasGemvTensorStridedBatched<float const>"
               r"|_f32f32_f32f32_"
               r"|^Cijk_[A-Za-z]+_[A-Za-z]+_SB?_"
               r"|igemm_\w*fp32|conv\w*fp32|naive_conv_\w*_float")
#: Names that say the work is not FP32 (or runs on tensor cores), whatever else they say.
NOT_FP32 = r"(?i)fp16|f16|bf16|half|tf32|xf32|tensorop|s1688|s16816|h884|s884|i8816|hmma|wmma"
#: Kernels that only a GPU with tensor cores runs (when deviceProperties are missing).
TENSOR_CORE_NAMES = (r"(?i)tensorop|s1688|s16816|h884|s884|h1688|hmma|wmma|_tf32|bf16|"
                     r"sm[89]\d_xmma|sm1\d\d_|_MI\d+x\d+x\d+")
#: Architectures in FP32 kernel names (`volta_sgemm`, `ampere_sgemm`): they have tensor cores.
TENSOR_CORE_ARCH_NAMES = r"(?i)^(volta|turing|ampere|hopper|sm[789]\d|sm1\d\d)_"

#: The most a fix is credited with: AMP speeds a model up "up to 3x" (the PyTorch performance
#: tuning guide; ../shared/ANCHORS.md), so no FP32 kernel is said to lose more than 2/3 of its
#: time, whatever the peak ratio of the GPU.
MAX_SPEEDUP = 3.0
#: Tensor-core (TF32 where the GPU has it, else FP16/BF16) over FP32 dense peak, by NVIDIA
#: compute capability (datasheets): V100 125/15.7, T4 65/8.1, A100 156/19.5 (TF32), A10 /
#: RTX 30xx / L4 / RTX 40xx about 2 (TF32 at the FP32 rate of their doubled FP32 units), H100
#: 495/67 (TF32).  The conservative choice where a GPU has two: TF32, the fix that keeps FP32
#: weights (`set_float32_matmul_precision("high")`).
NVIDIA_RATIO = {(7, 0): 8.0, (7, 2): 8.0, (7, 5): 8.0, (8, 0): 8.0, (8, 6): 2.0, (8, 7): 2.0,
                (8, 9): 2.0, (9, 0): 7.4}
#: AMD Instinct (by name): bf16 matrix over FP32 matrix peak: MI100 92.3/46.1, MI200 383/95.7,
#: MI300 (XF32) 653.7/163.4.  An AMD GPU named otherwise (blank, "AMD Radeon Graphics") gets
#: the smallest, MI100's.
AMD_RATIO = ((r"MI1\d\d", 2.0), (r"MI2\d\d", 4.0), (r"MI3\d\d", 4.0))
#: Tensor cores known only from kernel names (no deviceProperties): the smallest ratio of any
#: GPU with tensor cores, so the estimate stays conservative.
NAMES_ONLY_RATIO = 2.0


def fp32_matmul_rows(trace: Trace) -> np.ndarray:
    """Compute kernels doing FP32 GEMM / convolution work without tensor cores, in time order."""
    def make() -> np.ndarray:
        k = compute_rows(trace)
        if not len(k):
            return k
        ok = name_mask(trace, FP32_MATMUL) & ~name_mask(trace, NOT_FP32)
        return k[ok[trace.name[k]]]
    return cached(trace, "precision:fp32_rows", make)


def _props(trace: Trace) -> dict:
    return next((p for p in trace.meta.device_properties if isinstance(p, dict)), {})


def _capability(props: dict) -> tuple[int, int] | None:
    major = props.get("computeMajor", props.get("major"))
    minor = props.get("computeMinor", props.get("minor"))
    if isinstance(major, int) and isinstance(minor, int):
        return major, minor
    return None


def is_amd(trace: Trace) -> bool:
    """An AMD GPU: 64-wide wavefronts in deviceProperties, or HIP runtime calls / Tensile
    kernels when the properties are missing."""
    props = _props(trace)
    if props.get("warpSize") is not None:
        return props.get("warpSize") == 64
    return bool(name_mask(trace, r"^hip[A-Z]|^Cijk_").any())


def tensor_core_ratio(trace: Trace) -> float | None:
    """The GPU's tensor-core over FP32 peak (uncapped), or None when it has no tensor cores
    (compute capability under 7.0, an AMD GPU before MI100) or nothing says which GPU it is."""
    def make() -> float | None:
        props = _props(trace)
        cc = _capability(props)
        name = str(props.get("name") or "")
        if is_amd(trace):
            for rx, ratio in AMD_RATIO:
                if re.search(rx, name):
                    return ratio
            # CDNA (gfx9xx Instinct) reports 9.x; older GCN / RDNA have no matrix cores
            return AMD_RATIO[0][1] if cc is not None and cc[0] == 9 else (
                NAMES_ONLY_RATIO if cc is None and name_mask(trace, TENSOR_CORE_NAMES).any()
                else None)
        if cc is not None:
            if cc < (7, 0):
                return None
            return NVIDIA_RATIO.get(cc, NVIDIA_RATIO.get((cc[0], 0), 8.0))
        seen = name_mask(trace, TENSOR_CORE_NAMES) | name_mask(trace, TENSOR_CORE_ARCH_NAMES)
        return NAMES_ONLY_RATIO if seen[trace.name[compute_rows(trace)]].any() else None
    return cached(trace, "precision:ratio", make)


def speedup(trace: Trace) -> float | None:
    """How many times faster the GPU would run its FP32 matrix work on tensor cores, capped at
    `MAX_SPEEDUP`; None without tensor cores."""
    ratio = tensor_core_ratio(trace)
    return None if ratio is None else min(ratio, MAX_SPEEDUP)


def lost_share(trace: Trace) -> float:
    """The share of an FP32 matrix kernel's time tensor cores would save: 1 - 1/speedup (0
    without tensor cores)."""
    s = speedup(trace)
    return 0.0 if s is None else 1.0 - 1.0 / s


def describe_gpu(trace: Trace) -> str:
    """'Tesla V100-SXM2-16GB, compute capability 7.0' (or what is known of it)."""
    props = _props(trace)
    cc = _capability(props)
    name = str(props.get("name") or "") or "GPU of unknown name"
    if cc is not None and not is_amd(trace):
        return f"{name}, compute capability {cc[0]}.{cc[1]}"
    return name


__all__ = ["FP32_MATMUL", "MAX_SPEEDUP", "NOT_FP32", "describe_gpu", "fp32_matmul_rows",
           "is_amd", "lost_share", "speedup", "tensor_core_ratio"]
