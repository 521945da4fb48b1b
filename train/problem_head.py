"""`perfmodel problem-head`: the problem network, one MLP on the cuBLAS head's problem features in place of
three heads -- the cuBLAS head (torch.mm's log ms) and the call heads (log(cuBLAS ms / the best Triton
config's ms), per kernel mode) -- with one output each (docs/model.md, "The problem network").

    perfmodel problem-head --model models/h100 --data data/h100

Its rows are every torch.mm time the cuBLAS head learns from (train/cublas_head.py: the GEMM problems', the
`cublas_only` problems', the pad rows' unpadded times) with the call targets of the GEMM problems
(train/call_head.py: against the dataset's Triton times, and against the static times where the folder has
`gemm_static` rows); a target a row does not have is missing (NaN) and masked out of the loss
(train/loop.masked_smooth_l1: per output the smooth L1 over its rows with a target, summed). The cuBLAS
output is fitted after its floors (the overhead and the physical floor, as the cuBLAS head), the call
outputs before them (their score is what is served). The split is the cuBLAS head's: the GEMM problems keep
the model's, the other rows are split within their kind, a row of a held-out GEMM problem is dropped.

fit_problem_head returns the head and its figures -- `cublas_head_metrics` and `call_metrics` with the
keys the separate heads report, so the two layouts compare key by key -- and writes nothing
(train/refit.py adds it to a model folder, train/recipe.py to a build). Needs no Lightning and no MLflow.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.model import MLPConfig, PerfMLP, floor_features

from . import evaluate as ev
from .call_head import _call_figures, _part, call_scores, call_targets, times_call
from .cublas_head import CublasHeadSettings, CublasRows, check_settings, extra_rows, fit_metrics, thin_extra_rows
from .data import subsample_training
from .loop import fit_ensemble, fit_plain
from .static_head import has_static_rows, load_static

PROBLEM, CALL, CALL_STATIC = artifact.PROBLEM, artifact.CALL, artifact.CALL_STATIC


@dataclass
class ProblemHeadSettings(CublasHeadSettings):
    """The problem network's settings: the cuBLAS head's fields, width and fit (docs/model.md, "The problem
    network": chosen on the val rows); checked by cublas_head.check_settings."""


def problem_outputs(datasets: list, inductor_mode: bool = True) -> tuple[str, ...]:
    """The outputs of a problem network fitted on datasets: cublas and call, and call_static where the model
    serves kernel="inductor" (inductor_mode: a config network or an inductor head) and every folder has static
    rows. A model without that mode reads no static rows here, so adding them to its data changes nothing a
    rebuild of it fits."""
    static = inductor_mode and all(has_static_rows(ds.folder) for ds in datasets)
    return artifact.PROBLEM_OUTPUTS if static else artifact.PROBLEM_OUTPUTS[:2]


def _gemm_targets(ds: Any, outputs: tuple[str, ...]) -> np.ndarray:
    """(P, len(outputs)) targets of ds's GEMM problems, NaN where missing: log cuBLAS ms, then the call
    targets (call_static's from the folder's static rows, by problem key)."""
    table = ds.gemm
    y = np.full((len(table.problems), len(outputs)), np.nan)
    ok = np.isfinite(table.cublas_ms) & (table.cublas_ms > 0)
    y[ok, 0] = np.log(table.cublas_ms[ok])
    ok1, y1 = call_targets(table)
    y[ok1, 1] = y1[ok1]
    if CALL_STATIC in outputs:
        keys = {k: i for i, k in enumerate(table.problem_keys)}
        st = load_static(ds.folder)
        ok2, y2 = call_targets(st)
        for j, key in enumerate(st.problem_keys):
            if ok2[j] and key in keys:
                y[keys[key], 2] = y2[j]
    return y


def problem_rows(datasets: list, gemm_splits: list[np.ndarray], fractions: dict[str, float], seed: int,
                 outputs: tuple[str, ...]) -> tuple[CublasRows, np.ndarray]:
    """(rows, targets): every torch.mm time of the datasets and every GEMM problem with a call target (rows:
    CublasRows, log_ms the cuBLAS target, NaN where none), targets (N, len(outputs)) NaN where missing.
    The GEMM problems keep gemm_splits (each device's train problems thinned by its fraction), the other
    rows are split within their kind, a row of a held-out GEMM problem dropped (cublas_head.model_rows)."""
    parts, ys = [], []
    for ds, split in zip(datasets, gemm_splits):
        table = ds.gemm
        n = len(table.problems)
        dev = np.full(n, ds.device, dtype=object)
        y = _gemm_targets(ds, outputs)
        keep = np.isfinite(y).any(1)
        thinned = subsample_training(split, dev, table.modes, fractions, seed)
        gemm = CublasRows(table.problems, y[:, 0], thinned, np.full(n, "gemm", dtype=object), table.modes, dev)
        extra = extra_rows(ds.folder, seed, table.problems[split > 0], ds.device)
        ey = np.full((len(extra.log_ms), len(outputs)), np.nan)
        ey[:, 0] = extra.log_ms
        parts += [gemm.select(keep), extra]
        ys += [y[keep], ey]
    rows = CublasRows.concat(parts)
    rows.split = thin_extra_rows(rows, fractions, seed)
    return rows, np.concatenate(ys)


def fit_member(x: torch.Tensor, y: torch.Tensor, s: ProblemHeadSettings, seed: int, floor: int,
               log: Any = print) -> PerfMLP:
    """One problem network (standardised inputs, no norm layers; the first output floored by the overhead
    and the physical floor on input column `floor`) fitted to y (N, k) with the masked smooth L1: the
    first output after its floors, the others before (their score)."""
    torch.manual_seed(seed)
    k = y.shape[1]
    head = PerfMLP(MLPConfig(x.shape[1], tuple(s.hidden), "none", n_outputs=k, floor_features=(floor,) + (-1,) * (k - 1)))

    def forward(rows: torch.Tensor) -> torch.Tensor:
        z = head.score(rows)
        return torch.cat([head.floor(z, rows)[:, :1], z[:, 1:]], 1)

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch % 50 == 0 or epoch == s.epochs:
            log(f"problem-head: seed {seed} epoch {epoch}/{s.epochs} train loss {loss:.5f}")

    return fit_plain(head, x, y, s, seed, forward, on_epoch, loss="masked_smooth_l1")


def encode(bundle: artifact.ModelBundle, rows: CublasRows) -> torch.Tensor:
    """rows encoded with the cuBLAS features, each with its device's spec."""
    from .cublas_head import encode_rows

    return encode_rows(bundle, rows)


def fit_problem_head(bundle: artifact.ModelBundle, datasets: list, splits: list[np.ndarray], s: ProblemHeadSettings,
                     fractions: dict[str, float] | None = None, seed: int = 0, log: Any = print
                     ) -> tuple[PerfMLP, dict[str, Any]]:
    """The problem network of bundle, fitted on the train rows of datasets (DeviceDatasets, one per device of
    the model in its order; splits: each one's split of its GEMM problems; fractions: each device's
    device_fraction; seed: the model's split seed), and its figures: {"outputs", "cublas_head_metrics",
    "call_metrics", "seconds"}, the cuBLAS figures beside the bundle's cuBLAS output before it where it has
    one ("before/"). Writes nothing."""
    check_settings(s)
    t0 = time.perf_counter()
    inductor_mode = artifact.inductor_head(bundle.heads) is not None
    outputs = problem_outputs(datasets, inductor_mode)
    if inductor_mode and any(has_static_rows(ds.folder) for ds in datasets) and CALL_STATIC not in outputs:
        log(f"problem-head: not every device's folder has static rows: no {CALL_STATIC} output")
    rows, y = problem_rows(datasets, splits, fractions or {}, seed, outputs)
    x = encode(bundle, rows)
    train = torch.from_numpy(rows.split == 0)
    if not bool(train.any()):
        raise ValueError(f"data: {', '.join(str(ds.folder) for ds in datasets)} has no train row")
    counts = {k: int((rows.kind == k).sum()) for k in ("gemm", "cublas_only", "pad_orig")}
    log(f"problem-head: {len(rows.kind)} rows ({', '.join(f'{k} {v}' for k, v in counts.items())}), outputs "
        f"{', '.join(outputs)}, targets per output {np.isfinite(y[rows.split == 0]).sum(0).tolist()} (train)")
    yt = torch.from_numpy(y).float()
    floor = floor_features(bundle.encoders["cublas"].names, 1)[0]
    head = fit_ensemble(lambda i: fit_member(x[train], yt[train], s, s.seed + i, floor, log), s.members,
                        "before_floor")
    was = artifact.problem_output(bundle, "cublas")
    before = None if was is None else ev.head_outputs(was, x)[1]
    metrics = {"outputs": list(outputs), **problem_figures(bundle, head, outputs, datasets, splits, rows, x, before)}
    metrics["seconds"] = time.perf_counter() - t0
    return head, metrics


def with_problem_head(bundle: artifact.ModelBundle, head: PerfMLP, outputs: tuple[str, ...]) -> artifact.ModelBundle:
    """A copy of bundle serving head as its problem network (in place of any it had)."""
    heads = {**bundle.heads, PROBLEM: head}
    encoders = {**bundle.encoders, PROBLEM: bundle.encoders["cublas"]}  # the problem features, by their kind too
    return artifact.ModelBundle(bundle.spec, heads, encoders, {**bundle.metadata, "problem_outputs": list(outputs)},
                                bundle.config_net)


def problem_figures(bundle: artifact.ModelBundle, head: PerfMLP, outputs: tuple[str, ...], datasets: list,
                    splits: list[np.ndarray], rows: CublasRows, x: torch.Tensor,
                    before: np.ndarray | None) -> dict[str, Any]:
    """The problem network's figures in the separate heads' keys: cublas_head_metrics (each kind's val and
    test rows, train/cublas_head.fit_metrics) and call_metrics (each call output per split,
    train/call_head.py's figures); the model's default device's, "by_device" each device's for several."""
    devices = [ds.device for ds in datasets]
    after = ev.head_outputs(head, x)[1][:, 0]
    has = np.isfinite(rows.log_ms)

    def cublas(sel: np.ndarray) -> dict[str, Any]:
        sel = sel & has
        was = {} if before is None else fit_metrics(before[sel], rows.select(sel), "before/")
        return {**fit_metrics(after[sel], rows.select(sel)), **was,
                "rows": {k: int(((rows.kind == k) & sel).sum()) for k in ("gemm", "cublas_only", "pad_orig")}}

    served = with_problem_head(bundle, head, outputs)
    static = artifact.inductor_mode(bundle.heads)  # the static head, or a config network's inductor mode
    by_device: dict[str, dict[str, Any]] = {d: {} for d in devices}
    for name in outputs[1:]:
        view = artifact.problem_output(served, name)
        for ds, split in zip(datasets, splits):
            b = served.for_device(ds.device)
            tab = ds.gemm if name == CALL else load_static(ds.folder)
            ok, y = call_targets(tab)
            keys = {k: i for i, k in enumerate(ds.gemm.problem_keys)}
            pred = call_scores(b, view, tab)
            # the call without a call output: the cuBLAS time below the gemm head's best -- with the static head
            # added for the inductor-mode call only, as train/call_head.py's baselines
            was = times_call(b, tab, None) if name == CALL else (
                times_call(b, tab, static) if static is not None else None)
            _call_figures(by_device[ds.device], name, pred, was, ok, y, _part(tab, keys, split))
    cub = cublas(rows.device == devices[0])
    call = dict(by_device[devices[0]])
    if len(devices) > 1:
        cub["by_device"] = {d: cublas(rows.device == d) for d in devices}
        call["by_device"] = by_device
    return {"cublas_head_metrics": cub, "call_metrics": call}
