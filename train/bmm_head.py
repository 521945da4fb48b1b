"""`perfmodel bmm-head`: the heads of batched GEMMs (torch.bmm / baddbmm) -- Inductor's bmm template and
aten::bmm -- fitted on a dataset folder's `bmm` rows (`perfmodel gen bmm`, data_gen/bmm.py).

    perfmodel bmm-head --model models/h100 --data data/h100

Two heads, on the "bmm" and "bmm_aten" encoders (perfmodel/features.py: one matrix's gemm / cublas
features, then the batch and the whole batch's roofline, and for a config the template's grid of tiles x
batch programs in waves over the SMs):

- `bmm`: log ms of a config of Inductor's bmm template (the sweep times it as Inductor compiles it: every
  size and stride a constant), for ranking the Triton bmm configs;
- `bmm_aten`: log ms of aten::bmm (`predict_cublas`, `Candidates.cublas_ms`);
- `bmm_call`: the aten-or-Triton call, fitted to the quantity it is about -- per problem, log(aten::bmm ms /
  the best measured config's ms), on the bmm_aten features; aten::bmm wins where it is below 0. Compared
  with the two heads' times (aten's predicted time against the best ranked config's), the call was right on
  0.78 of the problems in cross-validation, below always-Triton's 0.86; the call head on 0.91.

The two time heads are averages of plain MLPs (the Triton head: smooth L1 on the floored log ms plus the
within-problem ranking term, on batches of whole problems; the aten head: smooth L1) with a learned
overhead and the physical floor on the whole batch's roofline (flops and bytes times the batch); the call
head an average of MLPs without floors, as train/call_head.py's.
The split is by shape (seeded by the model's seed, stratified by dtype mode): problems that differ only in
batch (the sweep's re-batched ones) stay in one set, so no problem and no shape is in two sets. Train
problems fit, val problems chose the settings, test problems report: top-1 / top-5 efficiency per dtype
mode (geomean of best measured time / measured time of the predicted best, or of the best of the
predicted top 5), per family, and the aten-or-Triton call. fit_bmm_heads returns the heads and their figures
and writes nothing (train/refit.py adds them to a model folder, train/recipe.py to a build). Needs no
Lightning and no MLflow.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.features import FeatureEncoder
from perfmodel.locations import default_model_dir
from perfmodel.model import MLPConfig, PerfMLP

from .bmm_data import (BmmTable, bmm_data_record, has_bmm_rows, load_bmm, load_bmm_checked,  # noqa: F401  (re-exported)
                       split_by_shape, static_table, table_from_rows)
from .bmm_figures import MODES, _log_figures, bmm_metrics, problem_figures, zero_shot_figures  # noqa: F401  (re-exported)
from .losses import within_problem_loss
from .loop import fit_ensemble, fit_plain, one_cycle

BMM, BMM_ATEN, BMM_CALL = artifact.BMM, artifact.BMM_ATEN, artifact.BMM_CALL
CV_BY = ("shape", "problem")  # what a cross-validation fold holds out


@dataclass
class BmmHeadSettings:
    model: Path = field(default_factory=default_model_dir)
    # the model's default device's dataset folder (its bmm shards); None: the folder the model's metadata
    # names, else the default dataset
    data: Path | None = None
    # chosen on the val problems (top-1 and the call; docs/model.md, "Batched GEMMs")
    hidden: tuple[int, ...] = (128, 128, 128)
    members: int = 3
    epochs: int = 100
    batch_rows: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    huber_beta: float = 0.05
    # the Triton head: smooth L1 on the floored log ms plus rank_weight x the within-problem ranking term
    # (train/losses.py, rank_tau), on batches of problems_per_batch whole problems
    rank_weight: float = 3.0
    rank_tau: float = 0.3
    problems_per_batch: int = 8
    # the folder's gemm_static rows (Inductor's mm template as Inductor compiles it, perfmodel gen static)
    # as batch-1 rows of the Triton head's training set: the bmm template is the mm template with a batch
    # dimension in its grid, and these rows cover ~1,500 more shapes
    static_rows: bool = True
    # the share of those batch-1 problems drawn (afresh, seeded) into each epoch, every bmm problem in every
    # epoch: 1.0 all of them; below 1 weighs the bmm rows more and makes an epoch cheaper
    static_share: float = 1.0
    # the bmm_aten head (aten::bmm's own time). Off, the folder serves aten::bmm's time as the call head implies it
    # (the best predicted config's time x exp(the call's output), serve.bmm.aten_ms), which is the time every
    # hook decision already used: on the 221 held-out problems (val + test, 1,200-problem fit) the head's mean
    # |log error| was 0.135 and the implied time's 0.140 (docs/model.md, "Batched GEMMs")
    aten_head: bool = False
    aten_hidden: tuple[int, ...] = (64, 64)
    aten_members: int = 5
    aten_epochs: int = 400
    call_hidden: tuple[int, ...] = (64, 64)
    call_members: int = 5
    call_epochs: int = 400
    # > 0: also cross-validate -- every problem held out once, in cv_folds folds by shape (seeded), each fold's
    # Triton head fitted with cv_members members (the others as set) -- for figures over all the problems
    # ("cv/" in the metrics)
    cv_folds: int = 0
    cv_members: int = 1
    # what a fold holds out: "shape" (every batch of a shape in one fold) or "problem" (each problem in one fold;
    # a shape's other batches may be in the training folds)
    cv_by: str = "shape"
    seed: int = 0
    threads: int = 0               # torch CPU threads (0: torch's default)


def new_head(n_inputs: int, hidden: tuple[int, ...], seed: int, floor: int) -> PerfMLP:
    """An MLP (no norm layers, a learned overhead, the physical floor on input column floor)."""
    torch.manual_seed(seed)
    return PerfMLP(MLPConfig(n_inputs, tuple(hidden), "none", floor_features=(floor,)))


def fit_aten(x: torch.Tensor, y: torch.Tensor, s: BmmHeadSettings, seed: int, floor: int) -> PerfMLP:
    """One aten::bmm member fitted to the log ms y with smooth L1 on its floored output (fit_plain)."""
    plain = type("S", (), {"lr": s.lr, "weight_decay": s.weight_decay, "batch_rows": s.batch_rows,
                           "huber_beta": s.huber_beta, "epochs": s.aten_epochs})
    head = new_head(x.shape[1], s.aten_hidden, seed, floor)
    return fit_plain(head, x, y, plain, seed, head)


def fit_call(x: torch.Tensor, y: torch.Tensor, s: BmmHeadSettings, seed: int) -> PerfMLP:
    """One call member: an MLP without floors fitted so that its score matches y (log aten / best Triton)."""
    torch.manual_seed(seed)
    head = PerfMLP(MLPConfig(x.shape[1], tuple(s.call_hidden), "none", floor_features=(-1,), learn_overhead=False,
                             init_overhead_ms=1e-9))
    plain = type("S", (), {"lr": s.lr, "weight_decay": s.weight_decay, "batch_rows": s.batch_rows,
                           "huber_beta": s.huber_beta, "epochs": s.call_epochs})
    return fit_plain(head, x, y, plain, seed, head.score)


def call_targets(table: BmmTable) -> tuple[np.ndarray, np.ndarray]:
    """Per problem: (has both an aten::bmm and a Triton time, log(aten ms / best measured Triton ms))."""
    best = np.full(len(table.problems), np.inf)
    np.minimum.at(best, table.problem_idx, table.ms)
    ok = np.isfinite(table.aten_ms) & np.isfinite(best)
    return ok, np.where(ok, np.log(np.where(ok, table.aten_ms, 1.0)) - np.log(np.where(ok, best, 1.0)), np.nan)


def score(head: PerfMLP, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return head.eval().score(x).double().numpy().reshape(-1)


def fit_ranked(x: torch.Tensor, y: torch.Tensor, group: np.ndarray, s: BmmHeadSettings, seed: int,
               floor: int, static_from: int | None = None) -> PerfMLP:
    """One Triton member (inputs standardised on x) fitted on batches of s.problems_per_batch whole problems
    (group: each row's problem): smooth L1 on the floored log ms plus s.rank_weight x within_problem_loss on
    the score; AdamW, one cycle over s.epochs epochs, shuffled by seed. Groups >= static_from are the batch-1
    static problems: each epoch draws s.static_share of them (all where None or 1.0)."""
    head = new_head(x.shape[1], s.hidden, seed, floor)
    head.set_normalisation(x.mean(0), x.std(0))
    head.train()
    order = np.argsort(group, kind="stable")
    cuts = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1], True])
    rows = [torch.from_numpy(order[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]   # each problem's rows
    ids = group[order][cuts[:-1]]
    aux = np.flatnonzero(ids >= static_from) if static_from is not None and s.static_share < 1.0 else np.zeros(0, int)
    main = np.setdiff1d(np.arange(len(rows)), aux)
    drawn = round(s.static_share * len(aux))
    steps = math.ceil((len(main) + drawn) / s.problems_per_batch)
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    sched = one_cycle(opt, s.lr, s.epochs * steps)
    rng = np.random.default_rng(seed)
    for _ in range(s.epochs):
        perm = rng.permutation(len(rows)) if not len(aux) else \
            rng.permutation(np.concatenate([main, rng.choice(aux, drawn, replace=False)]))
        for i in range(steps):
            batch = [rows[j] for j in perm[i * s.problems_per_batch:(i + 1) * s.problems_per_batch]]
            idx = torch.cat(batch)
            inv = torch.cat([torch.full((len(r),), k) for k, r in enumerate(batch)])
            xb, yb = x[idx], y[idx]
            z = head.score(xb)
            loss = torch.nn.functional.smooth_l1_loss(head.floor(z, xb).reshape(-1), yb, beta=s.huber_beta)
            if s.rank_weight > 0:
                loss = loss + s.rank_weight * within_problem_loss(z.reshape(-1), yb, inv, s.rank_tau)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return head.eval()


def encode(table: BmmTable, spec: Any, version: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the Triton rows' bmm features, every problem's bmm_aten features)."""
    with torch.inference_mode():
        x = FeatureEncoder(spec, "bmm", version).encode(torch.from_numpy(table.problems[table.problem_idx]),
                                                         torch.from_numpy(table.configs))
        xa = FeatureEncoder(spec, "bmm_aten", version).encode(torch.from_numpy(table.problems))
    return x, xa


def floor_column(kind: str, spec: Any, version: int) -> int:
    return FeatureEncoder(spec, kind, version).names.index("log_bmm_roofline_ms")


def fit_bmm_heads(table: BmmTable, split: np.ndarray, spec: Any, version: int, s: BmmHeadSettings,
                  log: Any = print, extra: BmmTable | None = None,
                  others: Sequence[tuple[BmmTable, np.ndarray, Any]] = ()) -> tuple[dict[str, PerfMLP], dict[str, Any]]:
    """The bmm and bmm_aten heads fitted on the train problems (split: per problem of table) for device spec
    (encoder version), the Triton head also on every row of extra (static_table's batch-1 rows) where
    s.static_rows; and their figures per split of table. others: more devices' (table, split, spec), whose
    train problems join the fit encoded for their device (a model of several devices), their figures under
    metrics["devices"][spec.name]. Writes nothing."""
    check_settings(s)
    t0 = time.perf_counter()
    parts = [(table, split, spec)] + list(others)
    enc = [encode(t, sp, version) for t, _, sp in parts]
    xt, yt, group, xc, yc_t, xat, yat = [], [], [], [], [], [], []
    offset = 0
    for (t, sp, _), (xd, xad) in zip(parts, enc):
        tr = sp[t.problem_idx] == 0
        xt.append(xd[torch.from_numpy(tr)])
        yt.append(torch.from_numpy(np.log(t.ms[tr])).float())
        group.append(t.problem_idx[tr] + offset)
        offset += len(t.problems)
        ok, yc = call_targets(t)
        trc = torch.from_numpy(ok & (sp == 0))
        xc.append(xad[trc])
        yc_t.append(torch.from_numpy(yc).float()[trc])
        tra = torch.from_numpy((sp == 0) & np.isfinite(t.aten_ms))
        xat.append(xad[tra])
        yat.append(torch.from_numpy(np.log(t.aten_ms)).float()[tra])
    extra_rows = 0
    if extra is not None and s.static_rows:
        extra_rows = len(extra.ms)
        xt.append(encode(extra, spec, version)[0])
        yt.append(torch.from_numpy(np.log(extra.ms)).float())
        group.append(extra.problem_idx + offset)
    static_from = offset if extra_rows else None
    xt, yt, group = torch.cat(xt), torch.cat(yt), np.concatenate(group)
    xc, yc_t, xat, yat = torch.cat(xc), torch.cat(yc_t), torch.cat(xat), torch.cat(yat)
    for t, sp, dev in parts:
        log(f"bmm-head: {dev.name}: {len(t.problems)} problems ({int((sp == 0).sum())} train), {len(t.ms)} Triton "
            f"rows ({int((sp[t.problem_idx] == 0).sum())} train), {int(np.isfinite(t.aten_ms).sum())} aten::bmm times")
    log(f"bmm-head: + {extra_rows} batch-1 static rows")
    f, fa = floor_column("bmm", spec, version), floor_column("bmm_aten", spec, version)
    head = fit_ensemble(lambda i: fit_ranked(xt, yt, group, s, s.seed + i, f, static_from), s.members, "before_floor")
    aten = fit_ensemble(lambda i: fit_aten(xat, yat, s, s.seed + i, fa), s.aten_members, "before_floor") \
        if s.aten_head else None
    call = fit_ensemble(lambda i: fit_call(xc, yc_t, s, s.seed + i), s.call_members, "before_floor", single_as_is=False)
    figures = []
    for (t, sp, _), (xd, xad) in zip(parts, enc):
        pred, pred_call = predict_log_ms(head, xd), score(call, xad)
        pred_aten = predict_log_ms(aten, xad) if aten is not None else implied_aten_log_ms(t, pred, pred_call)
        figures.append(bmm_metrics(t, sp, pred, pred_aten, pred_call))
    metrics = figures[0]
    if others:
        metrics["devices"] = {dev.name: m for (_, _, dev), m in zip(parts[1:], figures[1:])}
    metrics["static_rows"] = extra_rows
    metrics["aten_head"] = aten is not None
    metrics["seconds"] = time.perf_counter() - t0
    _log_figures(metrics, log)
    for (_, _, dev), m in zip(parts[1:], figures[1:]):
        _log_figures(m, lambda t, d=dev.name: log(t.replace("bmm-head: ", f"bmm-head: {d}: ", 1)))
    return {BMM: head, BMM_CALL: call, **({BMM_ATEN: aten} if aten is not None else {})}, metrics


def other_device_split(base: BmmTable, base_split: np.ndarray, other: BmmTable, seed: int) -> np.ndarray:
    """Another device's problems' split: each shape (the problem's columns but the batch) in the set the base
    device's split puts it in, so that no held-out shape is fitted on either device; shapes the base device
    has none of, split_by_shape of other's."""
    where = {tuple(p[:-1]): sp for p, sp in zip(base.problems.tolist(), base_split.tolist())}
    own = split_by_shape(other, seed)
    return np.array([where.get(tuple(p[:-1]), o) for p, o in zip(other.problems.tolist(), own.tolist())])


def implied_aten_log_ms(table: BmmTable, pred: np.ndarray, pred_call: np.ndarray) -> np.ndarray:
    """Per problem, aten::bmm's log ms as the call head implies it: the best predicted log ms of the problem's
    timed configs (pred, per Triton row) plus the call's output (pred_call, per problem); inf where a problem
    has no Triton row."""
    best = np.full(len(table.problems), np.inf)
    np.minimum.at(best, table.problem_idx, pred)
    return best + pred_call


def predict_log_ms(head: PerfMLP, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return head.eval()(x).double().numpy().reshape(-1)


def check_settings(s: BmmHeadSettings) -> None:
    """ValueError naming the field of a setting out of range."""
    for name in ("epochs", "members", "batch_rows", "aten_members", "aten_epochs", "problems_per_batch", "cv_members",
                 "call_members", "call_epochs"):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
    if isinstance(s.cv_folds, bool) or not isinstance(s.cv_folds, int) or s.cv_folds < 0 or s.cv_folds == 1:
        raise ValueError(f"cv_folds: must be 0 (none) or an int >= 2, got {s.cv_folds!r}")
    if s.cv_by not in CV_BY:
        raise ValueError(f"cv_by: must be one of {CV_BY}, got {s.cv_by!r}")
    if isinstance(s.rank_weight, bool) or not s.rank_weight >= 0:
        raise ValueError(f"rank_weight: must be >= 0, got {s.rank_weight!r}")
    if isinstance(s.static_share, bool) or not 0.0 < s.static_share <= 1.0:
        raise ValueError(f"static_share: must be in (0, 1], got {s.static_share!r}")
    for name in ("hidden", "aten_hidden", "call_hidden"):
        if not getattr(s, name) or min(getattr(s, name)) < 1:
            raise ValueError(f"{name}: expected one or more widths >= 1, got {getattr(s, name)}")


def shape_folds(table: BmmTable, folds: int, seed: int, by: str = "shape") -> np.ndarray:
    """Per problem, its fold (0 .. folds - 1): the shapes dealt out round-robin in a seeded order within each
    dtype mode, each problem in its shape's fold; by="problem": the problems themselves dealt out so."""
    if by == "problem":
        unit, first = np.arange(len(table.problems)), np.arange(len(table.problems))
    else:
        unit, first = table.shape, np.unique(table.shape, return_index=True)[1]
    modes = table.modes[first]
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(first), dtype=np.int64)
    for mode in np.unique(modes):
        idx = rng.permutation(np.flatnonzero(modes == mode))
        fold[idx] = np.arange(len(idx)) % folds
    return fold[unit]


def cross_validate(table: BmmTable, spec: Any, version: int, s: BmmHeadSettings, seed: int,
                   extra: BmmTable | None = None, log: Any = print) -> dict[str, Any]:
    """bmm_metrics with every problem held out once: s.cv_folds folds by shape (by problem where s.cv_by says so;
    shape_folds with seed), each fold's heads (s.cv_members members) fitted on the other folds' problems (and
    extra); "cv/" figures."""
    fold = shape_folds(table, s.cv_folds, seed, s.cv_by)
    pred, pred_aten, pred_call = np.zeros(len(table.ms)), np.zeros(len(table.problems)), np.zeros(len(table.problems))
    one = replace(s, members=s.cv_members)  # the Triton head's members: the costly fits
    x, xa = encode(table, spec, version)
    for f in range(s.cv_folds):
        held = fold == f
        heads, _ = fit_bmm_heads(table, np.where(held, 2, 0), spec, version, one, lambda *a: None, extra)
        rows = held[table.problem_idx]
        pred[rows] = predict_log_ms(heads[BMM], x[torch.from_numpy(rows)])
        if BMM_ATEN in heads:
            pred_aten[held] = predict_log_ms(heads[BMM_ATEN], xa[torch.from_numpy(held)])
        pred_call[held] = score(heads[BMM_CALL], xa[torch.from_numpy(held)])
        log(f"bmm-head: cross-validation fold {f + 1}/{s.cv_folds} ({int(held.sum())} problems held out)")
    if not s.aten_head:
        pred_aten = implied_aten_log_ms(table, pred, pred_call)
    m = bmm_metrics(table, np.full(len(table.problems), 2), pred, pred_aten, pred_call)
    out = {"cv/" + k.removeprefix("test/"): v for k, v in m.items()}
    out.update({"cv/folds": s.cv_folds, "cv/members": s.cv_members, "cv/by": s.cv_by})
    _log_figures({k.replace("cv/", "test/", 1): v for k, v in out.items()}, lambda t: log(t.replace("test", "cv", 1)))
    return out


