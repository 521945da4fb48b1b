"""`perfmodel cublas-head`: refit the cuBLAS (torch.mm) head of a model folder on every torch.mm time of
its dataset -- the GEMM problems' times, the `cublas_only` problems' (`perfmodel gen cublas-only`: every
alignment class, all four layouts, up to 1e13 FLOP) and the pad rows' unpadded times -- and rewrite the
folder with it (weights, metadata, model.onnx).

    perfmodel cublas-head --model models/h100 --data data/h100
    perfmodel cublas-head --model models/h200 --data data/h100 --data data/h200   # a model of two devices

The GEMM problems alone keep to the compile groups of the Triton sweep: few of their dims are a multiple
of 8 but not of 16, none has a column-major left operand. Those are the dims Inductor's pad_mm pass pads
to, and the layouts of a backward pass; there a head fitted to the GEMM problems alone was off by a
factor of e^0.66 on average (docs/model.md, "The cuBLAS head").

The split: GEMM problems keep the model's (split_problems with its seed; a model of several devices:
train/data.joint_split), so the held-out metrics stay comparable; the other rows are split the same way
within their own kind (stratified by dtype mode), and a row whose problem is a held-out GEMM problem's
is dropped. A model of several devices learns from each device's folder, each row encoded with its
device's spec, and the model's device_fraction thins each device's train rows as `perfmodel train` did.
The head (CublasHeadSettings: an average of `members` plain MLPs, the settings chosen on the val rows)
is fitted on the train rows, as `perfmodel train` fits it too (pipeline.fit_cublas_head). fit_cublas_head
returns the head and `cublas_head_metrics`, the fit on each kind's val and test rows beside the previous
head's where there is one (the model's default device's rows; "by_device" adds each device's), and writes
nothing (train/refit.py rewrites the folder and re-evaluates its `cublas_metrics`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.features import PAD_COLUMNS, PROBLEM_COLUMNS
from perfmodel.locations import default_model_dir
from perfmodel.model import MLPConfig, PerfMLP

from . import evaluate as ev
from .data import GemmTable, _mode, _problem_row, load_gemm, load_pad, split_problems, subsample_training
from .loop import fit_ensemble, fit_plain

KINDS = ("gemm", "cublas_only", "pad_orig")


@dataclass
class CublasHeadSettings:
    model: Path = field(default_factory=default_model_dir)
    # one folder per device of the model, its default device's first; None: the folders the model was
    # trained on (its metadata's, where they exist), else the default dataset
    data: Path | tuple[Path, ...] | None = None
    # chosen on the val rows of the three kinds (docs/model.md, "The cuBLAS head")
    hidden: tuple[int, ...] = (128, 128, 128)
    members: int = 5
    epochs: int = 150
    batch_rows: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    huber_beta: float = 0.05
    seed: int = 0
    threads: int = 0               # torch CPU threads (0: torch's default)


_FIELDS = ("problems", "log_ms", "split", "kind", "modes", "device")


@dataclass
class CublasRows:
    """torch.mm times of dataset folders: problems (P, 8) PROBLEM_COLUMNS, log ms, split 0/1/2, kind,
    dtype mode (float16 / bfloat16 / tf32 / float32), device (the folder's spec name, "" where not given)."""

    problems: np.ndarray
    log_ms: np.ndarray
    split: np.ndarray
    kind: np.ndarray
    modes: np.ndarray
    device: np.ndarray

    def select(self, mask: np.ndarray) -> "CublasRows":
        return CublasRows(*(getattr(self, f)[mask] for f in _FIELDS))

    @staticmethod
    def concat(parts: list["CublasRows"]) -> "CublasRows":
        return CublasRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


def extra_rows(folder: Path, seed: int, held_out: np.ndarray | None = None, device: str = "") -> CublasRows:
    """The folder's torch.mm times beyond its GEMM problems': `cublas_only` rows and the pad rows'
    unpadded (orig) times, each kind split by split_problems(modes, seed). held_out: problem rows
    (PROBLEM_COLUMNS) of held-out GEMM problems; a row of one of them is dropped."""
    from perfmodel.data_gen.shards import ONLY_KIND, read_dataset

    def part(problems: np.ndarray, log_ms: np.ndarray, modes: np.ndarray, kind: str) -> CublasRows:
        n = len(modes)
        return CublasRows(problems, log_ms, split_problems(modes, seed), np.full(n, kind, dtype=object), modes,
                          np.full(n, device, dtype=object))

    parts = [CublasRows(np.zeros((0, len(PROBLEM_COLUMNS))), np.zeros(0), np.zeros(0, dtype=np.int64),
                        *(np.zeros(0, dtype=object) for _ in range(3)))]
    only = [r for r in read_dataset(Path(folder), ONLY_KIND)[0] if r["status"] == "ok"]
    if only:
        parts.append(part(np.array([_problem_row(r) for r in only], dtype=np.float64), np.log([r["ms"] for r in only]),
                          np.array([_mode(r) for r in only]), "cublas_only"))
    try:
        pads = load_pad(folder)
    except FileNotFoundError:
        pads = None
    if pads is not None and len(pads.orig_ms):
        probs = pads.pads[:, [PAD_COLUMNS.index(c) for c in PROBLEM_COLUMNS]]  # the problem, unpadded
        parts.append(part(probs, np.log(pads.orig_ms), pads.modes, "pad_orig"))
    out = CublasRows.concat(parts)
    if held_out is not None and len(held_out):
        known = {tuple(r) for r in held_out.tolist()}
        out = out.select(np.array([tuple(r) not in known for r in out.problems.tolist()], dtype=bool))
    return out


def folder_rows(folder: Path, table: GemmTable, split: np.ndarray, seed: int, device: str = "") -> CublasRows:
    """Every torch.mm time of one folder (KINDS): its GEMM problems' (table, with the model's split of
    them) first, then extra_rows."""
    ok = np.isfinite(table.cublas_ms)
    n = int(ok.sum())
    gemm = CublasRows(table.problems[ok], np.log(table.cublas_ms[ok]), split[ok], np.full(n, "gemm", dtype=object),
                      table.modes[ok], np.full(n, device, dtype=object))
    return CublasRows.concat([gemm, extra_rows(folder, seed, table.problems[split > 0], device)])


def all_rows(folder: Path, seed: int, table: GemmTable | None = None) -> CublasRows:
    """Every torch.mm time of the folder of a model of one device (split_problems with the model's seed).
    table: the folder's load_gemm, when the caller has it."""
    table = load_gemm(folder) if table is None else table
    return folder_rows(folder, table, split_problems(table.modes, seed), seed)


def fit_metrics(log_pred: np.ndarray, rows: CublasRows, prefix: str = "") -> dict[str, float]:
    """Per kind and split (val, test): rows, mean |log error| and the share within 10 %."""
    out: dict[str, float] = {}
    err = np.abs(log_pred - rows.log_ms)
    for kind in KINDS:
        for name, which in (("val", 1), ("test", 2)):
            sel = (rows.kind == kind) & (rows.split == which)
            if sel.any():
                out[f"{prefix}{kind}/{name}/rows"] = int(sel.sum())
                out[f"{prefix}{kind}/{name}/mean_abs_log_err"] = float(err[sel].mean())
                out[f"{prefix}{kind}/{name}/within_10pct"] = float((np.abs(np.expm1(log_pred - rows.log_ms))[sel]
                                                                    <= 0.10).mean())
    return out


def fit_member(x: torch.Tensor, y: torch.Tensor, s: CublasHeadSettings, seed: int, floor: tuple[int, ...],
               log: Any = print) -> PerfMLP:
    """One cuBLAS head (standardised inputs, no norm layers, the physical floor on the input column
    `floor` and a learned overhead) fitted to the log ms y with smooth L1 on its floored output and
    AdamW, one-cycle."""
    torch.manual_seed(seed)
    head = PerfMLP(MLPConfig(x.shape[1], tuple(s.hidden), "none", floor_features=floor))

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch % 50 == 0 or epoch == s.epochs:
            log(f"cublas-head: seed {seed} epoch {epoch}/{s.epochs} train loss {loss:.5f}")

    return fit_plain(head, x, y, s, seed, head, on_epoch)


def fit_head(x: torch.Tensor, y: torch.Tensor, s: CublasHeadSettings, floor: tuple[int, ...],
             log: Any = print) -> PerfMLP:
    """The cuBLAS head: s.members members (seeds s.seed, s.seed + 1, ...) fitted to (x, y), averaged as one MLP."""
    return fit_ensemble(lambda i: fit_member(x, y, s, s.seed + i, floor, log), s.members, "before_floor")


def thin_extra_rows(rows: CublasRows, fractions: dict[str, float], seed: int) -> np.ndarray:
    """rows.split with each device's train rows of the kinds other than "gemm" thinned to its fraction
    (train/data.subsample_training, within each kind); the GEMM rows' split as given."""
    split = rows.split.copy()
    for kind in KINDS[1:]:
        k = rows.kind == kind
        split[k] = subsample_training(rows.split[k], rows.device[k], rows.modes[k], fractions, seed)
    return split


def check_settings(s: CublasHeadSettings) -> None:
    """ValueError naming the field of a setting out of range."""
    for name in ("epochs", "members", "batch_rows"):
        v = getattr(s, name)
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    if not s.hidden or min(s.hidden) < 1:
        raise ValueError(f"hidden: expected one or more widths >= 1, got {s.hidden}")


def model_rows(datasets: list, gemm_splits: list[np.ndarray], fractions: dict[str, float], seed: int) -> CublasRows:
    """Every torch.mm time of a model's DeviceDatasets (one per device, in its order; gemm_splits: each one's
    split of its GEMM problems), each device's train rows thinned by its fraction as `perfmodel train` did:
    the GEMM problems as the pipeline does, the other kinds within their kind."""
    rows = CublasRows.concat([folder_rows(ds.folder, ds.gemm, subsample_training(
        split, np.full(len(split), ds.device, dtype=object), ds.gemm.modes, fractions, seed), seed, ds.device)
        for ds, split in zip(datasets, gemm_splits)])
    rows.split = thin_extra_rows(rows, fractions, seed)
    return rows


def fit_cublas_head(x: torch.Tensor, rows: CublasRows, devices: list[str], s: CublasHeadSettings,
                    floor: tuple[int, ...], log: Any = print,
                    before: np.ndarray | None = None) -> tuple[PerfMLP, dict[str, Any]]:
    """The cuBLAS head fitted on rows' train rows (x: rows encoded, each with its device's spec; devices: the
    model's, its default first; floor: the physical floor's input column), and its figures on each kind's
    val and test rows, beside a previous head's log ms on the rows (before, "before/") when given. Writes
    nothing."""
    check_settings(s)
    t0 = time.perf_counter()
    counts = {k: int((rows.kind == k).sum()) for k in KINDS}
    log(f"cublas-head: {len(rows.log_ms)} torch.mm times ({', '.join(f'{k} {v}' for k, v in counts.items())})"
        + (f" of {len(devices)} devices" if len(devices) > 1 else ""))
    y = torch.from_numpy(rows.log_ms).float()
    train = torch.from_numpy(rows.split == 0)
    head = fit_head(x[train], y[train], s, floor, log)
    after = ev.head_outputs(head, x)[1]

    def figures(sel: np.ndarray) -> dict[str, Any]:
        was = {} if before is None else fit_metrics(before[sel], rows.select(sel), "before/")
        return {**fit_metrics(after[sel], rows.select(sel)), **was,
                "rows": {k: int(((rows.kind == k) & sel).sum()) for k in KINDS}}

    metrics = figures(rows.device == devices[0])
    if len(devices) > 1:
        metrics["by_device"] = {d: figures(rows.device == d) for d in devices}
    metrics["seconds"] = time.perf_counter() - t0
    for d in devices:
        _log_errors(metrics["by_device"][d] if len(devices) > 1 else metrics, d, log)
    return head, metrics


def _log_errors(m: dict[str, Any], device: str, log: Any) -> None:
    for kind in KINDS:
        k = f"{kind}/test/mean_abs_log_err"
        if k in m:
            was = (f"{m['before/' + k]:.3f} -> " if "before/" + k in m else "")
            was10 = (f"{m['before/' + kind + '/test/within_10pct']:.3f} -> " if "before/" + k in m else "")
            log(f"cublas-head: {device} {kind} test rows: mean |log error| {was}{m[k]:.3f}, within 10 %: "
                f"{was10}{m[kind + '/test/within_10pct']:.3f}")


def encode_rows(bundle: artifact.ModelBundle, rows: CublasRows) -> torch.Tensor:
    """The rows encoded for the cuBLAS head, each with its device's spec (a row of no device: the model's default)."""
    x = None
    for name in dict.fromkeys(rows.device.tolist()):
        sel = np.flatnonzero(rows.device == name)
        enc = bundle.for_device(name or bundle.spec.name).encoders["cublas"]
        with torch.inference_mode():
            part = enc.encode(torch.from_numpy(rows.problems[sel]))
        if x is None:
            x = torch.empty(len(rows.log_ms), part.shape[1], dtype=part.dtype)
        x[torch.from_numpy(sel)] = part
    return x if x is not None else torch.empty(0, len(bundle.encoders["cublas"].names))
