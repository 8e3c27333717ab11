"""Vision models in plain `torch.nn`, laid out like their torchvision namesakes.

torchvision and timm do not install beside our torch build, so the architectures are written
out here: the same layers, shapes and module names (`conv1`, `layer1`, `encoder.layers`, ...),
randomly initialised.  Profiling needs the real layer structure, not trained weights.

Each model comes with its task, its default input size and a loss over synthetic targets
(`SyntheticImages` makes them), so the runner can train or run any of them the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import TraceapError

# --------------------------------------------------------------------------------------------
# ResNet (torchvision.models.resnet)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, padding=dilation, dilation=dilation,
                               bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, padding=dilation, dilation=dilation,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand, with a residual connection (ResNet-50/101)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None, dilation: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, padding=dilation, dilation=dilation,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with torchvision's module names; `width` scales every stage (64 = standard)."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int],
                 num_classes: int = 1000, width: int = 64,
                 replace_stride_with_dilation: tuple[bool, bool, bool] = (False, False, False)):
        super().__init__()
        self.inplanes, self.dilation = width, 1
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], 2, replace_stride_with_dilation[0])
        self.layer3 = self._make_layer(block, width * 4, layers[2], 2, replace_stride_with_dilation[1])
        self.layer4 = self._make_layer(block, width * 8, layers[3], 2, replace_stride_with_dilation[2])
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)
        self.channels = [width * m * block.expansion for m in (1, 2, 4, 8)]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1,
                    dilate: bool = False) -> nn.Sequential:
        previous_dilation = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, previous_dilation)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes, dilation=self.dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def features(self, x: Tensor) -> list[Tensor]:
        """Outputs of layer1..layer4 (strides 4, 8, 16, 32 without dilation)."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        c2 = self.layer1(x)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c2, c3, c4, c5]

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)[-1]
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet(depth: int, **kw) -> ResNet:
    spec = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]),
            50: (Bottleneck, [3, 4, 6, 3]), 101: (Bottleneck, [3, 4, 23, 3])}
    block, layers = spec[depth]
    return ResNet(block, layers, **kw)


# --------------------------------------------------------------------------------------------
# Vision Transformer (torchvision.models.vision_transformer)


class MLPBlock(nn.Sequential):
    """Linear, GELU, dropout, linear, dropout."""

    def __init__(self, dim: int, mlp_dim: int, dropout: float = 0.0):
        super().__init__(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(mlp_dim, dim), nn.Dropout(dropout))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: LN, multi-head self-attention, LN, MLP."""

    def __init__(self, num_heads: int, hidden_dim: int, mlp_dim: int, dropout: float = 0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=dropout,
                                                    batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = MLPBlock(hidden_dim, mlp_dim, dropout)

    def forward(self, x: Tensor) -> Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + self.dropout(y)
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Learned position embedding, a stack of encoder blocks, a final LayerNorm."""

    def __init__(self, seq_length: int, num_layers: int, num_heads: int, hidden_dim: int,
                 mlp_dim: int, dropout: float = 0.0):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.Sequential(*[EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout)
                                      for _ in range(num_layers)])
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class VisionTransformer(nn.Module):
    """ViT: patchify with a strided conv, class token, transformer encoder, linear head."""

    def __init__(self, image_size: int, patch_size: int, num_layers: int, num_heads: int,
                 hidden_dim: int, mlp_dim: int, num_classes: int = 1000):
        super().__init__()
        if image_size % patch_size:
            raise TraceapError(f"image size {image_size} is not a multiple of the patch size "
                               f"{patch_size}")
        self.patch_size, self.hidden_dim = patch_size, hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
        seq_length = (image_size // patch_size) ** 2 + 1
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(hidden_dim, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        return self.heads(self.encoder(x)[:, 0])


# --------------------------------------------------------------------------------------------
# RetinaNet (torchvision.models.detection.retinanet): ResNet + FPN + dense heads, focal loss


class FeaturePyramidNetwork(nn.Module):
    """FPN over C3..C5 with extra P6, P7 (RetinaNet's LastLevelP6P7)."""

    def __init__(self, in_channels: list[int], out_channels: int = 256):
        super().__init__()
        self.inner_blocks = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in in_channels)
        self.layer_blocks = nn.ModuleList(nn.Conv2d(out_channels, out_channels, 3, padding=1)
                                          for _ in in_channels)
        self.p6 = nn.Conv2d(out_channels, out_channels, 3, 2, 1)
        self.p7 = nn.Conv2d(out_channels, out_channels, 3, 2, 1)

    def forward(self, feats: list[Tensor]) -> list[Tensor]:
        last = self.inner_blocks[-1](feats[-1])
        results = [self.layer_blocks[-1](last)]
        for i in range(len(feats) - 2, -1, -1):
            lateral = self.inner_blocks[i](feats[i])
            last = lateral + F.interpolate(last, size=lateral.shape[-2:], mode="nearest")
            results.insert(0, self.layer_blocks[i](last))
        p6 = self.p6(results[-1])
        return results + [p6, self.p7(F.relu(p6))]


class RetinaNetHead(nn.Module):
    """Four 3x3 conv+GroupNorm+ReLU layers then a per-anchor prediction conv."""

    def __init__(self, channels: int, num_anchors: int, out_per_anchor: int):
        super().__init__()
        layers = []
        for _ in range(4):
            layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(32, channels),
                       nn.ReLU(inplace=True)]
        self.conv = nn.Sequential(*layers)
        self.out = nn.Conv2d(channels, num_anchors * out_per_anchor, 3, padding=1)
        self.k = out_per_anchor

    def forward(self, feats: list[Tensor]) -> Tensor:
        outs = []
        for f in feats:
            o = self.out(self.conv(f))
            n, _, h, w = o.shape
            outs.append(o.view(n, -1, self.k, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, self.k))
        return torch.cat(outs, dim=1)


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """Pairwise IoU of boxes in (x1, y1, x2, y2)."""
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


class RetinaNet(nn.Module):
    """ResNet-FPN RetinaNet; returns (class logits, box deltas) per anchor."""

    def __init__(self, backbone: ResNet, image_size: int, num_classes: int = 91,
                 fpn_channels: int = 256):
        super().__init__()
        backbone.fc = nn.Identity()  # the classifier is unused: DDP wants every parameter used
        self.backbone, self.image_size = backbone, image_size
        self.fpn = FeaturePyramidNetwork(backbone.channels[1:], fpn_channels)
        self.num_anchors = 9  # 3 scales x 3 aspect ratios per location
        self.classification_head = RetinaNetHead(fpn_channels, self.num_anchors, num_classes)
        self.regression_head = RetinaNetHead(fpn_channels, self.num_anchors, 4)
        self.num_classes = num_classes
        self._anchors: dict[tuple, Tensor] = {}

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        feats = self.fpn(self.backbone.features(x)[1:])
        return self.classification_head(feats), self.regression_head(feats)

    def anchors(self, device: torch.device) -> Tensor:
        """Anchor boxes (x1, y1, x2, y2) for P3..P7 in the order the heads emit them."""
        image_size = self.image_size
        key = (image_size, str(device))
        if key not in self._anchors:
            boxes = []
            for level in range(3, 8):
                stride, size = 2 ** level, 4 * 2 ** level
                n = math.ceil(image_size / stride)
                c = (torch.arange(n, dtype=torch.float32) + 0.5) * stride
                cy, cx = torch.meshgrid(c, c, indexing="ij")
                centres = torch.stack([cx, cy], -1).reshape(-1, 1, 2)
                whs = [(size * s * math.sqrt(r), size * s / math.sqrt(r))
                       for s in (1.0, 2 ** (1 / 3), 2 ** (2 / 3)) for r in (0.5, 1.0, 2.0)]
                wh = torch.tensor(whs).reshape(1, -1, 2)
                boxes.append(torch.cat([centres - wh / 2, centres + wh / 2], -1).reshape(-1, 4))
            self._anchors[key] = torch.cat(boxes).to(device)
        return self._anchors[key]


def retinanet_loss(model: RetinaNet, outputs: tuple[Tensor, Tensor], target: dict) -> Tensor:
    """Sigmoid focal loss over matched anchors plus smooth-L1 box regression (torchvision)."""
    logits, deltas = outputs
    boxes, labels = target["boxes"], target["labels"]
    anchors = model.anchors(logits.device)
    cls_losses, box_losses = [], []
    for i in range(logits.shape[0]):
        iou = box_iou(boxes[i], anchors)                          # [n_boxes, n_anchors]
        best, idx = iou.max(0)
        pos = best >= 0.5
        cls_target = torch.zeros_like(logits[i])
        cls_target[pos, labels[i][idx[pos]]] = 1.0
        valid = (best >= 0.5) | (best < 0.4)
        p = torch.sigmoid(logits[i])
        ce = F.binary_cross_entropy_with_logits(logits[i], cls_target, reduction="none")
        p_t = p * cls_target + (1 - p) * (1 - cls_target)
        focal = ce * (1 - p_t) ** 2 * (0.25 * cls_target + 0.75 * (1 - cls_target))
        n_pos = pos.sum().clamp(min=1)
        cls_losses.append(focal[valid].sum() / n_pos)
        a, g = anchors[pos], boxes[i][idx[pos]]
        wa, ha = a[:, 2] - a[:, 0], a[:, 3] - a[:, 1]
        wg, hg = g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
        reg = torch.stack([((g[:, 0] + g[:, 2]) - (a[:, 0] + a[:, 2])) / 2 / wa,
                           ((g[:, 1] + g[:, 3]) - (a[:, 1] + a[:, 3])) / 2 / ha,
                           torch.log(wg / wa), torch.log(hg / ha)], -1)
        box_losses.append(F.smooth_l1_loss(deltas[i][pos], reg, beta=1 / 9, reduction="sum") / n_pos)
    return torch.stack(cls_losses).mean() + torch.stack(box_losses).mean()


# --------------------------------------------------------------------------------------------
# Segmentation: FCN (torchvision.models.segmentation.fcn) and U-Net


class FCNHead(nn.Sequential):
    """3x3 conv, BN, ReLU, dropout, 1x1 classifier."""

    def __init__(self, in_channels: int, num_classes: int):
        inter = in_channels // 4
        super().__init__(nn.Conv2d(in_channels, inter, 3, padding=1, bias=False),
                         nn.BatchNorm2d(inter), nn.ReLU(inplace=True), nn.Dropout(0.1),
                         nn.Conv2d(inter, num_classes, 1))


class FCN(nn.Module):
    """Dilated ResNet backbone (output stride 8), FCN head, bilinear upsampling to the input."""

    def __init__(self, backbone: ResNet, num_classes: int = 21):
        super().__init__()
        backbone.fc = nn.Identity()
        self.backbone = backbone
        self.classifier = FCNHead(backbone.channels[-1], num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out = self.classifier(self.backbone.features(x)[-1])
        return F.interpolate(out, size=x.shape[-2:], mode="bilinear", align_corners=False)


class DoubleConv(nn.Sequential):
    """(3x3 conv, BN, ReLU) twice: U-Net's basic unit."""

    def __init__(self, cin: int, cout: int):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """U-Net (Ronneberger et al.): four down steps, four up steps with skip connections."""

    def __init__(self, num_classes: int = 21, width: int = 64):
        super().__init__()
        w = [width * 2 ** i for i in range(5)]
        self.inc = DoubleConv(3, w[0])
        self.down = nn.ModuleList(DoubleConv(w[i], w[i + 1]) for i in range(4))
        self.up = nn.ModuleList(nn.ConvTranspose2d(w[i + 1], w[i], 2, 2) for i in reversed(range(4)))
        self.up_conv = nn.ModuleList(DoubleConv(w[i] * 2, w[i]) for i in reversed(range(4)))
        self.outc = nn.Conv2d(w[0], num_classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        skips = [self.inc(x)]
        for down in self.down:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up, conv in zip(self.up, self.up_conv):
            x = conv(torch.cat([skips.pop(), up(x)], dim=1))
        return self.outc(x)


# --------------------------------------------------------------------------------------------
# The registry


def _classification_loss(model, outputs: Tensor, target) -> Tensor:
    return F.cross_entropy(outputs, target)


def _segmentation_loss(model, outputs: Tensor, target) -> Tensor:
    return F.cross_entropy(outputs, target)


@dataclass(frozen=True)
class ModelSpec:
    """How to build, feed and train one model."""

    name: str
    task: str
    image_size: int
    build: Callable[[int], nn.Module]         # image_size -> model
    loss: Callable[[nn.Module, object, object], Tensor]
    num_classes: int
    #: convolutions past the stem (a ViT's one patch-embedding convolution does not count)
    convolutional: bool = True

    def __str__(self) -> str:
        return f"{self.name} ({self.task}, {self.image_size}px)"


def _spec(name, task, size, build, loss, classes, convolutional=True) -> ModelSpec:
    return ModelSpec(name, task, size, build, loss, classes, convolutional)


MODELS: dict[str, ModelSpec] = {s.name: s for s in [
    _spec("resnet18", "image_classification", 224,
          lambda n: _resnet(18), _classification_loss, 1000),
    _spec("resnet34", "image_classification", 224,
          lambda n: _resnet(34), _classification_loss, 1000),
    _spec("resnet50", "image_classification", 224,
          lambda n: _resnet(50), _classification_loss, 1000),
    _spec("vit_b_16", "image_classification", 224,
          lambda n: VisionTransformer(n, 16, 12, 12, 768, 3072), _classification_loss, 1000,
          convolutional=False),
    _spec("vit_s_16", "image_classification", 224,
          lambda n: VisionTransformer(n, 16, 12, 6, 384, 1536), _classification_loss, 1000,
          convolutional=False),
    _spec("retinanet_resnet18_fpn", "object_detection", 512,
          lambda n: RetinaNet(_resnet(18), n), retinanet_loss, 91),
    _spec("retinanet_resnet50_fpn", "object_detection", 512,
          lambda n: RetinaNet(_resnet(50), n), retinanet_loss, 91),
    _spec("fcn_resnet18", "image_segmentation", 384,
          lambda n: FCN(_resnet(18, replace_stride_with_dilation=(False, True, True))),
          _segmentation_loss, 21),
    _spec("fcn_resnet50", "image_segmentation", 384,
          lambda n: FCN(_resnet(50, replace_stride_with_dilation=(False, True, True))),
          _segmentation_loss, 21),
    _spec("unet", "image_segmentation", 256, lambda n: UNet(), _segmentation_loss, 21),
    # Small members of the same families, for tests and quick CPU runs.
    _spec("resnet_tiny", "image_classification", 32,
          lambda n: ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width=8),
          _classification_loss, 10),
    _spec("retinanet_tiny", "object_detection", 64,
          lambda n: RetinaNet(ResNet(BasicBlock, [1, 1, 1, 1], width=8), n, num_classes=5,
                              fpn_channels=32), retinanet_loss, 5),
    _spec("unet_tiny", "image_segmentation", 32, lambda n: UNet(num_classes=4, width=8),
          _segmentation_loss, 4),
]}


def model_spec(name: str) -> ModelSpec:
    """The spec of a model by name, or a clear error listing the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise TraceapError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def build_model(name: str, image_size: int | None = None) -> tuple[nn.Module, ModelSpec, int]:
    """A randomly initialised model, its spec and the input size it will be fed."""
    spec = model_spec(name)
    size = image_size or spec.image_size
    return spec.build(size), spec, size


__all__ = ["MODELS", "ModelSpec", "build_model", "model_spec", "FCN", "ResNet", "RetinaNet",
           "UNet", "VisionTransformer", "box_iou", "retinanet_loss"]
