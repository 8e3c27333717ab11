"""The eight mechanisms, one module each, by pattern id (`traceap.manifest.PATTERNS`)."""

from __future__ import annotations

from . import (cpu_bound, excessive_memcpy, graph_break, nccl_blocks_compute_stream,
               nccl_compute_no_overlap, no_pin_memory, single_process_dataloading,
               small_nccl_kernels)
from .base import Base, Instance, Plan, Unusable

MECHANISMS = {m.PATTERN: m for m in (
    single_process_dataloading, no_pin_memory, excessive_memcpy, graph_break, cpu_bound,
    small_nccl_kernels, nccl_blocks_compute_stream, nccl_compute_no_overlap)}

__all__ = ["Base", "Instance", "MECHANISMS", "Plan", "Unusable"]
