"""`perfmodel call-head`: the cuBLAS call heads, which say whether cuBLAS (torch.mm) beats the best Triton
config of a problem's config space -- the call behind `Candidates.prefer_cublas` (docs/model.md, "The
cuBLAS call").

    perfmodel call-head --model models/h100 --data data/h100
    perfmodel call-head --model models/h200 --data data/h100 --data data/h200   # a model of two devices

Comparing the cuBLAS head's time with the gemm head's best predicted time gets the call wrong where the
two are close, and the minimum of many predicted times is biased low. A call head is fitted to the quantity
the call is about instead: per problem, log(cuBLAS ms / the best measured Triton config's ms), on the
problem features of the cuBLAS head; cuBLAS wins where its output is below 0. Two heads, one per kernel
mode (docs/design.md, "Kernel modes"):

- `call`: against the dataset's Triton times (`kernel="autotune"`);
- `call_static`: against the same problems' static times (the `gemm_static` rows, with torch.mm timed in
  the same run; `kernel="inductor"`), when the folder has them.

Each is the average of `members` small MLPs of different seeds. The split is the model's (split_problems
with its seed): train problems fit, validation problems chose the settings, test problems report, beside
the call the model made before (cuBLAS head against the gemm head's best). A model of several devices
learns from each device's folder (its joint split; each problem encoded with its device's spec) and
reports each device's figures ("by_device"); `call_static` is fitted only when every folder has static
rows. fit_call_heads returns the heads and their figures and writes nothing (train/refit.py adds them to
a model folder, train/recipe.py to a build). Needs no Lightning and no MLflow.
"""
from __future__ import annotations

import time
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
from .static_head import StaticHeadSettings, fit, has_static_rows, load_static, static_outputs

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


def fit_call_heads(bundle: artifact.ModelBundle, datasets: list, splits: list[np.ndarray], s: CallHeadSettings,
                   log: Any = print) -> tuple[dict[str, PerfMLP], dict[str, Any]]:
    """The call heads of bundle ({CALL: head} and CALL_STATIC where every dataset has static rows), fitted
    on the train problems of datasets (DeviceDatasets, one per device of the model in its order; splits:
    each one's split of its GEMM problems), and their figures per split (metrics of the model's default
    device, "by_device" each device's for several). Writes nothing."""
    if s.members < 1:
        raise ValueError(f"members: must be >= 1, got {s.members}")
    t0 = time.perf_counter()
    names = [CALL]
    if all(has_static_rows(ds.folder) for ds in datasets):
        names.append(CALL_STATIC)
    elif any(has_static_rows(ds.folder) for ds in datasets):
        log(f"call-head: not every device's folder has static rows: no {CALL_STATIC} head")
    by_device: dict[str, dict[str, Any]] = {ds.device: {} for ds in datasets}
    heads = {}
    for name in names:
        heads[name] = _fit_one(bundle, datasets, splits, name, s, by_device, log)
    metrics: dict[str, Any] = dict(by_device[datasets[0].device])
    if len(datasets) > 1:
        metrics["by_device"] = by_device
    metrics["seconds"] = time.perf_counter() - t0
    return heads, metrics


def _fit_one(bundle: artifact.ModelBundle, datasets: list, splits: list[np.ndarray], name: str, s: CallHeadSettings,
             by_device: dict[str, dict[str, Any]], log: Any) -> PerfMLP:
    """One call head (name: CALL or CALL_STATIC) fitted on every device's train problems; its figures into
    by_device."""
    # the static head, or a config network's inductor mode
    static = artifact.inductor_mode(bundle.heads) if name == CALL_STATIC else None
    parts = []  # per device: (device bundle, table, has both times, target, split)
    for ds, split in zip(datasets, splits):
        tab = ds.gemm if name == CALL else load_static(ds.folder)
        keys = {k: i for i, k in enumerate(ds.gemm.problem_keys)}
        ok, y = call_targets(tab)
        parts.append((bundle.for_device(ds.device), tab, ok, y, _part(tab, keys, split)))
    with torch.inference_mode():
        xs = [b.encoders["cublas"].encode(torch.from_numpy(tab.problems)) for b, tab, *_ in parts]
    train = [ok & (part == 0) for _, _, ok, _, part in parts]
    if not any(t.any() for t in train):
        raise ValueError(f"data: {', '.join(str(ds.folder) for ds in datasets)} has no train problem with both "
                         f"cuBLAS and Triton times for {name}")
    x = torch.cat([xi[torch.from_numpy(t)] for xi, t in zip(xs, train)])
    y_train = torch.from_numpy(np.concatenate([y[t] for (_, _, _, y, _), t in zip(parts, train)])).float()
    head = fit_call(x, y_train, s, log)
    for ds, (b, tab, ok, y, part) in zip(datasets, parts):
        pred = call_scores(b, head, tab)
        before = times_call(b, tab, static) if (name == CALL or static is not None) else None
        _call_figures(by_device[ds.device], name, pred, before, ok, y, part)
    for ds in datasets:
        m = by_device[ds.device]
        t = f"{name}/test/"
        if t + "choice_accuracy" in m:
            was = m.get(t + "choice_accuracy_times")
            log(f"call-head: {name}{f' ({ds.device})' if len(datasets) > 1 else ''}: test problems' cuBLAS call "
                f"right on {m[t + 'choice_accuracy']:.4f}"
                + (f" (cuBLAS head against the gemm head's best: {was:.4f})" if was is not None else ""))
    return head


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
