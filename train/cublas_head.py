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
is fitted on the train rows, as `perfmodel train` fits it too (pipeline.fit_cublas_head); the metadata's
`cublas_metrics` are re-evaluated, and `cublas_head_metrics` gives the fit on each kind's val and test
rows beside the previous head's (the model's default device's rows; "by_device" adds each device's).
"""
from __future__ import annotations

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


def thin_extra_rows(rows: CublasRows, fractions: dict[str, float], seed: int) -> np.ndarray:
    """rows.split with each device's train rows of the kinds other than "gemm" thinned to its fraction
    (train/data.subsample_training, within each kind); the GEMM rows' split as given."""
    from .data import subsample_training

    split = rows.split.copy()
    for kind in KINDS[1:]:
        k = rows.kind == kind
        split[k] = subsample_training(rows.split[k], rows.device[k], rows.modes[k], fractions, seed)
    return split


def data_folders(s: Any, bundle: artifact.ModelBundle) -> list[Path]:
    """s.data (s: CublasHeadSettings or CallHeadSettings) as a list of folders, one per device of the model
    in its order: None gives the folders the model's metadata names where they exist (else, for a model of
    one device, the default dataset)."""
    if s.data is None:
        known = [Path(d["path"]) for d in bundle.metadata.get("datasets") or [] if d.get("path")]
        if len(known) == len(bundle.devices) and all(p.is_dir() for p in known):
            return known
        if len(bundle.devices) > 1:
            raise ValueError(f"data: {s.model} serves {', '.join(bundle.devices)}; give one --data folder per "
                             "device, in that order")
        return [default_data_dir()]
    return [Path(s.data)] if isinstance(s.data, (str, Path)) else [Path(p) for p in s.data]


def load_model_and_data(s: Any, without_cublas: str) -> tuple[artifact.ModelBundle, list, int, list[np.ndarray]]:
    """What `perfmodel cublas-head` and `perfmodel call-head` start from (s: their settings): the model
    (torch's CPU threads set first, s.threads > 0), its DeviceDatasets (data_folders, one per device in its
    order), the model's seed and the joint split of each dataset's GEMM problems. ValueError naming model
    for a model without a cuBLAS head (without_cublas ends the message), data for folders that are not
    one per device in the model's order."""
    from .data import joint_split, load_device_datasets

    if s.threads > 0:
        torch.set_num_threads(s.threads)
    bundle = artifact.load(s.model)
    if "cublas" not in bundle.heads:
        raise ValueError(f"model: {s.model} has no cuBLAS head{without_cublas}")
    datasets = load_device_datasets(data_folders(s, bundle))
    if [ds.device for ds in datasets] != list(bundle.devices):
        raise ValueError(f"data: {s.model} serves {', '.join(bundle.devices)}; the folders given hold "
                         f"{', '.join(f'{ds.folder}: {ds.device}' for ds in datasets)} (one per device, in that order)")
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))  # the model's split
    return bundle, datasets, seed, joint_split(datasets, seed)[0]


def merge_cublas_metrics(meta: dict[str, Any], devices: list[str], got: dict[str, dict[str, float]]) -> None:
    """Merge each device's new held-out cuBLAS figures (got) into the metadata: `cublas_metrics` takes the
    first (the model's default) device's, `metrics_by_device[device]["cublas"]` each device's."""
    for i, device in enumerate(devices):
        if device not in got:
            continue
        if i == 0 and "cublas_metrics" in meta:
            meta["cublas_metrics"] = {**meta["cublas_metrics"], **got[device]}
        by = meta.get("metrics_by_device", {}).get(device)
        if by is not None and "cublas" in by:
            by["cublas"] = {**by["cublas"], **got[device]}


def run(s: CublasHeadSettings, log: Any = print) -> dict[str, Any]:
    """Refit the cuBLAS head of s.model on every torch.mm time of s.data, measure it, and rewrite s.model."""
    from perfmodel.model import floor_features

    from . import evaluate as ev
    from .data import parse_device_fractions, subsample_training
    from .pipeline import write_model_folder

    for name in ("epochs", "members", "batch_rows"):
        v = getattr(s, name)
        if v < 1:
            raise ValueError(f"{name}: must be >= 1, got {v}")
    if not s.hidden or min(s.hidden) < 1:
        raise ValueError(f"hidden: expected one or more widths >= 1, got {s.hidden}")
    t0 = time.perf_counter()
    bundle, datasets, seed, gemm_splits = load_model_and_data(s, "to refit")
    settings = bundle.metadata.get("settings", {})
    # perfmodel train thinned each device's train rows by its device_fraction: the GEMM problems as the
    # pipeline does, the other kinds within their kind (pipeline.fit_cublas_head)
    fractions = parse_device_fractions(str(settings.get("device_fraction") or ""))
    rows = CublasRows.concat([folder_rows(ds.folder, ds.gemm, subsample_training(
        split, np.full(len(split), ds.device, dtype=object), ds.gemm.modes, fractions, seed), seed, ds.device)
        for ds, split in zip(datasets, gemm_splits)])
    rows.split = thin_extra_rows(rows, fractions, seed)
    counts = {k: int((rows.kind == k).sum()) for k in KINDS}
    log(f"cublas-head: {len(rows.log_ms)} torch.mm times ({', '.join(f'{k} {v}' for k, v in counts.items())})"
        + (f" of {len(datasets)} devices" if len(datasets) > 1 else ""))
    x = _encode(bundle, rows)
    with torch.inference_mode():
        before = ev.head_outputs(bundle.heads["cublas"], x)[1]
    y = torch.from_numpy(rows.log_ms).float()
    train = torch.from_numpy(rows.split == 0)
    head = fit_head(x[train], y[train], s, floor_features(bundle.encoders["cublas"].names, 1), log)
    with torch.inference_mode():
        after = ev.head_outputs(head, x)[1]

    def figures(sel: np.ndarray) -> dict[str, float]:
        return {**fit_metrics(after[sel], rows.select(sel)), **fit_metrics(before[sel], rows.select(sel), "before/")}

    first = rows.device == datasets[0].device
    metrics = {**figures(first), "rows": {k: int(((rows.kind == k) & first).sum()) for k in KINDS}}
    if len(datasets) > 1:
        metrics["by_device"] = {ds.device: {**figures(rows.device == ds.device), "rows": {
            k: int(((rows.kind == k) & (rows.device == ds.device)).sum()) for k in KINDS}} for ds in datasets}
    metrics["seconds"] = time.perf_counter() - t0
    for ds in datasets:
        m = metrics["by_device"][ds.device] if len(datasets) > 1 else metrics
        for kind in KINDS:
            k = f"{kind}/test/mean_abs_log_err"
            if k in m:
                log(f"cublas-head: {ds.device} {kind} test rows: mean |log error| {m['before/' + k]:.3f} -> "
                    f"{m[k]:.3f}, within 10 %: {m['before/' + kind + '/test/within_10pct']:.3f} -> "
                    f"{m[kind + '/test/within_10pct']:.3f}")
    bundle.heads["cublas"] = head
    saved = {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
             for k, v in asdict(s).items() if k != "data"}
    saved["data"] = [str(ds.folder) for ds in datasets]
    meta = {**bundle.metadata, "cublas_head_metrics": metrics, "cublas_head_settings": saved}
    # the held-out GEMM problems' figures, as perfmodel eval gives them, per device
    merge_cublas_metrics(meta, [ds.device for ds in datasets], {
        ds.device: _gemm_test_metrics(bundle.for_device(ds.device), ds.gemm, split_)
        for ds, split_ in zip(datasets, gemm_splits)})
    bundle.metadata = meta
    write_model_folder(bundle, meta, s.model)
    return metrics


def _encode(bundle: artifact.ModelBundle, rows: CublasRows) -> torch.Tensor:
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


def _gemm_test_metrics(bundle: artifact.ModelBundle, table: GemmTable, split: np.ndarray) -> dict[str, float]:
    """evaluate.cublas_metrics on the model's test GEMM problems (split == 2) of one device (the bundle
    encoding for it; the call by the call head, if any)."""
    from . import evaluate as ev

    test = table.subset(split == 2)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        pred = ev.head_outputs(bundle.heads["gemm"], bundle.encoders["gemm"].encode(P, C))[1]
        best = np.full(len(test.problems), np.inf)
        np.minimum.at(best, test.problem_idx, pred)
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(test.problems))
        call = bundle.heads.get(artifact.CALL)
        return ev.cublas_metrics(test, ev.head_outputs(bundle.heads["cublas"], cx)[1], best,
                                 None if call is None else call.eval().score(cx).double().numpy())
