"""The vision models of the paper's Table 1 as layer sequences with their work per sample.

Each builder returns a `ModelSpec`: the layers in forward order (FLOPs, activation size and
parameters per sample at the base resolution, from the architectures' published shapes), the
task, and the defaults a user would run it with.  Builders are small and honest rather than
exact: what matters for the traces is the op mix, the kernel sizes and their order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .ops import Layer


@dataclass(frozen=True)
class ModelSpec:
    """One model: its layers (forward order) and how it is usually trained."""

    name: str
    task: str
    layers: tuple[Layer, ...]
    base_res: int
    batch_choices: tuple[int, ...]
    res_choices: tuple[int, ...]
    optimizer: str = "AdamW"         # AdamW or SGD
    video_frames: int = 1
    #: models whose training loop has per-image Python work in the loss (targets, matching)
    python_loss: bool = False

    @property
    def params_m(self) -> float:
        """Parameters in millions."""
        return sum(layer.params_m for layer in self.layers)


class _B:
    """Layer-list builder tracking the feature-map size, so FLOPs follow the architecture."""

    def __init__(self, res: int):
        self.hw = res
        self.layers: list[Layer] = []
        self._v = 0

    def _variant(self) -> int:
        self._v += 1
        return self._v % 3

    def conv(self, cin: int, cout: int, k: int = 3, stride: int = 1, act: str | None = "relu",
             bn: bool = True) -> "_B":
        self.hw = max(1, self.hw // stride)
        px = self.hw * self.hw
        self.layers.append(Layer("conv", 2 * cin * cout * k * k * px / 1e9, cout * px * 4 / 1e6,
                                 cin * cout * k * k / 1e6, self._variant(), shape=k, cin=cin))
        if bn:
            self.layers.append(Layer("bn", 0, cout * px * 4 / 1e6, 2 * cout / 1e6, self._variant()))
        if act:
            self.layers.append(Layer(act, 0, cout * px * 4 / 1e6))
        return self

    def deconv(self, cin: int, cout: int, act: str = "relu") -> "_B":
        self.hw *= 2
        px = self.hw * self.hw
        self.layers.append(Layer("deconv", 2 * cin * cout * 16 * px / 4 / 1e9, cout * px * 4 / 1e6,
                                 cin * cout * 16 / 1e6, self._variant(), shape=4, cin=cin))
        self.layers.append(Layer("bn", 0, cout * px * 4 / 1e6, 2 * cout / 1e6))
        self.layers.append(Layer(act, 0, cout * px * 4 / 1e6))
        return self

    def ew(self, op: str, ch: int) -> "_B":
        self.layers.append(Layer(op, 0, ch * self.hw * self.hw * 4 / 1e6))
        return self

    def pool(self, ch: int) -> "_B":
        self.hw //= 2
        return self.ew("maxpool", ch)

    def up(self, ch: int) -> "_B":
        self.hw *= 2
        return self.ew("upsample", ch)

    def linear(self, tokens: int, din: int, dout: int, act: str | None = None) -> "_B":
        self.layers.append(Layer("linear", 2 * tokens * din * dout / 1e9, tokens * dout * 4 / 1e6,
                                 din * dout / 1e6, self._variant(), shape=tokens))
        if act:
            self.layers.append(Layer(act, 0, tokens * dout * 4 / 1e6))
        return self

    def block(self, tokens: int, dim: int, mlp: int = 4, window: int | None = None) -> "_B":
        """A pre-norm transformer block (attention over `window` tokens when windowed)."""
        span = window or tokens
        mb = tokens * dim * 4 / 1e6
        self.layers.append(Layer("ln", 0, mb, 2 * dim / 1e6))
        self.linear(tokens, dim, 3 * dim)
        self.layers.append(Layer("attn", 4 * tokens * span * dim / 1e9, mb))
        self.linear(tokens, dim, dim)
        self.layers.append(Layer("add", 0, mb))
        self.layers.append(Layer("ln", 0, mb, 2 * dim / 1e6))
        self.linear(tokens, dim, mlp * dim, "gelu")
        self.linear(tokens, mlp * dim, dim)
        self.layers.append(Layer("add", 0, mb))
        return self

    def bottleneck(self, cin: int, mid: int, cout: int, stride: int = 1, act: str = "relu") -> "_B":
        self.conv(cin, mid, 1, 1, act).conv(mid, mid, 3, stride, act).conv(mid, cout, 1, 1, None)
        if stride != 1 or cin != cout:
            hw = self.hw
            self.layers.append(Layer("conv", 2 * cin * cout * hw * hw / 1e9, cout * hw * hw * 4 / 1e6,
                                     cin * cout / 1e6, self._variant(), shape=1, cin=cin))
            self.layers.append(Layer("bn", 0, cout * hw * hw * 4 / 1e6, 2 * cout / 1e6))
        return self.ew("add", cout).ew(act, cout)

    def resblock_gn(self, cin: int, cout: int) -> "_B":
        """A diffusion UNet residual block: GN, SiLU, conv, GN, SiLU, conv, add."""
        self.ew("gn", cin).ew("silu", cin).conv(cin, cout, 3, 1, None, bn=False)
        self.ew("gn", cout).ew("silu", cout).conv(cout, cout, 3, 1, None, bn=False)
        return self.ew("add", cout)


def _resnet(b: _B, depths=(3, 4, 6, 3), width: int = 64, act: str = "relu") -> int:
    b.conv(3, width, 7, 2, act).pool(width)
    cin = width
    for i, n in enumerate(depths):
        mid = width * 2 ** i
        for j in range(n):
            b.bottleneck(cin, mid, mid * 4, 2 if (j == 0 and i > 0) else 1, act)
            cin = mid * 4
    return cin


def _head_cls(b: _B, cin: int, classes: int = 1000) -> None:
    b.ew("avgpool", cin)
    b.hw = 1
    b.linear(1, cin, classes)


def _vit(b: _B, res: int, patch: int, dim: int, depth: int, frames: int = 1,
         window: int | None = None) -> int:
    tokens = (res // patch) ** 2 * frames
    b.conv(3, dim, patch, patch, None, bn=False)
    b.layers.append(Layer("add", 0, tokens * dim * 4 / 1e6))   # + position embedding
    for i in range(depth):
        b.block(tokens, dim, window=None if window is None or i % 3 == 2 else window)
    b.layers.append(Layer("ln", 0, tokens * dim * 4 / 1e6, 2 * dim / 1e6))
    return tokens


def resnet50() -> ModelSpec:
    b = _B(224)
    _head_cls(b, _resnet(b))
    return ModelSpec("resnet50", "image_classification", tuple(b.layers), 224, (16, 32, 64, 128),
                     (128, 160, 224), "SGD")


def _basic(b: _B, cin: int, cout: int, stride: int) -> None:
    b.conv(cin, cout, 3, stride).conv(cout, cout, 3, 1, None)
    if stride != 1 or cin != cout:
        b.conv(cin, cout, 1, 1, None)
    b.ew("add", cout).ew("relu", cout)


def resnet18() -> ModelSpec:
    b = _B(224)
    b.conv(3, 64, 7, 2).pool(64)
    cin = 64
    for i, w in enumerate((64, 128, 256, 512)):
        for j in range(2):
            _basic(b, cin, w, 2 if (j == 0 and i > 0) else 1)
            cin = w
    _head_cls(b, 512)
    return ModelSpec("resnet18", "image_classification", tuple(b.layers), 224, (16, 32, 64, 128),
                     (160, 224), "SGD")


def resnet18_cifar() -> ModelSpec:
    """The CIFAR-10 ResNet-18 (3x3 stem, 32x32 inputs): small, fast, launch-heavy kernels."""
    b = _B(32)
    b.conv(3, 64, 3, 1)
    cin = 64
    for i, w in enumerate((64, 128, 256, 512)):
        for j in range(2):
            _basic(b, cin, w, 2 if (j == 0 and i > 0) else 1)
            cin = w
    _head_cls(b, 512, 10)
    return ModelSpec("resnet18_cifar", "image_classification", tuple(b.layers), 32, (32, 64, 128, 256),
                     (32,), "SGD")


def mobilenet_v2() -> ModelSpec:
    b = _B(224)
    b.conv(3, 32, 3, 2, "relu")
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            hid = cin * t
            if t != 1:
                b.conv(cin, hid, 1, 1, "relu")
            b.hw = max(1, b.hw // (s if i == 0 else 1))
            px = b.hw * b.hw
            b.layers.append(Layer("dwconv", 2 * hid * 9 * px / 1e9, hid * px * 4 / 1e6, hid * 9 / 1e6))
            b.layers.append(Layer("bn", 0, hid * px * 4 / 1e6, 2 * hid / 1e6))
            b.layers.append(Layer("relu", 0, hid * px * 4 / 1e6))
            b.conv(hid, c, 1, 1, None)
            if i > 0:
                b.ew("add", c)
            cin = c
    b.conv(320, 1280, 1, 1, "relu")
    _head_cls(b, 1280)
    return ModelSpec("mobilenet_v2", "image_classification", tuple(b.layers), 224, (16, 32, 64, 128),
                     (224,), "SGD")


def resnet101() -> ModelSpec:
    b = _B(224)
    _head_cls(b, _resnet(b, (3, 4, 23, 3)))
    return ModelSpec("resnet101", "image_classification", tuple(b.layers), 224, (16, 32, 64),
                     (224,), "SGD")


def vgg16() -> ModelSpec:
    b = _B(224)
    cin = 3
    for width, n in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(n):
            b.conv(cin, width, 3, 1, "relu", bn=False)
            cin = width
        b.pool(width)
    b.linear(1, 512 * 49, 4096, "relu").linear(1, 4096, 4096, "relu").linear(1, 4096, 1000)
    return ModelSpec("vgg16", "image_classification", tuple(b.layers), 224, (16, 32, 64),
                     (224,), "SGD")


def vit_b16() -> ModelSpec:
    b = _B(224)
    t = _vit(b, 224, 16, 768, 12)
    b.linear(1, 768, 1000)
    del t
    return ModelSpec("vit_b16", "image_classification", tuple(b.layers), 224, (16, 32, 64, 128),
                     (224,))


def vit_tiny() -> ModelSpec:
    b = _B(224)
    _vit(b, 224, 16, 192, 12)
    b.linear(1, 192, 1000)
    return ModelSpec("vit_tiny", "image_classification", tuple(b.layers), 224, (32, 64, 128, 256),
                     (224,))


def swin_t() -> ModelSpec:
    b = _B(224)
    b.conv(3, 96, 4, 4, None, bn=False)
    tokens, dim = 56 * 56, 96
    for depth in (2, 2, 6, 2):
        for _ in range(depth):
            b.block(tokens, dim, window=49)
        b.linear(tokens // 4, 4 * dim, 2 * dim)          # patch merging
        tokens, dim = tokens // 4, dim * 2
    b.linear(1, dim, 1000)
    return ModelSpec("swin_t", "image_classification", tuple(b.layers), 224, (16, 32, 64),
                     (224,))


def _yolo_backbone(b: _B, w: int = 32, act: str = "silu") -> None:
    b.conv(3, w, 3, 2, act).conv(w, 2 * w, 3, 2, act)
    ch = 2 * w
    for i, n in enumerate((1, 2, 3, 1)):
        for _ in range(n):
            b.conv(ch, ch // 2, 1, 1, act).conv(ch // 2, ch // 2, 3, 1, act).conv(ch // 2, ch, 1, 1, act)
            b.ew("add", ch)
        if i < 3:
            b.conv(ch, 2 * ch, 3, 2, act)
            ch *= 2
    # neck: upsample + concat, as in the PAN of YOLOv5/v8
    for _ in range(2):
        b.conv(ch, ch // 2, 1, 1, act).up(ch // 2).ew("cat", ch)
        b.conv(ch, ch // 2, 3, 1, act)
        ch //= 2
    for _ in range(2):
        b.conv(ch, ch, 3, 2, act).ew("cat", 2 * ch)
        b.conv(2 * ch, 2 * ch, 3, 1, act)
        ch *= 2


def yolov8(task: str = "object_detection", name: str = "yolov8s", width: int = 32) -> ModelSpec:
    b = _B(640)
    _yolo_backbone(b, width)
    for _ in range(3):   # detect heads (box, cls) per scale
        b.conv(128, 64, 3, 1, "silu").conv(64, 64, 3, 1, "silu").conv(64, 80, 1, 1, None, bn=False)
    if task == "image_segmentation":
        b.conv(128, 32, 3, 1, "silu").up(32).conv(32, 32, 3, 1, "silu")
    if task == "pose_estimation":
        for _ in range(3):
            b.conv(128, 51, 3, 1, "silu").conv(51, 51, 1, 1, None, bn=False)
    return ModelSpec(name, task, tuple(b.layers), 640, (4, 8, 16, 32), (320, 480, 640), "SGD",
                     python_loss=True)


def faster_rcnn() -> ModelSpec:
    b = _B(800)
    cin = _resnet(b)
    for _ in range(4):                       # FPN lateral + output convs
        b.hw = max(b.hw, 25)
        b.conv(cin // 2, 256, 1, 1, None, bn=False).up(256).ew("add", 256)
        b.conv(256, 256, 3, 1, None, bn=False)
    b.conv(256, 256, 3, 1, "relu", bn=False).conv(256, 15, 1, 1, None, bn=False)   # RPN
    b.ew("index", 256)                           # ROI selection
    b.linear(512, 256 * 49, 1024, "relu").linear(512, 1024, 1024, "relu").linear(512, 1024, 91 * 5)
    return ModelSpec("faster_rcnn_r50_fpn", "object_detection", tuple(b.layers), 800, (4, 8, 16),
                     (640, 800), "SGD", python_loss=True)


def detr(deformable: bool = False) -> ModelSpec:
    b = _B(800)
    cin = _resnet(b)
    tokens = (800 // 32) ** 2
    b.conv(cin, 256, 1, 1, None, bn=False)
    for _ in range(6):
        b.block(tokens, 256, mlp=8, window=32 if deformable else None)
    for _ in range(6):
        b.block(100 if not deformable else 300, 256, mlp=8)
    b.linear(100, 256, 92).linear(100, 256, 4, "sigmoid")
    name = "deformable_detr_r50" if deformable else "detr_r50"
    return ModelSpec(name, "object_detection", tuple(b.layers), 800, (4, 8, 16), (640, 800),
                     python_loss=True)


def vitdet(name: str = "vitdet_b", res: int = 1024) -> ModelSpec:
    b = _B(res)
    tokens = _vit(b, res, 16, 768, 12, window=196)
    b.conv(768, 256, 1, 1, "relu").conv(256, 256, 3, 1, "relu").conv(256, 91, 1, 1, None, bn=False)
    del tokens
    return ModelSpec(name, "object_detection", tuple(b.layers), res, (2, 4, 8), (512, 768),
                     python_loss=True)


def yolos() -> ModelSpec:
    b = _B(512)
    _vit(b, 512, 16, 384, 12)
    b.linear(100, 384, 92).linear(100, 384, 4, "sigmoid")
    return ModelSpec("yolos_s", "object_detection", tuple(b.layers), 512, (4, 8, 16), (384, 512),
                     python_loss=True)


def segformer() -> ModelSpec:
    b = _B(512)
    b.conv(3, 64, 7, 4, None, bn=False)
    tokens, dim = 128 * 128, 64
    for depth in (3, 4, 6, 3):
        for _ in range(depth):
            b.block(tokens, dim, window=tokens // 64)    # spatial-reduction attention
        tokens, dim = tokens // 4, min(dim * 2, 512)
    b.hw = 128
    for _ in range(4):
        b.conv(256, 256, 1, 1, None, bn=False).up(256)
        b.hw //= 2
    b.hw = 128
    b.ew("cat", 1024).conv(1024, 256, 1, 1, "relu").conv(256, 150, 1, 1, None, bn=False)
    return ModelSpec("segformer_b2", "image_segmentation", tuple(b.layers), 512, (4, 8, 16),
                     (384, 512))


def mask2former() -> ModelSpec:
    b = _B(512)
    _resnet(b)
    b.hw = 32
    for _ in range(3):                           # pixel decoder
        b.conv(256, 256, 3, 1, "relu").up(256)
    for _ in range(9):                           # masked-attention decoder
        b.block(100, 256, mlp=8)
    b.linear(100, 256, 134)
    return ModelSpec("mask2former_r50", "image_segmentation", tuple(b.layers), 512, (2, 4, 8),
                     (512,), python_loss=True)


def sam() -> ModelSpec:
    b = _B(1024)
    _vit(b, 1024, 16, 768, 12, window=196)
    b.hw = 64
    b.conv(768, 256, 1, 1, None).conv(256, 256, 3, 1, None)
    for _ in range(2):                           # two-way mask decoder
        b.block(4096, 256, mlp=8, window=64)
    b.deconv(256, 64, "gelu").deconv(64, 32, "gelu")
    return ModelSpec("sam_vit_b", "image_segmentation", tuple(b.layers), 1024, (1, 2, 4), (1024,))


def detectron2_mask_rcnn() -> ModelSpec:
    spec = faster_rcnn()
    b = _B(14)
    for _ in range(4):
        b.conv(256, 256, 3, 1, "relu", bn=False)
    b.deconv(256, 256).conv(256, 80, 1, 1, None, bn=False)
    return ModelSpec("detectron2_mask_rcnn_r50", "image_segmentation",
                     spec.layers + tuple(b.layers), 800, (4, 8), (800,), "SGD", python_loss=True)


def sd_unet() -> ModelSpec:
    b = _B(64)                                   # latent 64x64 (512 px images)
    b.conv(4, 320, 3, 1, None, bn=False)
    ch = 320
    for i, mult in enumerate((1, 2, 4)):
        for _ in range(2):
            b.resblock_gn(ch, 320 * mult)
            ch = 320 * mult
            if i > 0:
                b.block(b.hw * b.hw, ch, mlp=4)
        b.conv(ch, ch, 3, 2, None, bn=False)
    b.resblock_gn(ch, ch).block(b.hw * b.hw, ch).resblock_gn(ch, ch)
    for mult in (4, 2, 1):
        for _ in range(2):
            b.ew("cat", 2 * ch).resblock_gn(2 * ch, 320 * mult)
            ch = 320 * mult
            if mult > 1:
                b.block(b.hw * b.hw, ch, mlp=4)
        b.up(ch).conv(ch, ch, 3, 1, None, bn=False)
    b.ew("gn", ch).ew("silu", ch).conv(ch, 4, 3, 1, None, bn=False)
    return ModelSpec("stable_diffusion_unet", "image_generation", tuple(b.layers), 64, (2, 4, 8),
                     (64,), "AdamW")


def ddpm_unet() -> ModelSpec:
    b = _B(64)
    b.conv(3, 128, 3, 1, None, bn=False)
    ch = 128
    for mult in (1, 2, 2, 2):
        for _ in range(2):
            b.resblock_gn(ch, 128 * mult)
            ch = 128 * mult
        if b.hw == 16:
            b.block(256, ch)
        b.conv(ch, ch, 3, 2, None, bn=False)
    for mult in (2, 2, 2, 1):
        b.ew("cat", 2 * ch).resblock_gn(2 * ch, 128 * mult)
        ch = 128 * mult
        b.up(ch).conv(ch, ch, 3, 1, None, bn=False)
    b.ew("gn", ch).ew("silu", ch).conv(ch, 3, 3, 1, None, bn=False)
    return ModelSpec("ddpm_unet", "image_generation", tuple(b.layers), 64, (16, 32, 64), (32, 64))


def dcgan() -> ModelSpec:
    b = _B(4)
    b.linear(1, 128, 512 * 16)
    for cin, cout in ((512, 256), (256, 128), (128, 64)):
        b.deconv(cin, cout)
    b.deconv(64, 3, "sigmoid")
    d = _B(64)
    for cin, cout in ((3, 64), (64, 128), (128, 256), (256, 512)):
        d.conv(cin, cout, 4, 2, "relu")
    d.linear(1, 512 * 16, 1, "sigmoid")
    return ModelSpec("dcgan", "image_generation", tuple(b.layers + d.layers), 64,
                     (32, 64, 128), (64,))


def dpt(name: str = "dpt_hybrid", depth: int = 12, dim: int = 768) -> ModelSpec:
    b = _B(384)
    _vit(b, 384, 16, dim, depth)
    b.hw = 24
    for _ in range(4):                            # reassemble + fusion blocks
        b.conv(dim if b.hw == 24 else 256, 256, 3, 1, "relu", bn=False).up(256).ew("add", 256)
    b.conv(256, 128, 3, 1, "relu", bn=False).up(128).conv(128, 1, 1, 1, "relu", bn=False)
    return ModelSpec(name, "depth_estimation", tuple(b.layers), 384, (2, 4, 8), (256, 384))


def depth_anything_v2() -> ModelSpec:
    spec = dpt("depth_anything_v2_b", 12, 768)
    return ModelSpec("depth_anything_v2_vitb", "depth_estimation", spec.layers, 518,
                     (4, 8), (518,))


def zoedepth() -> ModelSpec:
    spec = dpt("zoedepth", 24, 1024)
    b = _B(96)
    for _ in range(3):
        b.conv(256, 128, 1, 1, "gelu", bn=False).ew("softmax", 128)
    return ModelSpec("zoedepth_n", "depth_estimation", spec.layers + tuple(b.layers), 384,
                     (2, 4), (384,))


def video_transformer() -> ModelSpec:
    b = _B(224)
    _vit(b, 224, 16, 768, 12, frames=8, window=196)     # divided space-time attention
    b.linear(1, 768, 400)
    return ModelSpec("timesformer_b", "action_recognition", tuple(b.layers), 224, (4, 8),
                     (224,), video_frames=8)


def x3d() -> ModelSpec:
    b = _B(160)
    _resnet(b, (1, 2, 5, 3), 24, "relu")
    b.ew("avgpool", 432)
    b.hw = 1
    b.linear(1, 432, 400)
    return ModelSpec("x3d_m", "action_recognition", tuple(b.layers), 160, (8, 16), (160,),
                     "SGD", video_frames=4)


#: Model builders by task (Table 1, plus a second action-recognition model).
MODELS: dict[str, list[Callable[[], ModelSpec]]] = {
    "image_classification": [resnet50, resnet101, vgg16, vit_b16, swin_t, resnet18, resnet18_cifar,
                             mobilenet_v2, vit_tiny],
    "object_detection": [yolov8, faster_rcnn, detr, lambda: detr(True), vitdet, yolos,
                         lambda: yolov8("object_detection", "yolov8n", 16)],
    "image_segmentation": [segformer, lambda: yolov8("image_segmentation", "yolov8s_seg"),
                           detectron2_mask_rcnn, mask2former, sam],
    "image_generation": [sd_unet, dcgan, ddpm_unet],
    "depth_estimation": [depth_anything_v2, dpt, zoedepth],
    "pose_estimation": [lambda: yolov8("pose_estimation", "yolov8s_pose")],
    "action_recognition": [video_transformer, x3d],
}


def all_models() -> dict[str, ModelSpec]:
    """Every model by name (built once)."""
    out = {}
    for builders in MODELS.values():
        for build in builders:
            spec = build()
            out[spec.name] = spec
    return out
