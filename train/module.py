"""The LightningModule: wraps a plain perfmodel PerfMLP (Lightning stays in train/)."""
from __future__ import annotations

import lightning as L
import torch

from perfmodel.model import PerfMLP

from .losses import within_problem_loss


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
