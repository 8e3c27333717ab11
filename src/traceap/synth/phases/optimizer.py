"""Phase 5 of a step: the optimizer step (foreach, fused or compiled), zero_grad, EMA, and
GradScaler's unscale / found-inf check."""

from __future__ import annotations

import math

from .. import ops
from ..ops import Kern, OpCall
from ._state import COMPUTE_STREAM, RunState


#: GradScaler kernels (ATen's AMP kernels).
AMP_UNSCALE = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
               "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
               "UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_unscale_"
               "cuda_(c10::ArrayRef<at::Tensor>, at::Tensor&, at::Tensor const&)::{lambda()#1}::"
               "operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}>(at::native::"
               "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous namespace)::"
               "UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_unscale_"
               "cuda_(c10::ArrayRef<at::Tensor>, at::Tensor&, at::Tensor const&)::{lambda()#1}::"
               "operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1})")


AMP_UPDATE = "void at::native::amp_update_scale_cuda_kernel(float*, int*, float const*, double, double, int)"


class Optimizer(RunState):
    """optimizer.step(), zero_grad(), the EMA update and GradScaler's check."""

    def optimizer_step(self) -> None:
        cfg, e = self.cfg, self.eng
        opt = cfg.optimizer or cfg.model.optimizer
        params_mb = self.cfg.model.params_m * 4.0
        s = e.begin(e.main, f"Optimizer.step#{opt}.step")
        chunks = max(1, math.ceil(self.param_tensors / 110))     # multi_tensor_apply chunking
        if not cfg.extra.get("foreach", True):
            self.single_tensor_step(opt, params_mb)
        elif cfg.compiled and cfg.compiled_optimizer:
            self.compiled_optimizer_step(params_mb * (14.0 if opt == "AdamW" else 8.0))
        elif opt == "AdamW" and cfg.extra.get("fused_adam", False):
            self.simple(e.main, "aten::_foreach_add_", ops.foreach("add_scalar"), 0.01)  # step count
            self.op(e.main, OpCall(("aten::_fused_adamw_",),
                                   tuple(Kern(ops.foreach("adam"), 1.0 / chunks, True, 512, 64)
                                         for _ in range(chunks)), 0.0, params_mb * 7, 60.0))
        elif opt == "AdamW":
            # torch.optim.AdamW's default foreach path (fused=True is opt-in)
            self.simple(e.main, "aten::_foreach_add_", ops.foreach("add_scalar"), 0.01)
            for name, kind, mult in (("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_lerp_", "add_list", 3),
                                     ("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_addcmul_", "add_list", 3),
                                     ("aten::_foreach_sqrt", "mul_scalar", 2),
                                     ("aten::_foreach_div_", "mul_scalar", 2),
                                     ("aten::_foreach_add_", "add_scalar", 2),
                                     ("aten::_foreach_addcdiv_", "add_list", 4)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))
        else:
            for name, kind, mult in (("aten::_foreach_add_", "add_list", 3),
                                     ("aten::_foreach_mul_", "mul_scalar", 2),
                                     ("aten::_foreach_add_", "add_list", 3),
                                     ("aten::_foreach_add_", "add_list", 3)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))
        e.end(s)
        z = e.begin(e.main, f"Optimizer.zero_grad#{opt}.zero_grad", gpu=False)
        if cfg.extra.get("zero_grad_fill", False) and cfg.extra.get("foreach", True):
            # zero_grad(set_to_none=False) of a foreach optimizer: one _foreach_zero_ over the
            # gradients (multi_tensor_apply), a healthy look-alike of unfused_optimizer
            self.op(e.main, OpCall(("aten::_foreach_zero_",),
                                   tuple(Kern(ops.foreach("zero"), 1.0 / chunks, True, 512, 32)
                                         for _ in range(chunks)), 0.0, params_mb, 30.0))
        elif cfg.extra.get("zero_grad_fill", False):
            # zero_grad(set_to_none=False) of a single-tensor optimizer (torch.optim's default
            # when `foreach` is not given): one fill kernel per gradient, part of the pattern
            for layer in self.layers:
                if layer.params_m > 0:
                    self.op(e.main, OpCall(("aten::zero_", "aten::fill_"),
                                           (Kern(ops.elementwise("fill", "fp32"), 1.0, True),),
                                           0.0, layer.params_m * 4, 8.0))
        else:
            e.idle(e.main, e.host(20.0 + self.param_tensors * 0.4))    # set_to_none: no kernels
        e.end(z)
        if cfg.ema:
            # ModelEMA.update: ema = d * ema + (1 - d) * params, two foreach ops over the weights
            for name, kind, mult in (("aten::_foreach_mul_", "mul_scalar", 2), ("aten::_foreach_add_", "add_list", 3)):
                self.op(e.main, OpCall((name,), tuple(Kern(ops.foreach(kind), 1.0 / chunks, True, 512, 32)
                                                      for _ in range(chunks)), 0.0, params_mb * mult, 30.0))

    #: The per-parameter ops of torch.optim's single-tensor paths (`_single_tensor_sgd` with
    #: momentum and weight decay, `_single_tensor_adamw`): (aten op, kernel kind, bytes x param).
    SINGLE_TENSOR_OPS = {
        "SGD": (("aten::add_", "add", 3), ("aten::mul_", "mul_scalar", 2), ("aten::add_", "add", 3),
                ("aten::add_", "add", 3)),
        "AdamW": (("aten::mul_", "mul_scalar", 2), ("aten::lerp_", "add", 3),
                  ("aten::mul_", "mul_scalar", 2), ("aten::addcmul_", "add", 3),
                  ("aten::sqrt", "mul_scalar", 2), ("aten::div_", "div", 3),
                  ("aten::add_", "add_", 2), ("aten::addcdiv_", "add", 4)),
    }

    def single_tensor_step(self, opt: str, params_mb: float) -> None:
        """`foreach=False`: one tiny kernel per parameter and per op; the GPU waits for the
        launches once the backward's queue has drained (unfused_optimizer's interval)."""
        e = self.eng
        per_param = params_mb / max(self.param_tensors, 1)
        t0, backlog = e.clock[e.main], e.stream_free(COMPUTE_STREAM)
        for _ in range(self.param_tensors):
            e.idle(e.main, e.host(4.0))                      # the Python loop over parameters
            for name, kind, mult in self.SINGLE_TENSOR_OPS.get(opt, self.SINGLE_TENSOR_OPS["SGD"]):
                self.op(e.main, OpCall((name,), (Kern(ops.elementwise(kind, "fp32"), 1.0, True),),
                                       0.0, per_param * mult, 6.0))
        self.starvation("unfused_optimizer", t0, e.clock[e.main], backlog)

    def grad_scaler_check(self) -> None:
        """GradScaler.unscale_ and the found-inf check: one foreach kernel and one `.item()`."""
        e = self.eng
        chunks = max(1, math.ceil(self.param_tensors / 110))
        self.op(e.main, OpCall(("aten::_amp_foreach_non_finite_check_and_unscale_",),
                               tuple(Kern(AMP_UNSCALE, 1.0 / chunks, True, 512, 32) for _ in range(chunks)),
                               0.0, self.cfg.model.params_m * 8.0, 40.0))
        self.item_sync(e.main, "aten::item")
