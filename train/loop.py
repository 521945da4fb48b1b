"""The two training loops and the one ensemble fitter of every head.

- fit_lightning: the gemm, screen, pad and baseline heads (many rows, batches of whole problems for the
  within-problem ranking term): Lightning's Trainer on train/module.py's PerfModule.
- fit_plain: the small heads (static, call, cuBLAS, student): a plain loop, AdamW with a one-cycle
  learning rate, smooth L1 or L1 on shuffled row batches.
- fit_ensemble: n members, their average as one MLP (PerfMLP.ensemble); fit_members: n heads by
  fit_lightning from consecutive seeds, averaged by it.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from perfmodel.model import PerfMLP

from .data import make_loader


def one_cycle(opt: torch.optim.Optimizer, lr: float, total_steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    """The one-cycle schedule of every plain fit: a tenth of the steps warming up to lr. torch's OneCycleLR
    divides by zero when the warm-up phase ends on step 0 (a tenth of exactly 10 steps); there the warm-up
    takes a fifth (two steps). Any other count is scheduled as before, so the shipped heads are unchanged."""
    pct = 0.2 if 0.1 * total_steps == 1.0 else 0.1
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps, pct_start=pct)


def fit_plain(head: PerfMLP, x: torch.Tensor, y: torch.Tensor, s: Any, seed: int, forward: Any,
              on_epoch: Any = None, *, loss: str = "smooth_l1", whole_batches: bool = False,
              device: str = "cpu") -> PerfMLP:
    """head (inputs standardised on x) fitted so that forward(rows) matches y: AdamW (s.lr, s.weight_decay),
    one cycle over s.epochs epochs of s.batch_rows-row batches shuffled by seed; on_epoch(epoch, mean train
    loss) after each epoch. loss: "smooth_l1" (s.huber_beta) on forward's output flattened, "l1" on it
    as it is, or "masked_smooth_l1" for several outputs (y (N, k), NaN where a row has no target): per
    output the smooth L1 over its rows with a target, the outputs' means summed. whole_batches: a last partial batch of each epoch is left out (else it is a smaller batch).
    device: where the rows and the head live while fitting (the head comes back on the CPU, in eval mode)."""
    if loss not in ("smooth_l1", "l1", "masked_smooth_l1"):
        raise ValueError(f"loss: expected 'smooth_l1', 'l1' or 'masked_smooth_l1', got {loss!r}")
    head.set_normalisation(x.mean(0), x.std(0))
    dev = torch.device(device)
    head.to(dev).train()
    xd, yd = x.to(dev), y.to(dev)
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    steps = max(1, len(x) // s.batch_rows if whole_batches else math.ceil(len(x) / s.batch_rows))
    sched = one_cycle(opt, s.lr, s.epochs * steps)
    for epoch in range(s.epochs):
        order, total = torch.randperm(len(x), generator=gen).to(dev), 0.0
        for i in range(steps):
            idx = order[i * s.batch_rows:(i + 1) * s.batch_rows]
            if loss == "l1":
                value = (forward(xd[idx]) - yd[idx]).abs().mean()
            elif loss == "masked_smooth_l1":
                value = masked_smooth_l1(forward(xd[idx]), yd[idx], s.huber_beta)
            else:
                value = torch.nn.functional.smooth_l1_loss(forward(xd[idx]).reshape(-1), yd[idx], beta=s.huber_beta)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            sched.step()
            total += float(value.detach())
        if on_epoch is not None:
            on_epoch(epoch + 1, total / steps)
    return head.to("cpu").eval()


def masked_smooth_l1(pred: torch.Tensor, y: torch.Tensor, beta: float) -> torch.Tensor:
    """pred, y (N, k), y NaN where a row has no target for an output: per output the smooth L1 mean over
    its rows with a target (0 for an output with none), summed over the outputs."""
    have = torch.isfinite(y)
    err = torch.nn.functional.smooth_l1_loss(pred, torch.where(have, y, pred.detach()), reduction="none", beta=beta)
    return ((err * have).sum(0) / have.sum(0).clamp(min=1)).sum()


def fit_members(make, n: int, x: torch.Tensor, y: torch.Tensor, split: np.ndarray, groups: np.ndarray | None,
                settings: Any, logger, epochs: int, prefix: str, rank_weight: float,
                average: str = "before_floor") -> PerfMLP:
    """n heads fitted with Lightning from seeds seed, seed + 1, ...; their average as one MLP when n > 1
    (fit_ensemble); settings: TrainSettings (its seed and the Trainer's). A single head keeps its metric prefix "<prefix>_", members are
    "<prefix>0_", "<prefix>1_", ..."""
    if n <= 1:
        return fit_lightning(make(), x, y, split, groups, settings, logger, epochs, f"{prefix}_", rank_weight)

    def member(i: int) -> PerfMLP:
        torch.manual_seed(settings.seed + i)
        return fit_lightning(make(), x, y, split, groups, replace(settings, seed=settings.seed + i), logger, epochs,
                             f"{prefix}{i}_", rank_weight)

    return fit_ensemble(member, n, average)


def fit_ensemble(fit_member: Callable[[int], PerfMLP], n: int, average: str, single_as_is: bool = True) -> PerfMLP:
    """fit_member(0), ..., fit_member(n - 1), averaged as one MLP (PerfMLP.ensemble, `average`: before or
    after each member's floor); one member as it is when single_as_is (else an ensemble of one)."""
    if n < 1:
        raise ValueError(f"members: must be >= 1, got {n}")
    members = [fit_member(i) for i in range(n)]
    return members[0] if n == 1 and single_as_is else PerfMLP.ensemble(members, average)


def trainer(settings: Any, logger: Any, epochs: int):
    """Lightning's Trainer for one head (settings: TrainSettings' accelerator, devices, strategy, progress,
    fast_dev_run); deterministic, no checkpoints."""
    import lightning as L

    return L.Trainer(max_epochs=epochs, accelerator=settings.accelerator, devices=settings.devices,
                     strategy=settings.strategy, logger=logger, enable_checkpointing=False,
                     enable_progress_bar=settings.progress, enable_model_summary=False,
                     fast_dev_run=settings.fast_dev_run, deterministic=True, log_every_n_steps=10)


def fit_lightning(head: PerfMLP, x: torch.Tensor, y: torch.Tensor, split: np.ndarray, groups: np.ndarray | None,
                  settings: Any, logger: Any, epochs: int, prefix: str, rank_weight: float) -> PerfMLP:
    """Fit one head on rows with split==0, validating on split==1 (groups: each row's problem, for batches
    of whole problems and the within-problem ranking term; None: row batches). settings: TrainSettings
    (lr, weight_decay, rank_tau, problems_per_batch, seed and the Trainer's)."""
    from .module import PerfModule

    tr, va = split == 0, split == 1
    head.set_normalisation(x[tr].mean(0), x[tr].std(0))
    gtr = groups[tr] if groups is not None else None
    gva = groups[va] if groups is not None else None
    if gtr is not None:  # dense problem ids for the batch sampler
        gtr = np.unique(gtr, return_inverse=True)[1]
        gva = np.unique(gva, return_inverse=True)[1]
    train_dl = make_loader(x[tr], y[tr], gtr, settings.problems_per_batch, True, settings.seed, batch_rows=256)
    val_dl = make_loader(x[va], y[va], gva, 64, False, settings.seed, batch_rows=4096)
    module = PerfModule(head, lr=settings.lr, weight_decay=settings.weight_decay, rank_weight=rank_weight,
                        max_epochs=epochs, prefix=prefix, rank_tau=settings.rank_tau)
    trainer(settings, logger, epochs).fit(module, train_dl, val_dl)
    return head.eval()
