"""The config network against the gemm head plus the static head: the measurement that chose it.

Arm a is the design before it (the gemm head, `members` seeds averaged as train/pipeline.py fits it, then the
static head with the [static] settings of recipes/h100.toml before the merge), arm b the config network
(train/config_net.py); both on the same split (the model's: train/data.py joint_split with the seed), the same
width, members, epochs and Lightning settings. Each prints and writes its held-out top-1 / top-5 per dtype for
both kernel modes (the gemm head, or the network, scoring every measured config of each test problem: no screen,
no lead), the same on the val problems (`val_metrics`), and its wall time.

    nice -n 10 python -m benchmarks.studies.config_net_arms --arm a --epochs 60 --members 3 --threads 2 --out a.json
    nice -n 10 python -m benchmarks.studies.config_net_arms --arm b --epochs 60 --members 3 --threads 2 --out b.json

docs/model.md ("The config network") has the figures.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel.model import MLPConfig, PerfMLP, floor_features
from perfmodel.train.config_net import KERNEL_MODES, fit_config_net, joint_rows, mode_metrics, with_mode
from perfmodel.train.data import GemmTable
from perfmodel.train.loop import fit_members
from perfmodel.train.pipeline import TrainSettings, load_data
from perfmodel.train.static_head import StaticHeadSettings, fit, load_static, paired_split, split_static


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

    settings = TrainSettings(data=(data,), seed=seed, baselines=False, progress=False, register_name=None)
    d = load_data(settings)
    static = load_static(data)
    with torch.inference_mode():
        xs = d.enc.encode(torch.from_numpy(static.problems[static.problem_idx]), torch.from_numpy(static.configs))
    return d, static, xs


def _test_rows(d, static: GemmTable, xs: torch.Tensor, which: int = 2):
    """The test problems' (which=1: the val problems') rows and static rows, with their encodings."""
    test = d.gemm.subset(d.split == which)
    st = split_static(d.gemm, static, d.split, which)
    keys = set(test.problem_keys)
    s_rows = np.array([static.problem_keys[p] in keys for p in static.problem_idx])
    return test, st, d.x[torch.from_numpy(d.row_split == which)], xs[torch.from_numpy(s_rows)]


def run_arm(arm: str, data: Path, epochs: int, hidden: tuple[int, ...], static_epochs: int, seed: int,
            threads: int, members: int = 1, split_seed: int | None = None) -> dict[str, Any]:
    """Fit one arm ("a": gemm head then static head; "b": the config network) and measure it; returns
    its settings, metrics and wall time (the data's loading and encoding included). seed seeds the fit and,
    unless split_seed is given, the split (the model's: the same seed for both)."""
    if arm not in ("a", "b"):
        raise ValueError(f"arm: expected 'a' (gemm + static heads) or 'b' (config network), got {arm!r}")
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    split_seed = seed if split_seed is None else split_seed
    d, static, xs = _load(data, split_seed)
    ts = replace(TrainSettings(data=(data,), seed=seed, progress=False), hidden=tuple(hidden), epochs=epochs)
    test, st, x_test, xs_test = _test_rows(d, static, xs)
    if arm == "a":
        torch.manual_seed(seed)
        gemm = fit_members(lambda: new_gemm_head(d.enc.names, ts), members, d.x, d.y, d.row_split, d.gemm.problem_idx,
                           ts, False, epochs, "gemm", ts.rank_weight, average="after_floor")
        sh = fit_static_rows(d.gemm, static, d.split, xs, StaticHeadSettings(epochs=static_epochs, seed=seed))
        metrics = arm_a_metrics(gemm, sh, x_test, xs_test, test, st)
        val_metrics = arm_a_metrics(gemm, sh, *_val_inputs(d, static, xs))
    else:
        net = fit_config_net(joint_rows(d.gemm, static, d.split, d.x, xs), d.enc.names, ts, epochs, members)
        metrics = arm_b_metrics(net, x_test, xs_test, test, st)
        val_metrics = arm_b_metrics(net, *_val_inputs(d, static, xs))
    return {"arm": arm, "epochs": epochs, "members": members, "hidden": list(hidden),
            "static_epochs": static_epochs if arm == "a" else None, "seed": seed, "split_seed": split_seed,
            "threads": torch.get_num_threads(), "seconds": time.perf_counter() - t0,
            "rows": {"gemm": int(len(d.gemm.ms)), "gemm_static": int(len(static.ms))}, "metrics": metrics,
            "val_metrics": val_metrics}


def _val_inputs(d, static: GemmTable, xs: torch.Tensor) -> tuple:
    """The arm metrics' inputs (x, static x, table, static table) for the val problems."""
    val, sv, x_val, xs_val = _test_rows(d, static, xs, which=1)
    return x_val, xs_val, val, sv


def fit_static_rows(table: GemmTable, static: GemmTable, split: np.ndarray, xs: torch.Tensor,
                    s: StaticHeadSettings) -> PerfMLP:
    """The static head as static_head.fit_static_head fits it (the log ratio static / dataset time on
    the paired rows of the train problems), without its figures."""
    rows, prob, part = paired_split(table, static, split)
    ok = rows >= 0
    y = torch.from_numpy(np.log(static.ms) - np.log(np.where(ok, table.ms[np.maximum(rows, 0)], 1.0))).float()
    train = torch.from_numpy(ok & (part == 0))
    return fit(xs[train], y[train], s, log=lambda *a: None)


def new_gemm_head(names: list[str], settings: Any) -> PerfMLP:
    """The gemm head as train/pipeline.py fit_heads makes each member."""
    return PerfMLP(MLPConfig(len(names), tuple(settings.hidden), settings.norm,
                             floor_features=floor_features(names, 1)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.config_net_arms", description=__doc__.split("\n")[0])
    p.add_argument("--arm", required=True, choices=("a", "b"))
    p.add_argument("--data", type=Path, default=Path("data/h100"))
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--hidden", default="256,256,256")
    p.add_argument("--members", type=int, default=3, help="seeds averaged into the gemm head / the network")
    p.add_argument("--static-epochs", type=int, default=80, help="the static head's (arm a)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-seed", type=int, help="the split's seed (default: --seed, as a model's build has it): "
                                                   "another --seed with --split-seed 0 refits on the shipped split")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    a = p.parse_args(argv)
    result = run_arm(a.arm, a.data, a.epochs, tuple(int(h) for h in a.hidden.split(",")), a.static_epochs, a.seed,
                     a.threads, a.members, a.split_seed)
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
