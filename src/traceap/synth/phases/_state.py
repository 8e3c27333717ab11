"""What every phase of one rank's loop shares: the compute stream, the op tables, and the
state `_Run.__init__` sets up (declared here so each phase module reads on its own)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..engine import Engine
from ..ops import Ctx, Layer

if TYPE_CHECKING:
    from ..simulator import RunConfig

COMPUTE_STREAM = 7
_COMPUTE_OPS = {"conv", "dwconv", "deconv", "linear", "attn"}
#: The light view / dtype bookkeeping ops real traces show inside eager ops.
_BOOKKEEPING = (("aten::empty", "aten::view"), ("aten::view",), ("aten::as_strided", "aten::result_type"),
                ("aten::empty", "aten::resize_", "aten::view"), ("aten::result_type", "aten::empty"),
                ("aten::view", "aten::empty"), ("aten::t", "aten::transpose", "aten::as_strided"))
_FUSE_NAMES = {"bn": "_native_batch_norm_legit_functional", "relu": "relu", "silu": "silu",
               "gelu": "gelu", "sigmoid": "sigmoid", "add": "add", "mul": "mul",
               "ln": "native_layer_norm", "gn": "native_group_norm", "maxpool": "max_pool2d_with_indices",
               "avgpool": "mean", "upsample": "_unsafe_index", "cat": "cat", "softmax": "_softmax",
               "index": "index"}


class RunState:
    """The attributes of one rank's loop that the phase mixins read and advance (set by
    `simulator._Run.__init__`; one random stream and one engine, so the phases' order of
    calls is what makes a seed give the same trace)."""

    cfg: RunConfig
    rng: np.random.Generator
    eng: Engine
    ctx: Ctx
    eff: float
    nccl_stream: int
    nccl_version: str
    batch_ready: float | None        # when the DataLoader's next batch is ready
    step_spans: list[tuple[float, float]]
    frame_ids: int                   # torch.compile frames seen so far
    layers: tuple[Layer, ...]
    param_tensors: int
    seq: int                         # autograd sequence number of the next forward op
    step_index: int
    _sync_layers: list[int] | None   # drawn at the first eager forward
