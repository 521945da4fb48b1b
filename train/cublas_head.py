"""`perfmodel cublas-head`: refit the cuBLAS (torch.mm) head of a model folder on every torch.mm time of
its dataset -- the GEMM problems' times, the `cublas_only` problems' (`perfmodel gen cublas-only`: every
alignment class, all four layouts, up to 1e13 FLOP) and the pad rows' unpadded times -- and rewrite the
folder with it (weights, metadata, model.onnx).

    perfmodel cublas-head --model models/h100 --data data/h100

The GEMM problems alone keep to the compile groups of the Triton sweep: few of their dims are a multiple
of 8 but not of 16, none has a column-major left operand. Those are the dims Inductor's pad_mm pass pads
to, and the layouts of a backward pass; there a head fitted to the GEMM problems alone was off by a
factor of e^0.66 on average (docs/model.md, "The cuBLAS head").

The split: GEMM problems keep the model's (split_problems with its seed), so the held-out metrics stay
comparable; the other rows are split the same way within their own kind (stratified by dtype mode), and
a row whose problem is a held-out GEMM problem's is dropped. The head (CublasHeadSettings: an average
of `members` plain MLPs, the settings chosen on the val rows) is fitted on the train rows, as `perfmodel
train` fits it too (pipeline.fit_cublas_head); the metadata's `cublas_metrics` are re-evaluated, and
`cublas_head_metrics` gives the fit on each kind's val and test rows beside the previous head's.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.features import PAD_COLUMNS, PROBLEM_COLUMNS
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.model import PerfMLP

from .data import GemmTable, _mode, _problem_row, load_gemm, load_pad, split_problems

KINDS = ("gemm", "cublas_only", "pad_orig")


@dataclass
class CublasHeadSettings:
    model: Path = field(default_factory=default_model_dir)
    data: Path = field(default_factory=default_data_dir)
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


@dataclass
class CublasRows:
    """torch.mm times of one dataset folder: problems (P, 8) PROBLEM_COLUMNS, log ms, split 0/1/2, kind,
    dtype mode (float16 / bfloat16 / tf32 / float32)."""

    problems: np.ndarray
    log_ms: np.ndarray
    split: np.ndarray
    kind: np.ndarray
    modes: np.ndarray

    def select(self, mask: np.ndarray) -> "CublasRows":
        return CublasRows(self.problems[mask], self.log_ms[mask], self.split[mask], self.kind[mask], self.modes[mask])

    @staticmethod
    def concat(parts: list["CublasRows"]) -> "CublasRows":
        return CublasRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                            ("problems", "log_ms", "split", "kind", "modes")))


def extra_rows(folder: Path, seed: int, held_out: np.ndarray | None = None) -> CublasRows:
    """The folder's torch.mm times beyond its GEMM problems': `cublas_only` rows and the pad rows'
    unpadded (orig) times, each kind split by split_problems(modes, seed). held_out: problem rows
    (PROBLEM_COLUMNS) of held-out GEMM problems; a row of one of them is dropped."""
    from perfmodel.data_gen.cublas_sweep import ONLY_KIND
    from perfmodel.data_gen.shards import read_dataset

    def part(problems: np.ndarray, log_ms: np.ndarray, modes: np.ndarray, kind: str) -> CublasRows:
        return CublasRows(problems, log_ms, split_problems(modes, seed), np.full(len(modes), kind, dtype=object),
                          modes)

    parts = [CublasRows(np.zeros((0, len(PROBLEM_COLUMNS))), np.zeros(0), np.zeros(0, dtype=np.int64),
                        np.zeros(0, dtype=object), np.zeros(0, dtype=object))]
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


def all_rows(folder: Path, seed: int, table: GemmTable | None = None) -> CublasRows:
    """Every torch.mm time of the folder (KINDS), for the cuBLAS head: the GEMM problems' (the model's
    split) first. table: the folder's load_gemm, when the caller has it."""
    table = load_gemm(folder) if table is None else table
    split = split_problems(table.modes, seed)
    ok = np.isfinite(table.cublas_ms)
    gemm = CublasRows(table.problems[ok], np.log(table.cublas_ms[ok]), split[ok],
                      np.full(int(ok.sum()), "gemm", dtype=object), table.modes[ok])
    return CublasRows.concat([gemm, extra_rows(folder, seed, table.problems[split > 0])])


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
    from perfmodel.model import MLPConfig

    from .static_head import fit_plain

    torch.manual_seed(seed)
    head = PerfMLP(MLPConfig(x.shape[1], tuple(s.hidden), "none", floor_features=floor))

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch % 50 == 0 or epoch == s.epochs:
            log(f"cublas-head: seed {seed} epoch {epoch}/{s.epochs} train loss {loss:.5f}")

    return fit_plain(head, x, y, s, seed, head, on_epoch)


def fit_head(x: torch.Tensor, y: torch.Tensor, s: CublasHeadSettings, floor: tuple[int, ...],
             log: Any = print) -> PerfMLP:
    """The cuBLAS head: s.members members (seeds s.seed, s.seed + 1, ...) fitted to (x, y), averaged as one MLP."""
    members = [fit_member(x, y, s, s.seed + i, floor, log) for i in range(s.members)]
    return members[0] if len(members) == 1 else PerfMLP.ensemble(members, "before_floor")


def run(s: CublasHeadSettings, log: Any = print) -> dict[str, Any]:
    """Refit the cuBLAS head of s.model on every torch.mm time of s.data, measure it, and rewrite s.model."""
    from perfmodel.model import floor_features

    from . import evaluate as ev
    from .pipeline import write_model_folder
    from .static_head import load_one_device

    for name in ("epochs", "members", "batch_rows"):
        v = getattr(s, name)
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    if not s.hidden or min(s.hidden) < 1:
        raise ValueError(f"hidden: expected one or more widths >= 1, got {s.hidden}")
    t0 = time.perf_counter()
    bundle = load_one_device(s.model, s.threads, "the cuBLAS head is")
    if "cublas" not in bundle.heads:
        raise ValueError(f"model: {s.model} has no cuBLAS head to refit")
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))  # the model's split
    table = load_gemm(s.data)
    rows = all_rows(s.data, seed, table)
    counts = {k: int((rows.kind == k).sum()) for k in KINDS}
    log(f"cublas-head: {len(rows.log_ms)} torch.mm times ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    enc = bundle.encoders["cublas"]  # the call heads take the same features
    with torch.inference_mode():
        x = enc.encode(torch.from_numpy(rows.problems)).clone()
        before = ev.head_outputs(bundle.heads["cublas"], x)[1]
    y = torch.from_numpy(rows.log_ms).float()
    train = torch.from_numpy(rows.split == 0)
    head = fit_head(x[train], y[train], s, floor_features(enc.names, 1), log)
    with torch.inference_mode():
        after = ev.head_outputs(head, x)[1]
    metrics = {**fit_metrics(after, rows), **fit_metrics(before, rows, "before/"), "rows": counts,
               "seconds": time.perf_counter() - t0}
    for kind in KINDS:
        k = f"{kind}/test/mean_abs_log_err"
        if k in metrics:
            log(f"cublas-head: {kind} test rows: mean |log error| {metrics['before/' + k]:.3f} -> {metrics[k]:.3f}, "
                f"within 10 %: {metrics['before/' + kind + '/test/within_10pct']:.3f} -> "
                f"{metrics[kind + '/test/within_10pct']:.3f}")
    bundle.heads["cublas"] = head
    settings = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
                for k, v in asdict(s).items()}
    meta = {**bundle.metadata, "cublas_head_metrics": metrics, "cublas_head_settings": settings}
    if "cublas_metrics" in meta:  # the held-out GEMM problems' figures, as perfmodel eval gives them
        meta["cublas_metrics"] = {**meta["cublas_metrics"], **_gemm_test_metrics(bundle, table, seed)}
    bundle.metadata = meta
    write_model_folder(bundle, meta, s.model)
    return metrics


def _gemm_test_metrics(bundle: artifact.ModelBundle, table: GemmTable, seed: int) -> dict[str, float]:
    """evaluate.cublas_metrics on the model's test GEMM problems (the call by the call head, if any)."""
    from . import evaluate as ev

    test = table.subset(split_problems(table.modes, seed) == 2)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        pred = ev.head_outputs(bundle.heads["gemm"], bundle.encoders["gemm"].encode(P, C))[1]
        best = np.full(len(test.problems), np.inf)
        np.minimum.at(best, test.problem_idx, pred)
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(test.problems))
        call = bundle.heads.get(artifact.CALL)
        return ev.cublas_metrics(test, ev.head_outputs(bundle.heads["cublas"], cx)[1], best,
                                 None if call is None else call.eval().score(cx).double().numpy())
