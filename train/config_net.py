"""One config network for both kernel modes: a measurement, not a served head.

Today a model ranks Triton configs with the gemm head (trained on a folder's `gemm` rows: the kernel as
`@triton.autotune` runs it, the "autotune" mode) and, for the "inductor" mode, the gemm head's score plus
the static head's correction (train/static_head.py, fitted on the `gemm_static` rows). The alternative
measured here is one network whose input is the gemm encoder's features plus a kernel-mode flag (0
autotune, 1 inductor), trained with the gemm head's loop and loss on the gemm rows (flag 0) and the
gemm_static rows (flag 1) together, each mode's rows of a problem a group of their own for the
within-problem ranking term.

    nice -n 10 python -m perfmodel.train.config_net --arm a --epochs 60 --members 3 --threads 2 --out a.json
    nice -n 10 python -m perfmodel.train.config_net --arm b --epochs 60 --members 3 --threads 2 --out b.json

Arm a is today's design (the gemm head, `members` seeds averaged as train/pipeline.py fits it, then the
static head with the recipe's [static] settings), arm b the config network; both on the same split (the
model's: train/data.py joint_split with the seed), the same width, members, epochs and Lightning
settings. Each prints and writes its held-out top-1 / top-5 per dtype for both kernel modes
(the gemm head, or the network, scoring every measured config of each test problem: no screen, no lead)
and its wall time. Nothing here is wired into serving or a model folder (docs/model.md, "Merging gemm
and static: measured").
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel.model import MLPConfig, PerfMLP, floor_features

from .data import GemmTable
from .metrics import summarize
from .static_head import StaticHeadSettings, paired

AUTOTUNE, INDUCTOR = 0.0, 1.0        # the kernel-mode flag's values
KERNEL_MODES = {"autotune": AUTOTUNE, "inductor": INDUCTOR}


def with_mode(x: torch.Tensor, flag: float) -> torch.Tensor:
    """x (N, F) with the kernel-mode flag appended as column F (the gemm encoder's columns keep their
    indices, so the physical floor's column is the gemm head's)."""
    if flag not in KERNEL_MODES.values():
        raise ValueError(f"flag: expected {AUTOTUNE} (autotune) or {INDUCTOR} (inductor), got {flag}")
    return torch.cat([x, torch.full((len(x), 1), flag, dtype=x.dtype)], 1)


@dataclass
class JointRows:
    """The config network's training rows: a table's rows (flag 0) then its static rows (flag 1)."""
    x: torch.Tensor          # (N, F + 1)
    y: torch.Tensor          # (N,) log ms
    split: np.ndarray        # (N,) the row's problem's split (0 train, 1 val, 2 test, -1 not in the table)
    groups: np.ndarray       # (N,) the problem index for flag 0 rows, problems + problem index for flag 1


def joint_rows(table: GemmTable, static: GemmTable, split: np.ndarray, x_table: torch.Tensor,
               x_static: torch.Tensor) -> JointRows:
    """table's rows (encoded x_table) with flag 0 and static's (x_static) with flag 1, each static row
    split and grouped by its problem in table (split: table's problems'); a static row whose problem is
    not in table gets split -1 (left out of training and validation)."""
    if len(split) != len(table.problems):
        raise ValueError(f"split: {len(split)} entries for {len(table.problems)} problems")
    if len(x_table) != len(table.ms) or len(x_static) != len(static.ms):
        raise ValueError(f"x_table / x_static: {len(x_table)} / {len(x_static)} rows for tables of "
                         f"{len(table.ms)} / {len(static.ms)}")
    _, prob = paired(table, static)
    n = len(table.problems)
    s_split = np.where(prob >= 0, split[np.maximum(prob, 0)], -1)
    s_group = np.where(prob >= 0, n + prob, -1)
    return JointRows(torch.cat([with_mode(x_table, AUTOTUNE), with_mode(x_static, INDUCTOR)]),
                     torch.from_numpy(np.log(np.concatenate([table.ms, static.ms]))).float(),
                     np.concatenate([split[table.problem_idx], s_split]),
                     np.concatenate([table.problem_idx, s_group]))


def new_config_net(names: list[str], hidden: tuple[int, ...], norm: str) -> PerfMLP:
    """The config network on the gemm encoder's features `names` plus the flag: the gemm head's MLP,
    one input wider, its physical floor on the same column."""
    return PerfMLP(MLPConfig(len(names) + 1, tuple(hidden), norm, floor_features=floor_features(names, 1)))


def fit_config_net(rows: JointRows, names: list[str], settings: Any, epochs: int, members: int = 1,
                   logger: Any = False) -> PerfMLP:
    """The config network fitted on rows as the gemm head is on its own (train/pipeline.py fit_members:
    `members` seeds averaged after each one's floor, each fitted by fit_lightning on batches of whole
    groups with the regression plus within-group ranking loss). settings: TrainSettings (hidden, norm,
    lr, weight_decay, rank_weight, rank_tau, problems_per_batch, seed and the Trainer's)."""
    from .pipeline import fit_members

    torch.manual_seed(settings.seed)
    return fit_members(lambda: new_config_net(names, settings.hidden, settings.norm), members, rows.x, rows.y,
                       rows.split, rows.groups, settings, logger, epochs, "config", settings.rank_weight,
                       average="after_floor")


def mode_metrics(score: np.ndarray, log_ms: np.ndarray, table: GemmTable) -> dict[str, float]:
    """summarize()'s top-1 / top-5 per dtype of a ranking score on table's rows (log_ms: the predicted
    times, for the MAPE)."""
    out = summarize(table, log_ms, score)
    return {k: v for k, v in out.items() if "/top1_eff" in k or "/top5_eff" in k or k.endswith("/problems")}


@torch.inference_mode()
def arm_a_metrics(gemm: PerfMLP, static: PerfMLP, x_test: torch.Tensor, x_static_test: torch.Tensor,
                  test: GemmTable, static_test: GemmTable) -> dict[str, dict[str, float]]:
    """Today's design on the test problems: the gemm head's score on their rows (autotune), its score
    plus the static head's on their static rows (inductor), as static_head.static_outputs serves them."""
    z = gemm.score(x_test)
    zs = gemm.score(x_static_test) + static.score(x_static_test)
    return {"autotune": mode_metrics(z.double().numpy(), gemm.floor(z, x_test).double().numpy(), test),
            "inductor": mode_metrics(zs.double().numpy(),
                                     gemm.physical_floor(zs.double(), x_static_test.double()).numpy(), static_test)}


@torch.inference_mode()
def arm_b_metrics(net: PerfMLP, x_test: torch.Tensor, x_static_test: torch.Tensor, test: GemmTable,
                  static_test: GemmTable) -> dict[str, dict[str, float]]:
    """The config network on the test problems: flag 0 on their rows, flag 1 on their static rows."""
    out = {}
    for mode, x, table in (("autotune", x_test, test), ("inductor", x_static_test, static_test)):
        xf = with_mode(x, KERNEL_MODES[mode])
        z = net.eval().score(xf)
        out[mode] = mode_metrics(z.double().numpy(), net.floor(z, xf).double().numpy(), table)
    return out


def _load(data: Path, seed: int):
    """TrainData of one folder with the model's split, its static rows and their encoding."""
    from .pipeline import TrainSettings, load_data
    from .static_head import load_static

    settings = TrainSettings(data=(data,), seed=seed, baselines=False, progress=False, register_name=None)
    d = load_data(settings)
    static = load_static(data)
    with torch.inference_mode():
        xs = d.enc.encode(torch.from_numpy(static.problems[static.problem_idx]), torch.from_numpy(static.configs))
    return d, static, xs


def _test_rows(d, static: GemmTable, xs: torch.Tensor):
    """The test problems' rows and static rows, with their encodings."""
    from .static_head import split_static

    test = d.gemm.subset(d.split == 2)
    st = split_static(d.gemm, static, d.split)
    keys = set(test.problem_keys)
    s_rows = np.array([static.problem_keys[p] in keys for p in static.problem_idx])
    return test, st, d.x[torch.from_numpy(d.row_split == 2)], xs[torch.from_numpy(s_rows)]


def run_arm(arm: str, data: Path, epochs: int, hidden: tuple[int, ...], static_epochs: int, seed: int,
            threads: int, members: int = 1) -> dict[str, Any]:
    """Fit one arm ("a": gemm head then static head; "b": the config network) and measure it; returns
    its settings, metrics and wall time (the data's loading and encoding included)."""
    from dataclasses import replace

    from .pipeline import TrainSettings, fit_members

    if arm not in ("a", "b"):
        raise ValueError(f"arm: expected 'a' (gemm + static heads) or 'b' (config network), got {arm!r}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    d, static, xs = _load(data, seed)
    ts = replace(TrainSettings(data=(data,), seed=seed, progress=False), hidden=tuple(hidden), epochs=epochs)
    test, st, x_test, xs_test = _test_rows(d, static, xs)
    if arm == "a":
        torch.manual_seed(seed)
        gemm = fit_members(lambda: new_gemm_head(d.enc.names, ts), members, d.x, d.y, d.row_split, d.gemm.problem_idx,
                           ts, False, epochs, "gemm", ts.rank_weight, average="after_floor")
        sh = fit_static_rows(d.gemm, static, d.split, xs, StaticHeadSettings(epochs=static_epochs, seed=seed))
        metrics = arm_a_metrics(gemm, sh, x_test, xs_test, test, st)
    else:
        net = fit_config_net(joint_rows(d.gemm, static, d.split, d.x, xs), d.enc.names, ts, epochs, members)
        metrics = arm_b_metrics(net, x_test, xs_test, test, st)
    return {"arm": arm, "epochs": epochs, "members": members, "hidden": list(hidden),
            "static_epochs": static_epochs if arm == "a" else None, "seed": seed, "threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - t0,
            "rows": {"gemm": int(len(d.gemm.ms)), "gemm_static": int(len(static.ms))}, "metrics": metrics}


def fit_static_rows(table: GemmTable, static: GemmTable, split: np.ndarray, xs: torch.Tensor,
                    s: StaticHeadSettings) -> PerfMLP:
    """The static head as static_head.fit_static_head fits it (the log ratio static / dataset time on
    the paired rows of the train problems), without its figures."""
    from .static_head import fit

    rows, prob = paired(table, static)
    ok = rows >= 0
    part = np.where(prob >= 0, split[np.maximum(prob, 0)], -1)
    y = torch.from_numpy(np.log(static.ms) - np.log(np.where(ok, table.ms[np.maximum(rows, 0)], 1.0))).float()
    train = torch.from_numpy(ok & (part == 0))
    return fit(xs[train], y[train], s, log=lambda *a: None)


def new_gemm_head(names: list[str], settings: Any) -> PerfMLP:
    """The gemm head as train/pipeline.py fit_heads makes each member."""
    return PerfMLP(MLPConfig(len(names), tuple(settings.hidden), settings.norm,
                             floor_features=floor_features(names, 1)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m perfmodel.train.config_net", description=__doc__.split("\n")[0])
    p.add_argument("--arm", required=True, choices=("a", "b"))
    p.add_argument("--data", type=Path, default=Path("data/h100"))
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--hidden", default="256,256,256")
    p.add_argument("--members", type=int, default=3, help="seeds averaged into the gemm head / the network")
    p.add_argument("--static-epochs", type=int, default=80, help="the static head's (arm a)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    a = p.parse_args(argv)
    result = run_arm(a.arm, a.data, a.epochs, tuple(int(h) for h in a.hidden.split(",")), a.static_epochs, a.seed,
                     a.threads, a.members)
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
