"""The few numerical building blocks that scoring needs, in numpy (no torch at inference).

Each matches its torch counterpart to float32 rounding: `layer_norm` (nn.LayerNorm),
`gelu` (nn.GELU(), the erf form), `softmax_`, `linear` (nn.Linear, weight [out, in]).
`blas_threads(n)` caps numpy's BLAS threads for a block, as `torch.set_num_threads` did.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import numpy as np


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x @ weight.T + bias (nn.Linear's layout)."""
    y = x @ weight.T
    if bias is not None:
        y += bias
    return y


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LayerNorm over the last axis (biased variance, as torch); a new array."""
    centred = x - x.mean(-1, keepdims=True)
    var = np.einsum("...i,...i->...", centred, centred)[..., None] / np.float32(x.shape[-1])
    centred *= 1.0 / np.sqrt(var + np.float32(eps))
    centred *= weight
    centred += bias
    return centred


#: Abramowitz & Stegun 7.1.26: erf(z) = 1 - t(a1 + t(a2 + ...)) exp(-z^2), t = 1 / (1 + p z),
#: z >= 0, absolute error below 1.5e-7 (float32 resolution near 1 is 6e-8).
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

#: Elements per block of GELU's element-wise passes: 128 KB per temporary, so the twenty
#: passes of the erf approximation run in cache instead of streaming a [tokens, 1536] array
#: through memory twenty times (3x faster, measured on MiniLM's FFN).
_BLOCK = 1 << 15


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, x Phi(x) = (x + |x| erf(|x| / sqrt 2)) / 2; in place when x is a
    C-contiguous float32 array, so use the returned array."""
    if x.dtype != np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        x = np.array(x, dtype=np.float32, order="C")
    flat = x.reshape(-1)
    size = min(_BLOCK, flat.size)
    z_buf, t_buf, p_buf = (np.empty(size, np.float32) for _ in range(3))
    for start in range(0, flat.size, _BLOCK):
        xb = flat[start:start + _BLOCK]
        z, t, poly = z_buf[:len(xb)], t_buf[:len(xb)], p_buf[:len(xb)]
        np.abs(xb, out=z)
        z *= np.float32(1.0 / math.sqrt(2.0))
        np.multiply(z, np.float32(_AS_P), out=t)
        t += np.float32(1.0)
        np.reciprocal(t, out=t)
        np.multiply(t, np.float32(_AS_A[4]), out=poly)
        for a in _AS_A[3::-1]:
            poly += np.float32(a)
            poly *= t
        np.multiply(z, z, out=t)
        np.negative(t, out=t)
        np.exp(t, out=t)
        poly *= t                           # 1 - erf(|x| / sqrt 2)
        np.subtract(np.float32(1.0), poly, out=poly)
        z *= np.float32(math.sqrt(2.0))     # |x| again
        poly *= z
        xb += poly
        xb *= np.float32(0.5)
    return x


def relu(x: np.ndarray) -> np.ndarray:
    """max(x, 0), in place."""
    return np.maximum(x, 0, out=x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), without overflow warnings for large |x|."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def softmax_(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in place (-inf entries get weight 0)."""
    x -= x.max(-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(-1, keepdims=True)
    return x


_CONTROLLER = None


def blas_threads(n: int | None):
    """Context: numpy's BLAS on at most n threads (None: as it is).  Small products (attention
    heads, the detector's 64-wide layers) run faster on one thread: OpenBLAS's hand-offs between
    threads cost more than the arithmetic, 50x more on a busy 2-core machine (measured)."""
    if not n:
        return nullcontext()
    global _CONTROLLER
    if _CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # threadpoolctl comes with scikit-learn; without it, leave BLAS be
            return nullcontext()
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=n, user_api="blas")


def idle_cpus() -> int:
    """CPUs this process may use that other work is not using: the available CPUs minus the
    one-minute load average, at least 1.  Large products get these threads; on a busy shared
    machine that is one, where more threads only slowed MiniLM down (1.4x wall, measured)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(n, int(n - load + 0.5)))


__all__ = ["blas_threads", "idle_cpus", "gelu", "layer_norm", "linear", "relu", "sigmoid", "softmax_"]
