"""The bmm Triton head's members and regularisation, measured on the shipped split (CPU).

Fits N members of the bmm Triton head one after the other on the train problems of `models/h100`'s split by
shape (the recipe's `[bmm]` settings, seeds seed .. seed + N - 1, as the shipped fit seeds them), and after each
member scores the ensemble of the first 1, 2, ..., N on the val and test problems (top-1 / top-5 per dtype mode:
train/bmm_head.py bmm_metrics, with the folder's own call head). The first three members are the shipped head's,
so the 3-member figures reproduce the folder's `bmm_metrics`. `--set key=value` overrides a BmmHeadSettings
field (weight_decay, epochs, hidden=128,128,128, ...) and `dropout` the members' dropout. `--stacked` gives the
head one more input: the folder's config network's inductor-mode log ms of one matrix of the batch with the config
(on the batch-1 static rows that is the network's fit of its own training rows).

    python -m benchmarks.studies.bmm_members --members 6 --out benchmarks/results/bmm_members6_split_h100.json
    python -m benchmarks.studies.bmm_members --members 2 --set weight_decay=0.01 --out FILE.json
    python -m benchmarks.studies.bmm_members --members 2 --stacked --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO

from perfmodel import artifact
from perfmodel.features import FeatureEncoder
from perfmodel.model import MLPConfig, PerfMLP
from perfmodel.train import bmm_head as bh
from perfmodel.train.recipe import load_recipe
from perfmodel.train.refit import model_seed


def settings(recipe: Path, overrides: list[str]) -> tuple[bh.BmmHeadSettings, float]:
    """The recipe's [bmm] settings with the overrides, and the members' dropout."""
    s = load_recipe(recipe).bmm
    over = dict(o.split("=", 1) for o in overrides)
    dropout = float(over.pop("dropout", 0.0))
    types = {f.name: getattr(s, f.name) for f in fields(s)}
    for k, v in over.items():
        if k not in types:
            raise SystemExit(f"--set: {k!r} is not a BmmHeadSettings field")
        over[k] = tuple(int(x) for x in v.split(",")) if isinstance(types[k], tuple) else type(types[k])(v)
    return replace(s, **over), dropout


def one_matrix_log_ms(bundle: artifact.ModelBundle, table: bh.BmmTable) -> torch.Tensor:
    """(rows, 1): the config network's inductor-mode log ms of one matrix of each row's batch with its config."""
    enc = FeatureEncoder(bundle.spec, "gemm", bundle.encoders["gemm"].version)
    with torch.inference_mode():
        g = enc.encode(torch.from_numpy(table.problems[table.problem_idx][:, :8]), torch.from_numpy(table.configs))
        return bundle.heads[artifact.INDUCTOR_GEMM].eval()(g).float().reshape(-1, 1)


def occupancy(spec, table: bh.BmmTable) -> torch.Tensor:
    """(rows, 4): resident programs an SM holds (log), the grid's waves over all SMs' resident slots (log), the
    last wave's fill, and whether the accumulator alone passes the register limit. The bmm features count waves
    as one program an SM; a small tile runs several at once, a large one with many stages one."""
    p = table.problems[table.problem_idx].astype(np.float64)
    c = table.configs.astype(np.float64)
    m, n, db, batch = p[:, 0], p[:, 1], p[:, 3], p[:, 8]
    bm, bn, bk, stages, warps = c[:, 0], c[:, 1], c[:, 2], c[:, 4], c[:, 5]
    threads = 32 * warps
    smem = np.maximum(stages, 1) * (bm + bn) * bk * db + 1024
    acc = bm * bn / threads                                         # fp32 accumulator registers a thread
    regs = np.minimum(np.ceil((acc + 32) / 8) * 8, spec.registers_per_thread_max)
    per_sm = np.minimum.reduce([np.floor((spec.shared_memory_per_block_optin + 1024) / smem),
                                np.floor(2048 / threads), np.floor(65536 / (regs * threads)), np.full_like(m, 32)])
    per_sm = np.maximum(per_sm, 1)
    programs = np.ceil(m / bm) * np.ceil(n / bn) * batch
    slots = spec.sm_count * per_sm
    waves = np.ceil(programs / slots)
    cols = [np.log(per_sm), np.log(programs / slots), programs / (waves * slots), (acc + 32 > spec.registers_per_thread_max).astype(float)]
    return torch.from_numpy(np.stack(cols, 1)).float()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--model", type=Path, default=REPO / "models/h100")
    ap.add_argument("--data", type=Path, default=REPO / "data/h100")
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes/h100.toml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stacked", action="store_true", help="the config network's one-matrix log ms as an input")
    ap.add_argument("--occupancy", action="store_true", help="resident programs an SM and the waves they make as inputs")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    bundle = artifact.load(a.model)
    s, dropout = settings(a.recipe, a.set)
    s = replace(s, seed=model_seed(bundle))
    if dropout:
        def new_head(n_inputs, hidden, seed, floor):
            torch.manual_seed(seed)
            return PerfMLP(MLPConfig(n_inputs, tuple(hidden), "none", floor_features=(floor,), dropout=dropout))
        bh.new_head = new_head
    table = bh.load_bmm_checked(a.data, bundle.devices[0])
    version = bundle.encoders["gemm"].version
    split = bh.split_by_shape(table, model_seed(bundle))
    extra = bh.static_table(a.data)
    x, xa = bh.encode(table, bundle.spec, version)
    xe = bh.encode(extra, bundle.spec, version)[0]
    if a.stacked:
        x, xe = torch.cat([x, one_matrix_log_ms(bundle, table)], 1), torch.cat([xe, one_matrix_log_ms(bundle, extra)], 1)
    if a.occupancy:
        x, xe = torch.cat([x, occupancy(bundle.spec, table)], 1), torch.cat([xe, occupancy(bundle.spec, extra)], 1)
    y = torch.from_numpy(np.log(table.ms)).float()
    tr = split[table.problem_idx] == 0
    xt = torch.cat([x[torch.from_numpy(tr)], xe])
    yt = torch.cat([y[torch.from_numpy(tr)], torch.from_numpy(np.log(extra.ms)).float()])
    group = np.concatenate([table.problem_idx[tr], extra.problem_idx + len(table.problems)])
    floor = bh.floor_column("bmm", bundle.spec, version)
    pred_call = bh.score(bundle.heads[artifact.BMM_CALL], xa)
    res = {"settings": {k: str(v) for k, v in vars(s).items() if k not in ("model", "data")}, "dropout": dropout,
           "stacked": a.stacked, "occupancy": a.occupancy,
           "problems": {"val": int((split == 1).sum()), "test": int((split == 2).sum())}, "ensembles": {}}
    members = []
    for i in range(a.members):
        t0 = time.perf_counter()
        members.append(bh.fit_ranked(xt, yt, group, s, s.seed + i, floor, len(table.problems)))
        head = members[0] if i == 0 else PerfMLP.ensemble(members, "before_floor")
        pred = bh.predict_log_ms(head, x)
        m = bh.bmm_metrics(table, split, pred, bh.implied_aten_log_ms(table, pred, pred_call), pred_call)
        res["ensembles"][str(i + 1)] = {k: v for k, v in m.items() if k.split("/")[0] in ("val", "test")
                                        and k.endswith(("top1_eff", "top5_eff")) and "inductor_list" not in k}
        e = res["ensembles"][str(i + 1)]
        print(f"{i + 1} member(s) ({time.perf_counter() - t0:.0f} s): val top-1 {e['val/all/top1_eff']:.4f}, "
              f"test top-1 {e['test/all/top1_eff']:.4f}", flush=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
