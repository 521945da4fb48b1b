"""The LightningModule: wraps a plain perfmodel PerfMLP (Lightning stays in train/)."""
from __future__ import annotations

import lightning as L
import torch

from perfmodel.model import PerfMLP


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


class PerfModule(L.LightningModule):
    def __init__(self, model: PerfMLP, lr: float = 2e-3, weight_decay: float = 1e-5, rank_weight: float = 1.0,
                 max_epochs: int = 40, prefix: str = "", rank_tau: float = 0.3) -> None:
        super().__init__()
        self.model = model
        # logger=False: one MLflow run holds several heads; the pipeline logs the settings once itself.
        self.save_hyperparameters(ignore=["model"], logger=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _loss(self, batch, stage: str) -> torch.Tensor:
        x, y, group = batch
        pred = self.model(x)
        if pred.dim() == 2:  # multi-output head (pad): y is (N, k)
            mse = ((pred - y) ** 2).mean()
            loss = mse
            rank = torch.zeros((), device=x.device)
        else:
            mse = ((pred - y) ** 2).mean()
            rank = within_problem_loss(pred, y, group, self.hparams.rank_tau) if self.hparams.rank_weight > 0 else torch.zeros_like(mse)
            loss = mse + self.hparams.rank_weight * rank
        pre = self.hparams.prefix
        self.log(f"{pre}{stage}_loss", loss, prog_bar=True, on_epoch=True, on_step=False, batch_size=len(y))
        self.log(f"{pre}{stage}_mse_log", mse, on_epoch=True, on_step=False, batch_size=len(y))
        self.log(f"{pre}{stage}_rank_mse", rank, on_epoch=True, on_step=False, batch_size=len(y))
        return loss

    def training_step(self, batch, batch_idx):
        return self._loss(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._loss(batch, "val")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.hparams.max_epochs))
        return {"optimizer": opt, "lr_scheduler": sched}
