"""Synthetic input in the spirit of torchvision's FakeData: random images, decoded per sample.

Each sample does the work a real dataset's `__getitem__` does after reading a file: it makes an
8-bit HWC image a quarter larger than the input (the "decoded" file), resizes it with
antialiasing, flips it at random, converts it to a float CHW tensor and normalises it, so data
loading costs real CPU time and shows up in the trace like it does with real data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .networks import ModelSpec

_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
BOXES_PER_IMAGE = 8


class SyntheticImages(Dataset):
    """`length` random images of `image_size` px with targets for the model's task."""

    def __init__(self, spec: ModelSpec, image_size: int, length: int, seed: int = 0):
        self.spec, self.size, self.length, self.seed = spec, image_size, length, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        stored = self.size * 5 // 4
        raw = torch.randint(0, 256, (stored, stored, 3), dtype=torch.uint8, generator=g)
        image = raw.permute(2, 0, 1).float().div_(255).unsqueeze(0)
        image = F.interpolate(image, size=(self.size, self.size), mode="bilinear",
                              antialias=True, align_corners=False)[0]
        if bool(torch.rand(1, generator=g) < 0.5):
            image = image.flip(-1)
        return (image - _MEAN) / _STD, self._target(g)

    def _target(self, g: torch.Generator):
        task, n, k = self.spec.task, self.size, self.spec.num_classes
        if task == "object_detection":
            xy = torch.rand(BOXES_PER_IMAGE, 2, generator=g) * n * 0.7
            wh = (torch.rand(BOXES_PER_IMAGE, 2, generator=g) * 0.5 + 0.1) * n
            boxes = torch.cat([xy, (xy + wh).clamp(max=n)], 1)
            return {"boxes": boxes, "labels": torch.randint(0, k, (BOXES_PER_IMAGE,), generator=g)}
        if task == "image_segmentation":
            mask = torch.zeros(n, n, dtype=torch.long)
            for _ in range(4):  # a few labelled rectangles on background
                x0, y0 = torch.randint(0, n // 2, (2,), generator=g).tolist()
                w, h = torch.randint(n // 8, n // 2, (2,), generator=g).tolist()
                mask[y0:y0 + h, x0:x0 + w] = int(torch.randint(1, k, (1,), generator=g))
            return mask
        return int(torch.randint(0, k, (1,), generator=g))


def target_to(target, device: torch.device, non_blocking: bool):
    """Move a batch's targets (tensor or dict of tensors) to the device."""
    if isinstance(target, dict):
        return {key: v.to(device, non_blocking=non_blocking) for key, v in target.items()}
    return target.to(device, non_blocking=non_blocking)


__all__ = ["SyntheticImages", "target_to"]
