"""The static rows (the `gemm_static` shards: the dataset's problems timed as Inductor compiles its mm template,
docs/design.md, "Kernel modes") and the helpers that read, pair and rank on them: the config network
(train/config_net.py), the problem network's call_static output (train/problem_head.py), `perfmodel eval` and the
studies use them. The static head they once fitted is of an older layout (perfmodel/heads/legacy.py): the config
network serves kernel="inductor" now, and no step writes a static head. Needs no Lightning and no MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.model import MLPConfig, PerfMLP

from . import evaluate as ev
from .data import GemmTable, _gemm_table
from .loop import fit_plain



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


def has_static_rows(folder: Path, kind: str = "gemm_static") -> bool:
    """Whether the dataset folder has `kind` parts (gemm_static, or gemm_tutorial: load_static's rows)."""
    from perfmodel.data_gen.shards import part_files

    return bool(part_files(Path(folder), kind))


def load_static(folder: Path, kind: str = "gemm_static") -> GemmTable:
    """The folder's `kind` rows (gemm_static, or gemm_tutorial) as a GemmTable (cublas_ms: torch.mm timed in the
    same run, where the rows hold it)."""
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(Path(folder), kind)
    if not rows:
        raise FileNotFoundError(f"data: no {kind} shards in {folder} (perfmodel gen static"
                                f"{'' if kind == 'gemm_static' else ' --kind ' + kind})")
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


def paired_split(table: GemmTable, static: GemmTable, split: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """paired(table, static) and each static row's problem's split (split: of table's problems; -1 for a
    problem table does not have)."""
    rows, prob = paired(table, static)
    return rows, prob, np.where(prob >= 0, split[np.maximum(prob, 0)], -1)


def split_static(table: GemmTable, static: GemmTable, split: np.ndarray, which: int = 2,
                 static_split: np.ndarray | None = None) -> GemmTable:
    """static's rows of the problems of table that split puts in `which` (0 train, 1 val, 2 test); with
    static_split (one split per static problem), of the static problems it puts there, in table or not."""
    if static_split is not None:
        return static.subset(np.asarray(static_split) == which)
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


def static_outputs(bundle: artifact.ModelBundle, head: PerfMLP | None, table: GemmTable) -> dict[str, np.ndarray]:
    """The gemm head's (score, log ms, lead score) and the screen's score on every row of table, with the
    static head's output added (and the physical floor on the log ms) when head is given: the inputs of
    train.evaluate.rank_path for the kernel mode. head may also be the bundle's config network's inductor
    mode (its INDUCTOR_GEMM head: perfmodel.artifact.inductor_head), or another mode's head of the bundle (the
    tutorial head: perfmodel.artifact.MODE_HEADS), which then scores in place of the gemm head."""
    P, C = torch.from_numpy(table.problems[table.problem_idx]), torch.from_numpy(table.configs)
    with torch.inference_mode():
        x = bundle.encoders["gemm"].encode(P, C)
    gemm = bundle.heads["gemm"]
    if head is not None and any(head is bundle.heads.get(n) for n in artifact.MODE_HEADS.values()):
        gemm, head = head, None   # a kernel mode's own head (inductor, tutorial) scores in place of the gemm head
    score, log_ms = ev.head_outputs(gemm, x)
    lead = ev.lead_outputs(gemm, x) if bundle.lead_keep else None
    screen = ev.head_outputs(bundle.heads[bundle.screen_name], x)[0] if bundle.screen_name else None
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
    o = static_outputs(bundle, head, table)
    r = ev.rank_path(table, o["log_ms"], o["screen"], bundle.screen_keep, o["score"], o["lead"], bundle.lead_keep)
    out = {k: v for k, v in r.items() if "top1" in k or "top5" in k or "spearman" in k or k.endswith("/problems")}
    cublas = artifact.problem_output(bundle, "cublas")
    if cublas is not None and np.isfinite(table.cublas_ms).any():
        with torch.inference_mode():
            cub = ev.head_outputs(cublas, bundle.encoders["cublas"].encode(torch.from_numpy(table.problems)))[1]
        best = np.full(len(table.problems), np.inf)
        np.minimum.at(best, table.problem_idx, o["log_ms"])
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(table.problems))
        with torch.inference_mode():
            score = None if call is None else call.score(cx).double().numpy()
        out.update(ev.cublas_metrics(table, cub, best, score))
    return out


def worst_static(bundle: artifact.ModelBundle, head: PerfMLP | None, table: GemmTable, n: int = 5) -> list[dict]:
    """The n problems of table ranked worst (top-1) by the serving path with (head) or without the inductor mode's
    head (ranking_metrics' order; train/metrics.py worst_problems)."""
    o = static_outputs(bundle, head, table)
    order = ev.screened(table, o["score"], o["log_ms"], o["screen"], bundle.screen_keep, o["lead"], bundle.lead_keep) \
        if o["screen"] is not None else o["score"]
    return ev.worst_problems(table, order, n)


def mode_figures(bundle: artifact.ModelBundle, head: PerfMLP, st: GemmTable, log: Any, what: str,
                 labels: tuple[str, str]) -> dict[str, Any]:
    """The test problems' static rows st ranked by the serving path (ranking_metrics) with the inductor mode's
    head (the static head, or a config network's inductor mode: keys "test_static/static_head/...") and without
    it ("test_static/without/..."), and their count; each headline figure logged as `what`: `<without> -> <with>`
    (labels: how the two are named)."""
    out: dict[str, Any] = {}
    for name, h in (("static_head", head), ("without", None)):
        out.update({f"test_static/{name}/{k}": v for k, v in ranking_metrics(bundle, h, st).items()})
    out["test_static/problems"] = len(st.problems)
    for k in ("all/top1_eff", "float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "all/top5_eff",
              "cublas/choice_accuracy"):
        a, b = out.get(f"test_static/static_head/{k}"), out.get(f"test_static/without/{k}")
        if a is not None:
            log(f"{what}: test problems on static times, {k}: {b:.4f} {labels[0]} -> {a:.4f} {labels[1]}")
    return out


