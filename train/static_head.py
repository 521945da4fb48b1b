"""`perfmodel static-head`: the "static" head, which turns the gemm head's times (the dataset's kernel,
Triton's default specialisation: what a `@triton.autotune` user runs) into times of the same source
compiled for one problem's shape, as Inductor compiles its mm template (docs/design.md, "Kernel modes").

    perfmodel static-head --model models/h100 --data data/h100

It is fitted to the log ratio, config by config, of the two timings of the dataset's problems that
were timed both ways: the `gemm` rows and the `gemm_static` rows of the same folder (the static compile
is one kernel per problem and config, so only a share of the problems and of their configs is timed
that way: benchmarks/static_retime.py). Its input is the gemm head's own features; its output, added to
the gemm head's score before the physical floor, is what `Predictor.load(kernel="inductor")` ranks by.

The split is the model's (split_problems with its seed): train problems fit, validation problems
report, and the test problems -- every dataset config of each timed statically -- measure the serving
path's ranking against the static times, beside the same path without the head. The folder is then
rewritten (weights, metadata, model.onnx) with the head added. Needs no Lightning and no MLflow.
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
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.model import MLPConfig, PerfMLP

from .data import GemmTable, _gemm_table, load_gemm, split_problems

STATIC = artifact.STATIC


@dataclass
class StaticHeadSettings:
    model: Path = field(default_factory=default_model_dir)
    data: Path = field(default_factory=default_data_dir)
    hidden: tuple[int, ...] = (128, 128, 128)   # chosen on the val problems (log-ratio MAE), see docs/model.md
    epochs: int = 80
    batch_rows: int = 512
    lr: float = 2e-3
    weight_decay: float = 0.1
    huber_beta: float = 0.05       # smooth L1 on the log ratio: a few noisy single-run rows do not lead
    seed: int = 0
    threads: int = 0               # torch CPU threads (0: torch's default)


def has_static_rows(folder: Path) -> bool:
    """Whether the dataset folder has gemm_static parts (load_static's rows)."""
    from perfmodel.data_gen.shards import STATIC_KIND, part_files

    return bool(part_files(Path(folder), STATIC_KIND))


def load_static(folder: Path) -> GemmTable:
    """The folder's `gemm_static` rows as a GemmTable (cublas_ms: torch.mm timed in the same run)."""
    from perfmodel.data_gen.shards import STATIC_KIND, read_dataset

    rows, _ = read_dataset(Path(folder), STATIC_KIND)
    if not rows:
        raise FileNotFoundError(f"data: no {STATIC_KIND} shards in {folder} (perfmodel gen static)")
    return _gemm_table(rows, [])


def paired(table: GemmTable, static: GemmTable) -> tuple[np.ndarray, np.ndarray]:
    """For each static row, the index of the same problem and config among table's rows (-1 where the
    dataset has no such row), and the static rows' problem index in table."""
    where = {(table.problem_keys[p], *map(int, c)): i for i, (p, c) in enumerate(zip(table.problem_idx, table.configs))}
    pos = {k: i for i, k in enumerate(table.problem_keys)}
    rows = np.array([where.get((static.problem_keys[p], *map(int, c)), -1)
                     for p, c in zip(static.problem_idx, static.configs)], dtype=np.int64)
    prob = np.array([pos.get(static.problem_keys[p], -1) for p in static.problem_idx], dtype=np.int64)
    return rows, prob


def split_static(table: GemmTable, static: GemmTable, split: np.ndarray, which: int = 2) -> GemmTable:
    """static's rows of the problems of table that split puts in `which` (0 train, 1 val, 2 test)."""
    keys = {table.problem_keys[i] for i in np.flatnonzero(split == which)}
    return static.subset(np.array([k in keys for k in static.problem_keys]))


def fit(x: torch.Tensor, y: torch.Tensor, s: StaticHeadSettings, log: Any = print) -> PerfMLP:
    """A plain MLP (standardised inputs, no norm layers) fitted to y, the log ratio static / dataset
    kernel, with smooth L1 and AdamW. Only its score (the network's output) is served."""
    torch.manual_seed(s.seed)
    head = PerfMLP(MLPConfig(x.shape[1], tuple(s.hidden), "none", floor_features=(-1,), learn_overhead=False,
                             init_overhead_ms=1e-9))

    def on_epoch(epoch: int, loss: float) -> None:
        if epoch % 10 == 0 or epoch == s.epochs:
            log(f"static-head: epoch {epoch}/{s.epochs} train loss {loss:.5f}")

    return fit_plain(head, x, y, s, s.seed, head.score, on_epoch)


def fit_plain(head: PerfMLP, x: torch.Tensor, y: torch.Tensor, s: Any, seed: int, forward: Any,
              on_epoch: Any = None) -> PerfMLP:
    """head (inputs standardised on x) fitted so that forward(rows) matches y: smooth L1 (s.huber_beta),
    AdamW (s.lr, s.weight_decay), one cycle over s.epochs epochs of s.batch_rows-row batches shuffled by
    seed; on_epoch(epoch, mean train loss) after each epoch. The static, call and cuBLAS heads' loop."""
    head.set_normalisation(x.mean(0), x.std(0))
    head.train()
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    steps = max(1, math.ceil(len(x) / s.batch_rows))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=s.lr, total_steps=s.epochs * steps, pct_start=0.1)
    for epoch in range(s.epochs):
        order, total = torch.randperm(len(x), generator=gen), 0.0
        for i in range(steps):
            idx = order[i * s.batch_rows:(i + 1) * s.batch_rows]
            loss = torch.nn.functional.smooth_l1_loss(forward(x[idx]).reshape(-1), y[idx], beta=s.huber_beta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
        if on_epoch is not None:
            on_epoch(epoch + 1, total / steps)
    return head.eval()


def static_outputs(bundle: artifact.ModelBundle, head: PerfMLP | None, table: GemmTable) -> dict[str, np.ndarray]:
    """The gemm head's (score, log ms, lead score) and the screen's score on every row of table, with the
    static head's output added (and the physical floor on the log ms) when head is given: the inputs of
    train.evaluate.rank_path for the kernel mode."""
    from . import evaluate as ev

    P, C = torch.from_numpy(table.problems[table.problem_idx]), torch.from_numpy(table.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
    score, log_ms = ev.head_outputs(bundle.heads["gemm"], x)
    lead = ev.lead_outputs(bundle.heads["gemm"], x) if bundle.lead_keep else None
    screen = ev.head_outputs(bundle.heads["screen"], x)[0] if "screen" in bundle.heads else None
    if head is not None:
        with torch.inference_mode():
            d = head.score(x).double().numpy()
        score = score + d
        lead = None if lead is None else lead + d
        with torch.inference_mode():
            log_ms = bundle.heads["gemm"].physical_floor(torch.from_numpy(score), x.double()).numpy()
    return {"score": score, "log_ms": log_ms, "lead": lead, "screen": screen}


def ranking_metrics(bundle: artifact.ModelBundle, head: PerfMLP | None, table: GemmTable,
                    call: PerfMLP | None = None) -> dict[str, float]:
    """rank_path's top-1/top-5 (serving path) and the cuBLAS call on table's times, by the gemm head
    with (head given) or without the static head; the call by the call head `call` when given
    (train/call_head.py), else by the cuBLAS head's time against the best predicted one."""
    from . import evaluate as ev

    o = static_outputs(bundle, head, table)
    r = ev.rank_path(table, o["log_ms"], o["screen"], bundle.screen_keep, o["score"], o["lead"], bundle.lead_keep)
    out = {k: v for k, v in r.items() if "top1" in k or "top5" in k or "spearman" in k}
    if "cublas" in bundle.heads and np.isfinite(table.cublas_ms).any():
        with torch.inference_mode():
            cub = ev.head_outputs(bundle.heads["cublas"], bundle.encoders["cublas"].encode(torch.from_numpy(table.problems)))[1]
        best = np.full(len(table.problems), np.inf)
        np.minimum.at(best, table.problem_idx, o["log_ms"])
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(table.problems))
        with torch.inference_mode():
            score = None if call is None else call.score(cx).double().numpy()
        out.update(ev.cublas_metrics(table, cub, best, score))
    return out


def load_one_device(model: Path, threads: int, what: str) -> artifact.ModelBundle:
    """The model folder a head of one device's timings is added to (`what`, for the error), with torch's CPU
    threads set (threads > 0). ValueError naming the model for a model of several devices."""
    if threads > 0:
        torch.set_num_threads(threads)
    bundle = artifact.load(model)
    if len(bundle.devices) > 1:
        raise ValueError(f"model: {model} serves several devices; {what} fitted to one device's timings "
                         "(a model of one device)")
    return bundle


def run(s: StaticHeadSettings, log: Any = print) -> dict[str, Any]:
    """Fit the static head on the model's train problems, measure it, and rewrite s.model with it."""
    from .pipeline import write_model_folder

    t0 = time.perf_counter()
    bundle = load_one_device(s.model, s.threads, "the static head is")
    table, static = load_gemm(s.data), load_static(s.data)
    rows, prob = paired(table, static)
    ok = rows >= 0
    seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    split = split_problems(table.modes, seed)
    part = np.where(prob >= 0, split[np.maximum(prob, 0)], -1)
    enc = bundle.encoders["gemm"]
    with torch.inference_mode():
        x = enc.encode(torch.from_numpy(static.problems[static.problem_idx]), torch.from_numpy(static.configs))
    y = torch.from_numpy(np.log(static.ms) - np.log(np.where(ok, table.ms[np.maximum(rows, 0)], 1.0))).float()
    train, val = ok & (part == 0), ok & (part == 1)
    log(f"static-head: {int(ok.sum())} paired rows: {int(train.sum())} train ({len(set(prob[train]))} problems), "
        f"{int(val.sum())} val, {int((ok & (part == 2)).sum())} test")
    head = fit(x[torch.from_numpy(train)], y[torch.from_numpy(train)], s, log)
    with torch.inference_mode():
        d = head.score(x).double().numpy()
    yy = y.double().numpy()
    metrics: dict[str, Any] = {"rows/train": int(train.sum()), "rows/val": int(val.sum()),
                               "problems/train": len(set(prob[train])), "problems/val": len(set(prob[val]))}
    for name, sel in (("train", train), ("val", val), ("test", ok & (part == 2))):
        if sel.any():
            metrics[f"{name}/mae_log_ratio"] = float(np.abs(d[sel] - yy[sel]).mean())
            metrics[f"{name}/mae_log_ratio_constant"] = float(np.abs(yy[sel] - np.median(yy[train])).mean())
            metrics[f"{name}/corr"] = float(np.corrcoef(d[sel], yy[sel])[0, 1])
    # the test problems: the ranking on the static times (every dataset config of each), with and without
    st = split_static(table, static, split)
    for name, h in (("static_head", head), ("without", None)):
        metrics.update({f"test_static/{name}/{k}": v for k, v in ranking_metrics(bundle, h, st).items()})
    metrics["test_static/problems"] = len(st.problems)
    metrics["seconds"] = time.perf_counter() - t0
    bundle.heads[STATIC], bundle.encoders[STATIC] = head, enc
    settings = {k: (str(v) if isinstance(v, (Path, tuple)) else v) for k, v in asdict(s).items()}
    bundle.metadata = {**bundle.metadata, "static_metrics": metrics, "static_settings": settings}
    for k in ("all/top1_eff", "float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "all/top5_eff",
              "cublas/choice_accuracy"):
        a, b = metrics.get(f"test_static/static_head/{k}"), metrics.get(f"test_static/without/{k}")
        if a is not None:
            log(f"static-head: test problems on static times, {k}: {b:.4f} without the head -> {a:.4f} with it")
    write_model_folder(bundle, bundle.metadata, s.model)
    return metrics
