"""The cuBLAS call's targets and figures -- per problem, log(cuBLAS ms / the best measured Triton config's ms), below
0 cuBLAS wins (docs/model.md, "The cuBLAS call") -- and the small fit they share: the problem network's call
outputs (train/problem_head.py) are fitted and reported with them. The separate call heads they once fitted
(call, call_static) are of an older layout (perfmodel/heads/legacy.py), written by no step now. Needs no
Lightning and no MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.locations import default_model_dir
from perfmodel.model import PerfMLP

from . import evaluate as ev
from .data import GemmTable
from .loop import fit_ensemble
from .static_head import StaticHeadSettings, fit, static_outputs

CALL, CALL_STATIC = artifact.CALL, artifact.CALL_STATIC


@dataclass
class CallHeadSettings:
    model: Path = field(default_factory=default_model_dir)
    # one folder per device of the model, its default device's first; None: the folders the model was
    # trained on (its metadata's, where they exist), else the default dataset
    data: Path | tuple[Path, ...] | None = None
    # chosen on the val problems' call accuracy (mean of the two heads) among four settings: docs/model.md
    hidden: tuple[int, ...] = (64, 64)
    members: int = 5
    epochs: int = 300
    batch_rows: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.1
    huber_beta: float = 0.05
    seed: int = 0
    threads: int = 0               # torch CPU threads (0: torch's default)


def call_targets(table: GemmTable) -> tuple[np.ndarray, np.ndarray]:
    """Per problem of table: (has both times, log(cuBLAS ms / best measured Triton ms))."""
    best = np.full(len(table.problems), np.inf)
    np.minimum.at(best, table.problem_idx, table.ms)
    ok = np.isfinite(table.cublas_ms) & np.isfinite(best) & (table.cublas_ms > 0)
    y = np.where(ok, np.log(np.where(ok, table.cublas_ms, 1.0)) - np.log(np.where(ok, best, 1.0)), np.nan)
    return ok, y


def fit_call(x: torch.Tensor, y: torch.Tensor, s: CallHeadSettings, log: Any = print) -> PerfMLP:
    """The average of s.members MLPs (seeds s.seed, s.seed + 1, ...) fitted to y, as one head."""
    base = StaticHeadSettings(hidden=tuple(s.hidden), epochs=s.epochs, batch_rows=s.batch_rows, lr=s.lr,
                              weight_decay=s.weight_decay, huber_beta=s.huber_beta)
    quiet = (lambda *a: None)
    head = fit_ensemble(lambda i: fit(x, y, replace(base, seed=s.seed + i), quiet), s.members, "before_floor",
                        single_as_is=False)
    log(f"call-head: {s.members} members fitted on {len(x)} problems")
    return head


def call_scores(bundle: artifact.ModelBundle, head: PerfMLP, table: GemmTable) -> np.ndarray:
    """The call head's output per problem of table (< 0: cuBLAS wins)."""
    with torch.inference_mode():
        return head.score(bundle.encoders["cublas"].encode(torch.from_numpy(table.problems))).double().numpy()


def times_call(bundle: artifact.ModelBundle, table: GemmTable, static: PerfMLP | None = None) -> np.ndarray:
    """The call without a call head, per problem of table: the cuBLAS head's time below the gemm head's
    best predicted time over the problem's measured configs (with the static head added: static)."""
    log_ms = static_outputs(bundle, static, table)["log_ms"]
    best = np.full(len(table.problems), np.inf)
    np.minimum.at(best, table.problem_idx, log_ms)
    with torch.inference_mode():
        cub = ev.head_outputs(artifact.problem_output(bundle, "cublas"), bundle.encoders["cublas"].encode(torch.from_numpy(table.problems)))[1]
    return cub - best


def _part(table: GemmTable, keys: dict[str, int], split: np.ndarray) -> np.ndarray:
    return np.array([split[keys[k]] if k in keys else -1 for k in table.problem_keys])


def _call_figures(out: dict[str, Any], name: str, pred: np.ndarray, before: np.ndarray | None, ok: np.ndarray,
                  y: np.ndarray, part: np.ndarray) -> None:
    """A call head's figures on one device's problems, per split, into out."""
    truth = y < 0
    for split_name, which in (("train", 0), ("val", 1), ("test", 2)):
        sel = ok & (part == which)
        if not sel.any():
            continue
        out[f"{name}/{split_name}/problems"] = int(sel.sum())
        out[f"{name}/{split_name}/choice_accuracy"] = float(((pred < 0) == truth)[sel].mean())
        out[f"{name}/{split_name}/mae_log_ratio"] = float(np.abs(pred - y)[sel].mean())
        out[f"{name}/{split_name}/cublas_wins_frac"] = float(truth[sel].mean())
        if before is not None:
            out[f"{name}/{split_name}/choice_accuracy_times"] = float(((before < 0) == truth)[sel].mean())
