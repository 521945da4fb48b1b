"""The config network: one gemm head for both kernel modes (docs/model.md, "The config network").

Its input is the gemm encoder's features plus a kernel-mode flag (0 autotune: the kernel as
`@triton.autotune` runs it, the folder's `gemm` rows; 1 inductor: every size and stride a constant, as
Inductor compiles its mm template, the `gemm_static` rows). It is trained with the gemm head's loop and loss
(train/loop.py fit_members: members averaged after each one's floor, batches of whole groups, the
regression plus within-group ranking loss) on both modes' rows together, each mode's rows of a problem a
group of their own. It replaces the gemm head and the static head (a correction added to the gemm head's
score, fitted afterwards): one network, one fit. A model folder stores it as its gemm head with metadata
"kernel_mode_input"; a loaded model serves each mode with the flag held at its value
(perfmodel/artifact.py config_heads). benchmarks/studies/config_net_arms.py measured it against the two heads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.model import MLPConfig, PerfMLP, floor_features

from .data import GemmTable
from .loop import fit_members
from .metrics import summarize
from .static_head import has_static_rows, load_static, mode_figures, paired_split, split_static

AUTOTUNE, INDUCTOR = artifact.KERNEL_MODE_VALUES["autotune"], artifact.KERNEL_MODE_VALUES["inductor"]  # the flag's values
KERNEL_MODES = {"autotune": AUTOTUNE, "inductor": INDUCTOR}


def with_mode(x: torch.Tensor, flag: float) -> torch.Tensor:
    """x (N, F) with the kernel-mode flag appended as column F (the gemm encoder's columns keep their
    indices, so the physical floor's column is the gemm head's)."""
    if flag not in KERNEL_MODES.values():
        raise ValueError(f"flag: expected {AUTOTUNE} (autotune) or {INDUCTOR} (inductor), got {flag}")
    return torch.cat([x, torch.full((len(x), 1), flag, dtype=x.dtype)], 1)


@dataclass
class JointRows:
    """The config network's training rows: a table's rows (flag 0) then its static rows (flag 1)."""
    x: torch.Tensor          # (N, F + 1)
    y: torch.Tensor          # (N,) log ms
    split: np.ndarray        # (N,) the row's problem's split (0 train, 1 val, 2 test, -1 not in the table)
    groups: np.ndarray       # (N,) the problem index for flag 0 rows, problems + problem index for flag 1


def joint_rows(table: GemmTable, static: GemmTable, split: np.ndarray, x_table: torch.Tensor,
               x_static: torch.Tensor, static_split: np.ndarray | None = None) -> JointRows:
    """table's rows (encoded x_table) with flag 0 and static's (x_static) with flag 1, each static row
    split and grouped by its problem in table (split: table's problems'); a static row whose problem is
    not in table gets split -1 (left out of training and validation) -- unless static_split, one split per
    static problem, is given: then every static row takes its problem's, and a problem table lacks is a
    group of its own."""
    if len(split) != len(table.problems):
        raise ValueError(f"split: {len(split)} entries for {len(table.problems)} problems")
    if len(x_table) != len(table.ms) or len(x_static) != len(static.ms):
        raise ValueError(f"x_table / x_static: {len(x_table)} / {len(x_static)} rows for tables of "
                         f"{len(table.ms)} / {len(static.ms)}")
    _, prob, s_split = paired_split(table, static, split)
    n = len(table.problems)
    if static_split is not None:
        if len(static_split) != len(static.problems):
            raise ValueError(f"static_split: {len(static_split)} entries for {len(static.problems)} problems")
        s_split = np.asarray(static_split)[static.problem_idx]
    s_group = np.where(s_split < 0, -1, np.where(prob >= 0, n + prob, 2 * n + static.problem_idx))
    return JointRows(torch.cat([with_mode(x_table, AUTOTUNE), with_mode(x_static, INDUCTOR)]),
                     torch.from_numpy(np.log(np.concatenate([table.ms, static.ms]))).float(),
                     np.concatenate([split[table.problem_idx], s_split]),
                     np.concatenate([table.problem_idx, s_group]))


def new_config_net(names: list[str], hidden: tuple[int, ...], norm: str) -> PerfMLP:
    """The config network on the gemm encoder's features `names` plus the flag: the gemm head's MLP,
    one input wider, its physical floor on the same column."""
    return PerfMLP(MLPConfig(len(names) + 1, tuple(hidden), norm, floor_features=floor_features(names, 1)))


def fit_config_net(rows: JointRows, names: list[str], settings: Any, epochs: int, members: int = 1,
                   logger: Any = False) -> PerfMLP:
    """The config network fitted on rows as the gemm head is on its own (train/loop.py fit_members:
    `members` seeds averaged after each one's floor, each fitted by fit_lightning on batches of whole
    groups with the regression plus within-group ranking loss). settings: TrainSettings (hidden, norm,
    lr, weight_decay, rank_weight, rank_tau, problems_per_batch, seed and the Trainer's)."""
    torch.manual_seed(settings.seed)
    return fit_members(lambda: new_config_net(names, settings.hidden, settings.norm), members, rows.x, rows.y,
                       rows.split, rows.groups, settings, logger, epochs, "config", settings.rank_weight,
                       average="after_floor")


def mode_metrics(score: np.ndarray, log_ms: np.ndarray, table: GemmTable) -> dict[str, float]:
    """summarize()'s top-1 / top-5 per dtype of a ranking score on table's rows (log_ms: the predicted
    times, for the MAPE)."""
    out = summarize(table, log_ms, score)
    return {k: v for k, v in out.items() if "/top1_eff" in k or "/top5_eff" in k or k.endswith("/problems")}




def fit_config_head(settings: Any, d: Any, logger: Any = False) -> PerfMLP:
    """The config network of a run (train/pipeline.py TrainData d, its one data folder's static rows with
    its split), `settings.gemm_members` seeds, `settings.epochs`: what fit_heads fits in place of the gemm
    head with `config_net`. ValueError for several folders or a folder without static rows."""
    if len(d.datasets) != 1:
        raise ValueError("config_net: the static rows are one device's timings; train on one data folder")
    folder = d.datasets[0].folder
    if not has_static_rows(folder):
        raise ValueError(f"config_net: {folder} has no gemm_static rows (the inductor mode's data: perfmodel gen static)")
    static = load_static(folder)
    with torch.inference_mode():
        xs = d.enc.encode(torch.from_numpy(static.problems[static.problem_idx]), torch.from_numpy(static.configs))
    rows = joint_rows(d.gemm, static, d.split, d.x, xs)
    return fit_config_net(rows, d.enc.names, settings, settings.epochs, settings.gemm_members, logger)


def inductor_figures(bundle: artifact.ModelBundle, table: GemmTable, static: GemmTable, split: np.ndarray,
                     log: Any = print) -> dict[str, Any]:
    """A config network's figures for metadata "static_metrics" (the keys the static head's had): the test
    problems (split: the model's split of table's problems) ranked on their static times by the serving
    path, with the inductor mode ("static_head") and with the autotune mode ("without"), and the static
    rows' counts."""
    t0 = time.perf_counter()
    _, prob, part = paired_split(table, static, split)
    metrics: dict[str, Any] = {"rows/train": int((part == 0).sum()), "rows/val": int((part == 1).sum()),
                               "problems/train": len(set(prob[part == 0])), "problems/val": len(set(prob[part == 1])),
                               "source": "config_net"}
    metrics.update(mode_figures(bundle, bundle.heads[artifact.INDUCTOR_GEMM], split_static(table, static, split), log,
                                "config network", ("autotune mode", "inductor mode")))
    metrics["seconds"] = time.perf_counter() - t0
    return metrics
