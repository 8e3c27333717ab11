"""Training losses of paper section 5.5 (weak supervision: trace labels only), and the total.

  L = w_trace L_trace + w_svm L_svm + w_cluster L_cluster + w_smooth L_smooth (+ w_pattern L_pattern)
      (+ w_window L_window + w_window_pattern L_window_pattern: window labels where a train
         trace's anomalies are known; off by default)

Shapes: scores [B, N] in (0, 1), emb [B, N, D], y [B] (1 = bad trace, 0 = good).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import ModelConfig


def topk_count(n: int, fraction: float) -> int:
    """How many of n windows a fraction selects (at least one)."""
    return max(1, min(n, math.ceil(fraction * n)))


def trace_score(scores: torch.Tensor, pool: str = "mean", fraction: float = 0.2) -> torch.Tensor:
    """Trace-level score from window scores: the mean (paper eq. 10) or the top-k mean."""
    if pool == "mean":
        return scores.mean(dim=1)
    k = topk_count(scores.shape[1], fraction)
    return scores.topk(k, dim=1).values.mean(dim=1)


def trace_loss(scores: torch.Tensor, y: torch.Tensor, pool: str = "mean",
               fraction: float = 0.2) -> torch.Tensor:
    """Eq. 10: BCE between the trace's pooled window score and its label."""
    p = trace_score(scores, pool, fraction).clamp(1e-6, 1 - 1e-6)
    return F.binary_cross_entropy(p, y.to(p.dtype))


def select_windows(scores: torch.Tensor, y: torch.Tensor, s_pos: float, s_neg: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 12-13: per trace, the top-scoring S+ of a normal trace's windows (hard negatives)
    and the top-scoring S- of an abnormal trace's windows (likely anti-patterns).

    Returns (selected [B, N] bool, svm_label [B, N] in {-1, +1})."""
    b, n = scores.shape
    selected = torch.zeros_like(scores, dtype=torch.bool)
    for i in range(b):
        k = topk_count(n, s_neg if y[i] > 0.5 else s_pos)
        selected[i, scores[i].detach().topk(k).indices] = True
    label = torch.where(y > 0.5, 1.0, -1.0).to(scores.dtype)[:, None].expand(b, n)
    return selected, label


def svm_loss(margin: torch.Tensor, selected: torch.Tensor, label: torch.Tensor,
             weight: torch.Tensor, c: float = 1e-3) -> torch.Tensor:
    """Eq. 11: hinge loss of a linear SVM on the selected window embeddings.

    margin: [B, N] = w . e + b of each window; weight: the hyperplane's w (L2-regularised)."""
    hinge = F.relu(1.0 - label * margin)[selected]
    return hinge.mean() + c * weight.pow(2).sum()


def cluster_loss(emb: torch.Tensor, scores: torch.Tensor, keep: torch.Tensor,
                 max_windows: int = 256, generator: torch.Generator | None = None) -> torch.Tensor:
    """Eq. 14: windows with similar pseudo-labels (detached scores) pull together, different
    ones push apart: mean of (1 - D_ij)(1 - S_ij)/2 + D_ij max(S_ij, 0), over the windows
    not picked by the SVM loss (`keep`), S = cosine similarity, D = |p_i - p_j|."""
    e = F.normalize(emb[keep], dim=-1)
    p = scores.detach()[keep]
    if e.shape[0] < 2:
        return emb.sum() * 0.0
    if e.shape[0] > max_windows:
        idx = torch.randperm(e.shape[0], generator=generator)[:max_windows]
        e, p = e[idx], p[idx]
    s = e @ e.T
    d = (p[:, None] - p[None, :]).abs()
    off = ~torch.eye(len(p), dtype=torch.bool, device=e.device)
    loss = (1.0 - d) * (1.0 - s) / 2.0 + d * F.relu(s)
    return loss[off].mean()


def smooth_loss(scores: torch.Tensor) -> torch.Tensor:
    """Temporal smoothness: mean squared difference of consecutive window scores."""
    if scores.shape[1] < 2:
        return scores.sum() * 0.0
    return (scores[:, 1:] - scores[:, :-1]).pow(2).mean()


def pattern_loss(pattern_logits: torch.Tensor, targets: torch.Tensor,
                 fraction: float = 0.2) -> torch.Tensor:
    """MIL pattern loss: per pattern, BCE of the top-k mean window probability vs. the
    trace-level multi-hot target [B, P] (all zeros for a good trace)."""
    probs = torch.sigmoid(pattern_logits)                                 # [B, N, P]
    k = topk_count(probs.shape[1], fraction)
    pooled = probs.topk(k, dim=1).values.mean(dim=1).clamp(1e-6, 1 - 1e-6)   # [B, P]
    return F.binary_cross_entropy(pooled, targets.to(pooled.dtype))


def window_loss(scores: torch.Tensor, labels: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """BCE of each window's score against its label [B, N], over the traces whose windows'
    labels are known (`known` [B] bool: planted or simulated anomalies, or a good trace)."""
    if not bool(known.any()):
        return scores.sum() * 0.0
    p = scores[known].clamp(1e-6, 1 - 1e-6)
    return F.binary_cross_entropy(p, labels[known].to(p.dtype))


def window_pattern_loss(pattern_logits: torch.Tensor, labels: torch.Tensor,
                        known: torch.Tensor) -> torch.Tensor:
    """Per-window, per-pattern BCE of the pattern head [B, N, P] against the patterns of the
    anomalies each window overlaps [B, N, P], over the traces whose windows are known."""
    if not bool(known.any()):
        return pattern_logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(pattern_logits[known],
                                              labels[known].to(pattern_logits.dtype))


def total_loss(out: dict[str, torch.Tensor], y: torch.Tensor, pattern_targets: torch.Tensor,
               svm_weight: torch.Tensor, cfg: ModelConfig,
               generator: torch.Generator | None = None,
               window_labels: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
               ) -> dict[str, torch.Tensor]:
    """All terms and their weighted sum ("total") for one batch of model outputs.

    `window_labels`: (labels [B, N], known [B], patterns [B, N, P]) for the `window` and
    `window_pattern` terms when `cfg.w_window` / `cfg.w_window_pattern` > 0."""
    scores, emb = out["scores"], out["emb"]
    selected, label = select_windows(scores, y, cfg.s_pos, cfg.s_neg)
    terms = {
        "trace": trace_loss(scores, y, cfg.trace_pool, cfg.topk_fraction),
        "svm": svm_loss(out["svm_margin"], selected, label, svm_weight, cfg.svm_c),
        "cluster": cluster_loss(emb, scores, ~selected, generator=generator),
        "smooth": smooth_loss(scores),
        "pattern": pattern_loss(out["pattern_logits"], pattern_targets, cfg.topk_fraction),
    }
    weights = {"trace": cfg.w_trace, "svm": cfg.w_svm, "cluster": cfg.w_cluster,
               "smooth": cfg.w_smooth, "pattern": cfg.w_pattern}
    if window_labels is not None:
        labels, known, patterns = window_labels
        if cfg.w_window > 0:
            terms["window"] = window_loss(scores, labels, known)
            weights["window"] = cfg.w_window
        if cfg.w_window_pattern > 0:
            terms["window_pattern"] = window_pattern_loss(out["pattern_logits"], patterns, known)
            weights["window_pattern"] = cfg.w_window_pattern
    terms["total"] = sum(weights[k] * terms[k] for k in weights)
    return terms


__all__ = ["cluster_loss", "pattern_loss", "select_windows", "smooth_loss", "svm_loss",
           "topk_count", "total_loss", "trace_loss", "trace_score", "window_loss",
           "window_pattern_loss"]
