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
| no_mixed_precision | plain FP32 with TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`, `torch.backends.cudnn.allow_tf32 = False`, as for bit-reproducible runs) instead of bf16 autocast | forward, loss and backward |
| no_channels_last | a convolutional model and its inputs left in NCHW under bf16 autocast | forward, loss and backward |
| unfused_optimizer | `SGD(..., foreach=False)`: one kernel per parameter and op | `optimizer.step()` |
| cpu_tensor_init | noise made on the host and copied up: `images + 0.01 * torch.randn(images.shape).to(device)` | the factory op and its copy |
| allocator_churn | `torch.cuda.empty_cache()` after every step: the next step allocates from the driver again | `empty_cache()` and the next step's forward, loss and backward |
| recompilation | multi-scale training under `torch.compile(model, dynamic=False)`: every profiled step feeds a new input size (16 px smaller each step), and Dynamo compiles the model again | the forward, loss and backward of each step with a new size |

A clean run (`none`) uses worker processes, pinned memory, no syncs, eager mode, the default
(foreach) optimizer and, with two or more processes, DDP with its default 25 MB buckets; on a
GPU it trains under bf16 autocast, with a convolutional model and its inputs in channels_last,
as the PyTorch performance tuning guide recommends.  On the CPU it runs in FP32 and NCHW (no
tensor cores to miss).
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import TraceapError
from ..patterns._registry import pattern_ids
from .markers import marker

#: Patterns whose cause exists only on a GPU, with why (one line each).
GPU_ONLY = {
    "no_pin_memory": "needs pinned host memory and a host-to-device copy",
    "small_nccl_kernels": "needs NCCL between GPUs",
    "nccl_blocks_compute_stream": "needs NCCL between GPUs",
    "nccl_compute_no_overlap": "needs NCCL between GPUs",
    "no_mixed_precision": "is about tensor cores left unused",
    "no_channels_last": "is about cuDNN's layout transposes",
    "unfused_optimizer": "is about per-parameter kernel launches",
    "cpu_tensor_init": "needs a host-to-device copy",
    "allocator_churn": "is about the CUDA caching allocator",
}
#: Patterns that need a backward pass and an optimizer.
TRAINING_ONLY = ("unfused_optimizer",)
#: Autocast precision of a clean GPU run (bf16: Ampere, Hopper, MI200 and later).
AMP_DTYPE = torch.bfloat16
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
            raise PatternUnavailable(f"pattern {p} {GPU_ONLY[p]}; it cannot be recorded on "
                                     f"{device} (use --device cuda on a GPU machine)")
        if p in TRAINING_ONLY and inference:
            raise PatternUnavailable(f"pattern {p} is about the optimizer step; it cannot be "
                                     "recorded with --inference")
        if p in DISTRIBUTED:
            if world_size < 2:
                raise PatternUnavailable(f"pattern {p} needs 2 or more GPUs: run under torchrun "
                                         "--nproc-per-node=N (N >= 2)")
            if inference:
                raise PatternUnavailable(f"pattern {p} is about gradient all-reduce; it cannot "
                                         "be recorded with --inference")
    if "graph_break" in patterns and "recompilation" in patterns:
        raise TraceapError("patterns graph_break and recompilation both compile the model "
                           "their own way; record them one at a time")
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
    #: bf16 autocast around forward and loss (a clean GPU run)
    amp: bool = False
    #: TF32 switched off for the recording (no_mixed_precision: FP32 on the FP32 units)
    no_tf32: bool = False
    #: model and inputs in channels_last (a clean GPU run of a convolutional model)
    channels_last: bool = False
    #: the optimizer's `foreach` (None: PyTorch's default, foreach on a GPU)
    foreach: bool | None = None

    @classmethod
    def make(cls, patterns: tuple[str, ...], device: str, workers: int,
             compile_backend: str, convolutional: bool = True) -> "Recipe":
        """The knobs for `patterns` on `device`; everything else as a clean run has it."""
        gpu = device == "cuda"
        return cls(
            patterns=patterns,
            num_workers=0 if "single_process_dataloading" in patterns else workers,
            pin_memory=gpu and "no_pin_memory" not in patterns,
            compile_backend=(compile_backend if {"graph_break", "recompilation"} & set(patterns)
                             else None),
            amp=gpu and "no_mixed_precision" not in patterns,
            no_tf32="no_mixed_precision" in patterns,
            channels_last=gpu and convolutional and "no_channels_last" not in patterns,
            foreach=False if "unfused_optimizer" in patterns else None,
        )

    def on(self, pattern: str) -> bool:
        """True when `pattern`'s cause is switched on."""
        return pattern in self.patterns

    def mark(self, pattern: str):
        """The pattern's marker when it is switched on, else a no-op context."""
        return marker(pattern, pattern in self.patterns)

    def marks(self, *patterns: str) -> ExitStack:
        """The markers of those of `patterns` that are switched on, nested."""
        stack = ExitStack()
        for p in patterns:
            if p in self.patterns:
                stack.enter_context(marker(p))
        return stack

    def autocast(self, device: torch.device):
        """bf16 autocast when the recipe trains in mixed precision, else a no-op context."""
        if not self.amp:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=AMP_DTYPE)

    @contextmanager
    def precision(self):
        """TF32 off for the recording when no_mixed_precision is on; restored afterwards (a
        sweep records many traces in one process)."""
        if not self.no_tf32:
            yield
            return
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    @property
    def memory_format(self) -> torch.memory_format:
        """The layout of the model's parameters and its input batches."""
        return torch.channels_last if self.channels_last else torch.contiguous_format

    @property
    def comm(self) -> str | None:
        """The gradient-reduction pattern, if any."""
        return next((p for p in self.patterns if p in DISTRIBUTED), None)


# --------------------------------------------------------------------------------------------
# graph_break


def break_graph(model: nn.Module, backend: str) -> nn.Module:
    """`torch.compile(model)` with a graph break forced in the middle of the network.

    The break sits in a forward hook of the middle convolution/linear layer, the way a stray
    `print`, `.item()` or unsupported call inside a model splits the compiled graph.  Only a
    layer the forward calls can carry it: `nn.MultiheadAttention` reads its `out_proj`'s
    weights without calling it, so a hook there never runs (on ViT-B/16 the middle layer is
    such an `out_proj`: the H200 recording compiled one graph per step and cost nothing).
    """
    inside_mha = {id(m) for a in model.modules() if isinstance(a, nn.MultiheadAttention)
                  for m in a.modules()}
    layers = [m for m in model.modules()
              if isinstance(m, (nn.Conv2d, nn.Linear)) and id(m) not in inside_mha]
    if not layers:
        raise TraceapError("graph_break needs a model with convolution or linear layers")
    layers[len(layers) // 2].register_forward_hook(_graph_break_hook)
    return torch.compile(model, backend=backend)


def _graph_break_hook(module, inputs, output):
    torch._dynamo.graph_break()


def compile_fixed_shapes(model: nn.Module, backend: str) -> nn.Module:
    """`torch.compile(model, dynamic=False)`: every new input shape compiles the model again
    (the recompilation cause, with a multi-scale loop feeding a new size each step)."""
    return torch.compile(model, backend=backend, dynamic=False)


#: How much smaller each profiled step's input is under the recompilation cause (px).
SCALE_STEP_PX = 16


def multi_scale(images: Tensor, index: int) -> Tensor:
    """The batch resized for profiled step `index` (0, 1, ...): `SCALE_STEP_PX` px smaller per
    step, the way multi-scale training draws a new resolution for every batch."""
    h, w = images.shape[-2:]
    size = max(32, h - SCALE_STEP_PX * (index + 1)), max(32, w - SCALE_STEP_PX * (index + 1))
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False)


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
# cpu_tensor_init


def host_noise(images: Tensor) -> Tensor:
    """Gaussian-noise augmentation written the slow way: the noise made by a host factory op
    (`torch.randn(shape)` on the CPU) and copied up from pageable memory, every step, where
    `torch.randn_like(images)` would make it on the device."""
    noise = torch.randn(images.shape).to(images.device)
    return images.add_(noise, alpha=0.01)


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


__all__ = ["AMP_DTYPE", "DISTRIBUTED", "GPU_ONLY", "PatternUnavailable", "Recipe", "SCALE_STEP_PX",
           "TRAINING_ONLY", "allreduce_after_backward", "break_graph", "check_available",
           "compile_fixed_shapes", "heavy_preprocess", "host_noise", "host_syncs", "multi_scale",
           "parse_patterns", "wrap_distributed"]
