"""GPU platforms of the paper (RTX 4090, A6000, A6000 Ada, A100, H100).

`device_properties` is written exactly as Kineto writes `deviceProperties` (field names and
values read from real traces and the CUDA device queries); the speed figures drive the kernel,
memcpy and NCCL durations of the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    """One GPU model and the host link it sits behind."""

    key: str
    name: str                    # cudaDeviceProp.name, as in deviceProperties
    total_mem: int               # bytes
    cc: tuple[int, int]          # compute capability
    sms: int
    smem_optin: int              # sharedMemPerBlockOptin
    smem_per_sm: int             # sharedMemPerMultiprocessor
    threads_per_sm: int          # maxThreadsPerMultiprocessor
    tflops_fp32: float           # dense FP32 / TF32-effective throughput a conv/GEMM reaches
    tflops_fp16: float           # dense FP16/BF16 tensor-core throughput a conv/GEMM reaches
    hbm_gbs: float               # device memory bandwidth reached by elementwise kernels
    h2d_pinned_gbs: float        # PCIe host->device from pinned memory
    h2d_pageable_gbs: float      # through the driver's staging buffer
    nccl_bus_gbs: float          # all-reduce bus bandwidth between GPUs of one node
    sm_tag: str                  # "sm80": prefix of cuDNN/cuBLAS kernel names
    cpu_speed: float = 1.0       # host CPU speed relative to a typical server core
    nccl_hop_us: float = 6.0     # per ring step latency: PCIe peers ~6 us, NVLink ~2 us

    def device_properties(self, device: int) -> dict:
        """One `deviceProperties` entry as Kineto writes it."""
        return {
            "id": device, "name": self.name, "totalGlobalMem": self.total_mem,
            "computeMajor": self.cc[0], "computeMinor": self.cc[1],
            "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": self.threads_per_sm,
            "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152,
            "numSms": self.sms, "regsPerMultiprocessor": 65536,
            "sharedMemPerBlockOptin": self.smem_optin,
            "sharedMemPerMultiprocessor": self.smem_per_sm,
        }


PLATFORMS: dict[str, Platform] = {p.key: p for p in (
    Platform("rtx4090", "NVIDIA GeForce RTX 4090", 25393692672, (8, 9), 128, 101376, 102400,
             1536, tflops_fp32=38.0, tflops_fp16=120.0, hbm_gbs=850.0, h2d_pinned_gbs=24.0,
             h2d_pageable_gbs=7.0, nccl_bus_gbs=18.0, sm_tag="sm89", cpu_speed=1.15),
    Platform("a6000", "NVIDIA RTX A6000", 50925535232, (8, 6), 84, 101376, 102400,
             1536, tflops_fp32=22.0, tflops_fp16=70.0, hbm_gbs=640.0, h2d_pinned_gbs=22.0,
             h2d_pageable_gbs=6.0, nccl_bus_gbs=20.0, sm_tag="sm86", cpu_speed=1.0),
    Platform("a6000ada", "NVIDIA RTX 6000 Ada Generation", 50889441280, (8, 9), 142, 101376,
             102400, 1536, tflops_fp32=42.0, tflops_fp16=140.0, hbm_gbs=800.0,
             h2d_pinned_gbs=24.0, h2d_pageable_gbs=7.0, nccl_bus_gbs=22.0, sm_tag="sm89",
             cpu_speed=1.1),
    Platform("a100", "NVIDIA A100-SXM4-80GB", 85031714816, (8, 0), 108, 166912, 167936,
             2048, tflops_fp32=60.0, tflops_fp16=180.0, hbm_gbs=1700.0, h2d_pinned_gbs=22.0,
             h2d_pageable_gbs=6.5, nccl_bus_gbs=180.0, sm_tag="sm80", cpu_speed=0.95,
             nccl_hop_us=2.0),
    Platform("h100", "NVIDIA H100 80GB HBM3", 85018279936, (9, 0), 132, 232448, 233472,
             2048, tflops_fp32=180.0, tflops_fp16=450.0, hbm_gbs=2900.0, h2d_pinned_gbs=45.0,
             h2d_pageable_gbs=9.0, nccl_bus_gbs=330.0, sm_tag="sm90", cpu_speed=1.1,
             nccl_hop_us=1.8),
)}

#: Platform labels as the manifest writes them.
PLATFORM_LABELS = {"rtx4090": "RTX 4090", "a6000": "A6000", "a6000ada": "A6000 Ada",
                   "a100": "A100", "h100": "H100"}
