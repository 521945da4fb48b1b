"""Training losses shared by the loops (train/module.py's Lightning module, train/bmm_head.py's plain loop)."""
from __future__ import annotations

import torch


def within_problem_loss(pred: torch.Tensor, y: torch.Tensor, group: torch.Tensor, tau: float = 0.3) -> torch.Tensor:
    """MSE of log-times centred per problem -- what ranking the configs of one problem depends on --
    weighted towards each problem's fast configs (weight exp(-(y - y_best) / tau) + 0.05): ranking the
    top is what top-k selection needs. Batches hold whole problems, so y_best is the problem's best."""
    _, inv = torch.unique(group, return_inverse=True)
    n_groups = int(inv.max()) + 1
    best = torch.full((n_groups,), float("inf"), device=y.device, dtype=y.dtype).scatter_reduce(0, inv, y, "amin")
    w = torch.exp(-(y - best[inv]) / tau) + 0.05 if tau > 0 else torch.ones_like(y)
    d = pred - y
    sw = torch.zeros(n_groups, device=y.device, dtype=y.dtype).index_add_(0, inv, w)
    mean_d = torch.zeros_like(sw).index_add_(0, inv, w * d) / sw
    return (w * (d - mean_d[inv]) ** 2).sum() / w.sum()
