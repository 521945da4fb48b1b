"""`perfmodel distill`: the "student" head, one small MLP distilled from the gemm head (an ensemble), that
`Predictor.predict` / `predict_many` serve (docs/design.md, "The model"). Ranking keeps the gemm head.

Run after training, on the model folder it wrote (`perfmodel train` runs it itself when --student-hidden
is not empty):

    perfmodel distill --model models/h100 --data data/h100

A model of several devices (docs/transfer.md) takes every device's dataset, in the model's device order
(--data data/h100 --data data/h200): the split is the joint one training used (train/data.py
joint_split), each device's rows are encoded with its spec, and the agreement is measured per device.

It labels rows with the gemm head's log ms -- the whole pruned config space of every train and val
problem of the model's split, plus random problems with random configs of their dtype's space -- fits
the student to them (L1 on log ms, its output floored as every head's is), measures on the held-out
(test) problems how far it is from the gemm head, beside how far the gemm head's own members are from
their mean. fit_student_head returns the student and those figures and writes nothing (train/refit.py
adds it to a model folder, train/recipe.py to a build). The test problems never label a training row.
Needs no Lightning and no MLflow.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.configs import pruned_space
from perfmodel.features import configs_tensor
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.model import MLPConfig, PerfMLP

from .data import GemmTable, split_problems
from .folder import settings_record
from .loop import fit_plain

STUDENT = artifact.STUDENT
_CHUNK = 1 << 16  # rows per teacher / evaluation batch


@dataclass
class DistillSettings:
    model: Path = field(default_factory=default_model_dir)
    # the model's dataset; a model of several devices: each device's folder, in the model's device order
    data: Path | tuple[Path, ...] = field(default_factory=default_data_dir)
    hidden: tuple[int, ...] = (128, 128, 128)
    epochs: int = 24
    batch_rows: int = 2048
    lr: float = 3e-3
    weight_decay: float = 0.0
    random_problems: int = 4000      # extra problems (log-uniform sizes) beside the dataset's train/val ones
    random_configs: int = 128        # configs of each random problem's dtype space
    seed: int = 0
    device: str = "cpu"              # torch device to fit on ("cuda" where there is one)
    threads: int = 0                 # torch CPU threads (0: torch's default)
    screens: bool = False            # the student screens the ranking too, in place of a screen head (one speed head)


def _dtype_of(mode: str) -> str:
    return "float32" if mode == "tf32" else str(mode)


def _full_space_rows(table: GemmTable, spec: Any, mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(problems, configs) of every selected problem with its dtype's whole pruned space, problem-major."""
    spaces: dict[str, torch.Tensor] = {}
    ps, cs = [], []
    for prob, mode in zip(table.problems[mask], table.modes[mask]):
        d = _dtype_of(mode)
        if d not in spaces:
            spaces[d] = configs_tensor(pruned_space(d, spec))
        ct = spaces[d]
        ps.append(torch.from_numpy(prob).expand(len(ct), -1))
        cs.append(ct)
    return torch.cat(ps), torch.cat(cs)


def _random_rows(table: GemmTable, spec: Any, n_problems: int, n_configs: int,
                 gen: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n_problems random problems (sizes log-uniform over the dataset's range, mode, tf32 and layouts
    uniform) with n_configs random configs of their dtype's pruned space each."""
    if n_problems <= 0:
        return torch.empty(0, 8, dtype=torch.float64), torch.empty(0, 6, dtype=torch.float64)
    lo, hi = np.log(table.problems[:, :3].min()), np.log(table.problems[:, :3].max())
    modes = ("float16", "bfloat16", "tf32", "float32")
    spaces = {d: configs_tensor(pruned_space(d, spec)).numpy() for d in ("float16", "bfloat16", "float32")}
    ps, cs = [], []
    for _ in range(n_problems):
        mode = modes[gen.integers(len(modes))]
        d = _dtype_of(mode)
        m, n, k = np.maximum(1, np.round(np.exp(gen.uniform(lo, hi, 3))))
        row = [m, n, k, 4.0 if d == "float32" else 2.0, d == "bfloat16", mode == "tf32",
               gen.integers(2), gen.integers(2)]
        space = spaces[d]
        pick = space[gen.choice(len(space), size=min(n_configs, len(space)), replace=False)]
        ps.append(np.tile(np.asarray(row, dtype=np.float64), (len(pick), 1)))
        cs.append(pick)
    return torch.from_numpy(np.concatenate(ps)), torch.from_numpy(np.concatenate(cs))


@torch.inference_mode()
def _encode(enc: Any, problems: torch.Tensor, configs: torch.Tensor) -> torch.Tensor:
    return torch.cat([enc.encode(problems[i:i + _CHUNK], configs[i:i + _CHUNK])
                      for i in range(0, len(problems), _CHUNK)]) if len(problems) else torch.empty(0, len(enc))


@torch.inference_mode()
def _apply(head: PerfMLP, x: torch.Tensor, device: str = "cpu") -> torch.Tensor:
    head = head.to(device).eval()
    out = torch.cat([head(x[i:i + _CHUNK].to(device)).float().cpu() for i in range(0, len(x), _CHUNK)])
    head.to("cpu")
    return out


@torch.inference_mode()
def member_log_ms(head: PerfMLP, x: torch.Tensor) -> torch.Tensor:
    """(N, members) log ms of each member of an after-floor ensemble head (each floored by its own
    overhead and by the physical floor): what the head's output averages."""
    if not head.floors_each_member:
        raise ValueError("head: member_log_ms needs an after-floor ensemble (cfg.members > 1)")
    outs = []
    for i in range(0, len(x), _CHUNK):
        xb = x[i:i + _CHUNK]
        z = head.net((xb - head.x_mean) / head.x_std)                         # (rows, members)
        oh = head.log_overhead.expand_as(z)
        floored = torch.maximum(z, oh) + torch.log1p(torch.exp(-torch.abs(z - oh)))   # each member's overhead
        ff = head.cfg.floor_features
        outs.append(torch.maximum(floored, xb[:, ff[0], None]) if ff and ff[0] >= 0 else floored)
    return torch.cat(outs)


def agreement(bundle: artifact.ModelBundle, student: PerfMLP, table: GemmTable, test: np.ndarray) -> dict[str, float]:
    """On the test problems' whole pruned config spaces: the median |student log ms - gemm head log ms|,
    and, for an ensemble gemm head, the median |member log ms - gemm head log ms| over its members (the
    ensemble's own spread), with the 90th percentiles."""
    enc, gemm = bundle.encoders["gemm"], bundle.heads["gemm"]
    x = _encode(enc, *_full_space_rows(table, bundle.spec, test))
    want = _apply(gemm, x)
    diff = (_apply(student, x) - want).abs()
    out = {"student/median_abs_log_diff": float(diff.median()), "student/p90_abs_log_diff": float(diff.quantile(0.9)),
           "student/rows": int(len(x)), "student/test_problems": int(test.sum())}
    if gemm.floors_each_member:
        spread = (member_log_ms(gemm, x) - want[:, None]).abs()
        out["gemm/member_spread_median"] = float(spread.median())
        out["gemm/member_spread_p90"] = float(spread.reshape(-1).quantile(0.9))
    return out


def fit_student(x: torch.Tensor, y: torch.Tensor, floor_feats: tuple[int, ...], s: DistillSettings,
                log_overhead: float, log: Any = print) -> PerfMLP:
    """The student: a plain MLP (norm none, standardised inputs) fitted to y (log ms) with L1 loss on its
    floored output, AdamW with a one-cycle learning rate (train/loop.py fit_plain, whole batches only)."""
    torch.manual_seed(s.seed)
    student = PerfMLP(MLPConfig(x.shape[1], tuple(s.hidden), "none", floor_features=floor_feats,
                                init_overhead_ms=math.exp(log_overhead)))
    clock = [time.perf_counter()]

    def on_epoch(epoch: int, loss: float) -> None:
        now = time.perf_counter()
        log(f"distill: epoch {epoch}/{s.epochs} train L1 {loss:.4f} ({now - clock[0]:.1f} s)")
        clock[0] = now

    return fit_plain(student, x, y, s, s.seed, student, on_epoch, loss="l1", whole_batches=True, device=s.device)


def fit_student_head(bundle: artifact.ModelBundle, table: GemmTable, s: DistillSettings, log: Any = print,
                     split_seed: int | None = None, split: np.ndarray | None = None,
                     problem_device: np.ndarray | None = None) -> tuple[PerfMLP, dict[str, Any]]:
    """A student for bundle's gemm head, and the metadata entries that describe it (student_metrics,
    student_settings, and student_metrics_by_device for a model of several devices). Writes nothing.
    split: the model's split of table's problems (0 train, 1 val, 2 test, -1 unused), default
    split_problems with split_seed (default: its metadata's settings.seed); only train and val problems
    label rows, the test problems measure. problem_device: (problems,) each problem's device for a model of
    several devices (default: all the bundle's): its rows and its share of the random problems are encoded
    with that device's spec (ModelBundle.for_device); student_metrics are then the default device's."""
    if s.threads > 0:
        torch.set_num_threads(s.threads)
    t_start = time.perf_counter()
    split, problem_device, devices = _check_split(bundle, table, split, split_seed, problem_device)
    gemm = bundle.heads["gemm"]
    x = _student_rows(bundle, table, s, split, problem_device, devices, log)
    y = _apply(gemm, x, s.device)
    student = fit_student(x, y, gemm.cfg.floor_features, s, float(gemm.log_overhead.detach().mean()), log)
    by_device = {dev: agreement(bundle.for_device(dev), student, table, (split == 2) & (problem_device == dev))
                 for dev in devices if ((split == 2) & (problem_device == dev)).any()}
    metrics = dict(by_device.get(bundle.devices[0]) or agreement(bundle, student, table, split == 2))
    metrics["student/seconds"] = time.perf_counter() - t_start
    added: dict[str, Any] = {"student_metrics": metrics, "student_settings": settings_record(s)}
    if len(bundle.devices) > 1:
        added["student_metrics_by_device"] = by_device
    log(f"distill: student {'x'.join(map(str, s.hidden))}: median |log ms - gemm head| "
        f"{metrics['student/median_abs_log_diff']:.4f} on the test problems' spaces (gemm members around "
        f"their mean: {metrics.get('gemm/member_spread_median', float('nan')):.4f})")
    return student, added


def _check_split(bundle: artifact.ModelBundle, table: GemmTable, split: np.ndarray | None, split_seed: int | None,
                 problem_device: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(split, problem_device, the devices with problems) with their defaults; ValueError for lengths that
    do not match table's problems, or a device the model was not trained for."""
    if split is None:
        if split_seed is None:
            split_seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
        split = split_problems(table.modes, split_seed)
    if problem_device is None:
        problem_device = np.full(len(table.problems), bundle.spec.name, dtype=object)
    if len(split) != len(table.problems) or len(problem_device) != len(table.problems):
        raise ValueError(f"split/problem_device: {len(split)}/{len(problem_device)} entries for "
                         f"{len(table.problems)} problems")
    unknown = set(problem_device.tolist()) - set(bundle.devices)
    if unknown:
        raise ValueError(f"data: rows of {', '.join(sorted(unknown))}, a device this model was not trained for "
                         f"({', '.join(bundle.devices)})")
    return split, problem_device, [d for d in bundle.devices if (problem_device == d).any()]


def _student_rows(bundle: artifact.ModelBundle, table: GemmTable, s: DistillSettings, split: np.ndarray,
                  problem_device: np.ndarray, devices: list[str], log: Any) -> torch.Tensor:
    """The student's training rows, encoded: every train/val problem's whole pruned space, then the random
    problems, each device's with its own encoding (the random problems shared out)."""
    gen = np.random.default_rng(s.seed)
    labelled = (split >= 0) & (split < 2)
    xs, n_space, n_random = [], 0, 0
    for i, dev in enumerate(devices):
        b = bundle.for_device(dev)
        p1, c1 = _full_space_rows(table, b.spec, labelled & (problem_device == dev))
        share = s.random_problems // len(devices) + (i < s.random_problems % len(devices))
        p2, c2 = _random_rows(table, b.spec, share, s.random_configs, gen)
        xs.append(_encode(b.encoders["gemm"], torch.cat([p1, p2]), torch.cat([c1, c2])))
        n_space, n_random = n_space + len(p1), n_random + len(p2)
    x = torch.cat(xs)
    log(f"distill: {len(x)} rows ({n_space} from {labelled.sum()} train/val problems' spaces, {n_random} random"
        + (f"; devices {', '.join(devices)}" if len(devices) > 1 else "") + ")")
    return x
