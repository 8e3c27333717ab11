"""The causes: each anti-pattern switched on the way it happens in real training code.

| pattern | cause | marked (ground truth) |
|---|---|---|
| single_process_dataloading | `DataLoader(num_workers=0)` instead of worker processes | each `next(loader)` |
| no_pin_memory | `pin_memory=False`, then `.to(device, non_blocking=True)` (pageable copy) | the host-to-device copy |
| excessive_memcpy | `.item()` / `.cpu()` in the loop: per-sample losses, predictions, grad norms | the sync calls |
| graph_break | `torch.compile` with `torch._dynamo.graph_break()` forced inside the model | forward and backward of the broken model |
| cpu_bound | per-sample augmentation (crop-resize, rotate, blur, colour jitter) in the loop, on the CPU | the preprocessing |
| small_nccl_kernels | DDP with tiny gradient buckets (`bucket_cap_mb` ~ 16 KB): one all-reduce per tensor | each bucket's all-reduce |
| nccl_blocks_compute_stream | per-parameter synchronous all-reduce (`async_op=False`, on the current = compute stream) in a grad hook | each all-reduce |
| nccl_compute_no_overlap | no DDP: one all-reduce of all gradients after `backward()` | the all-reduce |

A clean run (`none`) uses worker processes, pinned memory, no syncs, eager mode and, with two or
more processes, DDP with its default 25 MB buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import TraceapError
from ..patterns._registry import pattern_ids
from .markers import marker

#: Patterns whose cause exists only on a GPU (pinned memory) or with NCCL between GPUs.
GPU_ONLY = frozenset({"no_pin_memory", "small_nccl_kernels", "nccl_blocks_compute_stream",
                      "nccl_compute_no_overlap"})
#: Patterns that need two or more processes (torchrun) and a backward pass.
DISTRIBUTED = ("small_nccl_kernels", "nccl_blocks_compute_stream", "nccl_compute_no_overlap")
#: Tiny DDP buckets: 16 KB, so nearly every gradient tensor gets its own all-reduce.
TINY_BUCKET_MB = 0.016


class PatternUnavailable(TraceapError):
    """The pattern's cause cannot happen in this setting (device, world size, mode)."""


def parse_patterns(spec: str | list[str]) -> tuple[str, ...]:
    """Pattern ids from `none`, one id, or a comma-separated list; validated and ordered."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [p.strip() for p in items if p.strip()]
    if not items or items == ["none"]:
        return ()
    known = pattern_ids()
    unknown = [p for p in items if p not in known]
    if unknown:
        raise TraceapError(f"unknown pattern {unknown[0]!r}; use 'none' or one of: "
                           + ", ".join(known))
    return tuple(p for p in known if p in items)


def check_available(patterns: tuple[str, ...], device: str, world_size: int,
                    inference: bool) -> None:
    """Raise PatternUnavailable with one clear line when a pattern cannot be recorded here."""
    for p in patterns:
        if p in GPU_ONLY and device != "cuda":
            why = ("needs pinned host memory and a host-to-device copy" if p == "no_pin_memory"
                   else "needs NCCL between GPUs")
            raise PatternUnavailable(f"pattern {p} {why}; it cannot be recorded on {device} "
                                     "(use --device cuda on a GPU machine)")
        if p in DISTRIBUTED:
            if world_size < 2:
                raise PatternUnavailable(f"pattern {p} needs 2 or more GPUs: run under torchrun "
                                         "--nproc-per-node=N (N >= 2)")
            if inference:
                raise PatternUnavailable(f"pattern {p} is about gradient all-reduce; it cannot "
                                         "be recorded with --inference")
    comm = [p for p in patterns if p in DISTRIBUTED]
    if len(comm) > 1:
        raise TraceapError(f"patterns {' and '.join(comm)} are different ways to reduce "
                           "gradients; record them one at a time")


@dataclass(frozen=True)
class Recipe:
    """The knobs of one recording, derived from its patterns."""

    patterns: tuple[str, ...]
    num_workers: int
    pin_memory: bool
    compile_backend: str | None

    @classmethod
    def make(cls, patterns: tuple[str, ...], device: str, workers: int,
             compile_backend: str) -> "Recipe":
        """The knobs for `patterns` on `device`; everything else as a clean run has it."""
        return cls(
            patterns=patterns,
            num_workers=0 if "single_process_dataloading" in patterns else workers,
            pin_memory=device == "cuda" and "no_pin_memory" not in patterns,
            compile_backend=compile_backend if "graph_break" in patterns else None,
        )

    def on(self, pattern: str) -> bool:
        """True when `pattern`'s cause is switched on."""
        return pattern in self.patterns

    def mark(self, pattern: str):
        """The pattern's marker when it is switched on, else a no-op context."""
        return marker(pattern, pattern in self.patterns)

    @property
    def comm(self) -> str | None:
        """The gradient-reduction pattern, if any."""
        return next((p for p in self.patterns if p in DISTRIBUTED), None)


# --------------------------------------------------------------------------------------------
# graph_break


def break_graph(model: nn.Module, backend: str) -> nn.Module:
    """`torch.compile(model)` with a graph break forced in the middle of the network.

    The break sits in a forward hook of the middle convolution/linear layer, the way a stray
    `print`, `.item()` or unsupported call inside a model splits the compiled graph.
    """
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    if not layers:
        raise TraceapError("graph_break needs a model with convolution or linear layers")
    layers[len(layers) // 2].register_forward_hook(_graph_break_hook)
    return torch.compile(model, backend=backend)


def _graph_break_hook(module, inputs, output):
    torch._dynamo.graph_break()


# --------------------------------------------------------------------------------------------
# cpu_bound


def heavy_preprocess(images: Tensor, seed: int) -> Tensor:
    """Per-sample augmentation on the CPU in the training loop (what workers should do).

    Random resized crop, rotation, Gaussian blur and colour jitter, one image at a time.
    """
    g = torch.Generator().manual_seed(seed)
    n, _, h, w = images.shape
    out = []
    for i in range(n):
        x = images[i:i + 1].float()
        scale = 0.5 + 0.5 * float(torch.rand(1, generator=g))
        ch, cw = max(1, int(h * math.sqrt(scale))), max(1, int(w * math.sqrt(scale)))
        y0 = int(torch.randint(0, h - ch + 1, (1,), generator=g))
        x0 = int(torch.randint(0, w - cw + 1, (1,), generator=g))
        x = F.interpolate(x[..., y0:y0 + ch, x0:x0 + cw], size=(h, w), mode="bilinear",
                          align_corners=False, antialias=True)
        angle = (float(torch.rand(1, generator=g)) - 0.5) * math.pi / 6
        rot = torch.tensor([[[math.cos(angle), -math.sin(angle), 0.0],
                             [math.sin(angle), math.cos(angle), 0.0]]])
        x = F.grid_sample(x, F.affine_grid(rot, list(x.shape), align_corners=False),
                          align_corners=False)
        x = F.conv2d(F.pad(x, (3, 3, 3, 3), mode="reflect"), _gaussian(7, 1.5), groups=3)
        gray = x.mean(1, keepdim=True)
        sat, con = 0.8 + 0.4 * torch.rand(2, generator=g)
        x = (gray + (x - gray) * sat - x.mean()) * con + x.mean()
        out.append(x)
    return torch.cat(out)


def _gaussian(k: int, sigma: float) -> Tensor:
    r = torch.arange(k, dtype=torch.float32) - k // 2
    g = torch.exp(-r ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(3, 1, k, k).contiguous()


# --------------------------------------------------------------------------------------------
# excessive_memcpy


def host_syncs(outputs, loss: Tensor | None, model: nn.Module) -> dict:
    """Logging that pulls values to the host every step: `.item()` and `.cpu()` in the loop.

    The loss, per-sample maxima of the outputs, the predictions and every gradient's norm: each
    one a device-to-host copy that waits for the GPU to drain; the maxima then go back to the
    device, a pageable host-to-device copy.
    """
    first = outputs[0] if isinstance(outputs, tuple) else outputs
    logits = first.detach().float()
    stats = {"pred": logits.argmax(1).cpu(),
             "max": [row.max().item() for row in logits.flatten(1)],
             "grad_norm": [p.grad.norm().item() for p in model.parameters() if p.grad is not None]}
    if loss is not None:
        stats["loss"] = loss.detach().item()
    # ... and the logged numbers copied back to the device for a running mean (host-to-device)
    stats["running_max"] = torch.tensor(stats["max"]).to(logits.device).mean()
    return stats


# --------------------------------------------------------------------------------------------
# the NCCL patterns (two or more GPUs under torchrun)


def wrap_distributed(model: nn.Module, recipe: Recipe, device: torch.device) -> nn.Module:
    """DDP (clean or tiny buckets) or the bare model for the hand-written reductions."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    if recipe.comm == "small_nccl_kernels":
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=TINY_BUCKET_MB)
        ddp.register_comm_hook(None, _marked_allreduce_hook)
        return ddp
    if recipe.comm == "nccl_blocks_compute_stream":
        _sync_allreduce_per_parameter(model)
        return model
    if recipe.comm == "nccl_compute_no_overlap":
        return model
    return DDP(model, device_ids=ids)


def _marked_allreduce_hook(state, bucket):
    """DDP's default all-reduce hook, inside the small_nccl_kernels marker."""
    import torch.distributed as dist

    with marker("small_nccl_kernels"):
        buf = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _sync_allreduce_per_parameter(model: nn.Module) -> None:
    """Each gradient all-reduced as soon as it is ready, synchronously, on the compute stream."""
    import torch.distributed as dist

    def hook(p: Tensor) -> None:
        with marker("nccl_blocks_compute_stream"):
            dist.all_reduce(p.grad, async_op=False)
            p.grad.div_(dist.get_world_size())

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)


def allreduce_after_backward(model: nn.Module) -> None:
    """All gradients flattened, all-reduced once after backward, copied back: no overlap."""
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, async_op=True).wait()
    flat.div_(dist.get_world_size())
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


__all__ = ["DISTRIBUTED", "GPU_ONLY", "PatternUnavailable", "Recipe", "allreduce_after_backward",
           "break_graph", "check_available", "heavy_preprocess", "host_syncs", "parse_patterns",
           "wrap_distributed"]
