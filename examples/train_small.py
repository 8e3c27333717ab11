"""A small image-classification training script to try `traceap profile` and `traceap diff` on.

A small CNN trained on random images decoded per sample (in the spirit of torchvision's
FakeData: each `__getitem__` makes an 8-bit image, resizes it with antialiasing, flips it at
random and normalises it, so loading a batch costs real CPU time, like reading JPEGs does).
Only torch is needed; it runs on a laptop CPU and on a GPU (`--device` picks cuda when there
is one).

    python examples/train_small.py                                  # num_workers=0: the GPU waits
    traceap profile --out before -- python examples/train_small.py
    traceap profile --out after  -- python examples/train_small.py --num-workers 4 --pin-memory
    traceap diff before after

The defaults are the slow way on purpose: the batch is loaded in the training process
(`--num-workers 0`) from pageable memory (no `--pin-memory`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class RandomImages(Dataset):
    """`length` random images of `size` px and labels, decoded and augmented per sample."""

    def __init__(self, length: int, size: int, num_classes: int, seed: int = 0):
        self.length, self.size, self.num_classes, self.seed = length, size, num_classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        stored = self.size * 5 // 4  # the "file" is larger than the input, as photos are
        raw = torch.randint(0, 256, (stored, stored, 3), dtype=torch.uint8, generator=g)
        image = raw.permute(2, 0, 1).float().div_(255).unsqueeze(0)
        image = F.interpolate(image, size=(self.size, self.size), mode="bilinear",
                              antialias=True, align_corners=False)[0]
        if bool(torch.rand(1, generator=g) < 0.5):
            image = image.flip(-1)
        label = int(torch.randint(0, self.num_classes, (1,), generator=g))
        return (image - MEAN) / STD, label


def conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    """3x3 convolution, batch norm, ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class SmallCNN(nn.Module):
    """Four conv blocks (width x 1, 2, 4, 8 channels; stride 2 from the second), pooling, a head."""

    def __init__(self, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(conv_bn(3, width, 1), conv_bn(width, 2 * width, 2),
                                      conv_bn(2 * width, 4 * width, 2),
                                      conv_bn(4 * width, 8 * width, 2))
        self.head = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=96, help="input size in px (default 96)")
    p.add_argument("--width", type=int, default=32, help="channels of the first conv block")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader worker processes (default 0: load in this process)")
    p.add_argument("--pin-memory", action="store_true", help="pin host batches (GPU only)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when available")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timings", help="write every step's duration here (JSON: wall and CPU "
                                      "seconds of this process, and the clock time it ended)")
    p.add_argument("--fail-at", type=int, default=0,
                   help="raise an error at this step (to try error reporting); 0 = never")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    torch.manual_seed(args.seed)
    data = RandomImages(args.steps * args.batch_size, args.image_size, 10, args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        num_workers=args.num_workers,
                        pin_memory=args.pin_memory and device.type == "cuda",
                        persistent_workers=args.num_workers > 0)
    model = SmallCNN(10, args.width).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"training SmallCNN on {device} ({args.steps} steps, batch {args.batch_size}, "
          f"{args.image_size}px, num_workers={args.num_workers}, "
          f"pin_memory={args.pin_memory})", flush=True)
    model.train()
    times, cpu_times, ends, loss = [], [], [], None
    t_last, cpu_last = time.perf_counter(), time.process_time()
    for step, (images, labels) in enumerate(loader, 1):
        if args.fail_at and step == args.fail_at:
            raise RuntimeError(f"failing at step {step} as asked (--fail-at)")
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now, cpu_now = time.perf_counter(), time.process_time()
        times.append(now - t_last)
        cpu_times.append(cpu_now - cpu_last)
        ends.append(time.time())
        t_last, cpu_last = now, cpu_now
    if loss is not None:
        print(f"done: {len(times)} steps, final loss {loss.item():.3f}, median step "
              f"{1000 * statistics.median(times):.1f} ms", flush=True)
    if args.timings:
        with open(args.timings, "w") as f:
            json.dump({"wall_s": times, "cpu_s": cpu_times, "end_time": ends}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
