"""Self-supervised pretraining on unlabelled traces: masked windows, picked out by context.

The detector's encoders learn what real traces look like before they learn what is wrong in
them.  Some windows of a trace are hidden from the window-to-window module (their embedding is
replaced by a learned mask token); from the windows around them it must tell each hidden
window apart from the trace's other windows (InfoNCE over the trace's windows, in the manner of
wav2vec 2.0 and CPC).  The event and window encoders learn to tell a trace's windows apart (the
negatives keep them from collapsing), the window-to-window module to expect a window from its
neighbours: a stall is a window its context does not predict.  No label is read, so any Kineto
trace can be used, a user's own included.

The objective's extra parameters (mask token, two projections) live in `MaskedWindows`, not in
the detector: a pretrained detector's checkpoint has the layout of any other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..progress import track


class MaskedWindows(nn.Module):
    """Mask token and projections of the masked-window objective (paired with a detector)."""

    def __init__(self, dim: int, mask_share: float = 0.15, temperature: float = 0.1):
        super().__init__()
        self.mask_share = mask_share
        self.temperature = temperature
        self.token = nn.Parameter(torch.zeros(dim))
        nn.init.trunc_normal_(self.token, std=0.02)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)

    def mask(self, b: int, n: int, gen: torch.Generator) -> torch.Tensor:
        """[B, N] bool: the hidden windows, at least one per trace, never all of them."""
        m = torch.rand(b, n, generator=gen) < self.mask_share
        first = torch.randint(0, n, (b,), generator=gen)
        rows = torch.arange(b)
        m[rows, first] = True
        if n > 1:  # one window across the trace always stays in view
            m[rows, (first + n // 2) % n] = False
        return m

    def loss(self, model, batch: dict[str, torch.Tensor], gen: torch.Generator
             ) -> tuple[torch.Tensor, float]:
        """(InfoNCE loss, share of hidden windows picked out right) for one batch."""
        e_win = model.windows(model.events(batch), batch)               # [B, N, D]
        b, n, _ = e_win.shape
        m = self.mask(b, n, gen)
        x = torch.where(m.unsqueeze(-1), self.token.expand_as(e_win), e_win)
        feat, _ = model.relation(x)
        q = F.normalize(self.query(feat), dim=-1)
        k = F.normalize(self.key(e_win), dim=-1)
        logits = torch.einsum("bid,bjd->bij", q, k) / self.temperature   # [B, N, N]
        target = torch.arange(n).expand(b, n)
        picked = logits[m]
        loss = F.cross_entropy(picked, target[m])
        acc = float((picked.argmax(-1) == target[m]).float().mean())
        return loss, acc


def pretrain(model, feats: Sequence[dict[int, object]], steps: int, collate_fn: Callable,
             windows: Sequence[int], batch_size: int, lr: float, weight_decay: float,
             seed: int, mask_share: float = 0.15,
             log: Callable[[str], None] | None = None) -> list[dict]:
    """Train `model`'s encoders and window-to-window module in place for `steps` steps of the
    masked-window objective on `feats` (per trace: N -> TraceFeatures); one N per step, drawn
    from `windows`.  Returns a log row per 25 steps (loss, accuracy of the pick)."""
    if steps <= 0 or not feats:
        return []
    rng = np.random.default_rng([seed, 1])
    gen = torch.Generator().manual_seed(seed + 1)
    ssl = MaskedWindows(model.cfg.D, mask_share)
    params = [p for p in model.parameters() if p.requires_grad] + list(ssl.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warmup = max(1, min(50, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    rows, loss_sum, acc_sum, k = [], 0.0, 0.0, 0
    for step in track(range(steps), "pretraining"):
        n = int(rng.choice(list(windows)))
        pick = rng.choice(len(feats), size=batch_size, replace=len(feats) < batch_size)
        batch = collate_fn([feats[i][n] for i in pick], rng)
        loss, acc = ssl.loss(model, batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        loss_sum, acc_sum, k = loss_sum + float(loss.detach()), acc_sum + acc, k + 1
        if (step + 1) % 25 == 0 or step + 1 == steps:
            rows.append({"step": step + 1, "loss": loss_sum / k, "pick_acc": acc_sum / k})
            if log:
                log(f"pretrain step {step + 1}/{steps}: loss {loss_sum / k:.3f}, hidden windows "
                    f"picked out {100 * acc_sum / k:.1f}%")
            loss_sum, acc_sum, k = 0.0, 0.0, 0
    return rows


__all__ = ["MaskedWindows", "pretrain"]
