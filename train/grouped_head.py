"""The grouped-GEMM head: Inductor's `triton_grouped_mm` template for MoE experts (`torch._grouped_mm`), fitted on
a dataset folder's `grouped` rows (`perfmodel gen grouped`, data_gen/grouped_sweep.py).

A grouped GEMM multiplies G experts' weights B[g] (K, N) with the tokens routed to each, A[offs[g-1]:offs[g]]
(total_M, K) in all; Inductor's template runs it as one persistent kernel whose programs walk every expert's
tiles. Its configs are (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): the bmm template's without GROUP_M.
So a grouped problem is encoded as the batched GEMM it equals under even routing -- batch G, M the tokens per
expert (ceil(total_M / G)), the expert's N and K, B transposed where the weights are stored (G, N, K) -- on the
"bmm" encoder (one matrix's GEMM features, the batch, the whole batch's roofline and the grid of tiles x batch
in waves: perfmodel/features.py), and a config as a GemmConfig with GROUP_M 8 (a constant of every row).

The target of a config is the geometric mean of its times over the sweep's routings (Inductor's even offsets and
the skewed ones): the routing is not known when a model compiles, and the ranking should hold for any. The head
is the bmm head's kind (train/bmm_head.fit_ranked: smooth L1 on the floored log ms plus the within-problem
ranking term, an average of members), fitted on the grouped rows and the device's bmm rows (a share of them an
epoch). Configs rank by the head's score (before its floors), a config whose accumulator spills last (as served:
perfmodel/configs.py SPILL_REGISTERS). Held out by model family (every
problem of one family's widths out at a time): top-1 / top-5 efficiency of the best timed config, and how often
the best ranked config beats aten's `_grouped_mm`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel.configs import spill_scores
from perfmodel.features import BMM_PROBLEM_COLUMNS
from perfmodel.model import PerfMLP

from .bmm_head import BmmHeadSettings, BmmTable, encode, fit_ranked, floor_column, score
from .loop import fit_ensemble

KIND = "grouped"
GROUPED = "grouped"  # the head's name in a model folder
GROUP_M = 8  # the grouped template has no GROUP_M; the config's column holds a constant


@dataclass
class GroupedSettings:
    """The fit's settings. Four were tried on the family-held-out figures (epochs 20 / 40, bmm share 0.2 / 0.5,
    rank weight 3 / 10): pooled top-1 0.972-0.984, top-5 0.994-0.998, within what 10 held-out problems can tell
    apart; the first is kept (docs/model.md, "Grouped GEMMs")."""

    hidden: tuple[int, ...] = (128, 128, 128)
    members: int = 3
    epochs: int = 20
    lr: float = 2e-3
    weight_decay: float = 1e-4
    rank_weight: float = 3.0
    problems_per_batch: int = 8
    # the device's bmm rows (perfmodel gen bmm) join the fit, a share of their problems drawn into each epoch
    # (every grouped problem in every epoch): they teach the template's kind of kernel at sizes the grouped
    # sweep has few of. 0: the grouped rows alone
    bmm_share: float = 0.2
    seed: int = 0

    def bmm(self) -> BmmHeadSettings:
        return BmmHeadSettings(hidden=self.hidden, members=self.members, epochs=self.epochs, lr=self.lr,
                               weight_decay=self.weight_decay, rank_weight=self.rank_weight,
                               problems_per_batch=self.problems_per_batch, static_rows=False,
                               static_share=self.bmm_share if self.bmm_share > 0 else 1.0, seed=self.seed)


def problem_row(r: dict[str, Any]) -> list[float]:
    """A grouped row's problem as the equal batched GEMM (BMM_PROBLEM_COLUMNS): M = tokens per expert, batch G."""
    m = max(1, math.ceil(r["total_m"] / r["g"]))
    dt = r["dtype"]
    return [m, r["n"], r["k"], 4 if dt == "float32" else 2, float(dt == "bfloat16"), 0.0, 0.0,
            float(r["b_layout"] == "kmajor"), r["g"]]


def problem_key(r: dict[str, Any]) -> tuple:
    return (r["family"], r["gemm"], r["g"], r["total_m"], r["k"], r["n"], r["b_layout"], r["dtype"])


def table_from_rows(rows: list[dict[str, Any]]) -> BmmTable:
    """The grouped rows as a BmmTable: per problem (one compile: shape, dtype, layout) the geomean over routings of
    each config's time and of aten's; families are the model families (the held-out unit)."""
    times: dict[tuple, dict[Any, list[float]]] = {}
    first: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("kind") not in ("triton", "aten") or not r.get("ms"):
            continue
        key = problem_key(r)
        first.setdefault(key, r)
        cfg = "aten" if r["kind"] == "aten" else (r["block_m"], r["block_n"], r["block_k"], GROUP_M,
                                                   r["num_stages"], r["num_warps"])
        times.setdefault(key, {}).setdefault(cfg, []).append(float(r["ms"]))
    keys = [k for k in times if any(c != "aten" for c in times[k])]
    if not keys:
        raise ValueError("data: no timed Triton grouped rows (perfmodel gen grouped)")
    gm = lambda v: float(np.exp(np.mean(np.log(v))))  # noqa: E731
    pidx, cfgs, ms = [], [], []
    for i, k in enumerate(keys):
        for c, v in times[k].items():
            if c != "aten":
                pidx.append(i), cfgs.append(c), ms.append(gm(v))
    aten = np.array([gm(times[k]["aten"]) if "aten" in times[k] else np.nan for k in keys])
    probs = np.array([problem_row(first[k]) for k in keys], dtype=np.float64).reshape(-1, len(BMM_PROBLEM_COLUMNS))
    return BmmTable(probs, np.array([first[k]["dtype"] for k in keys]), np.array([k[0] for k in keys]),
                    np.arange(len(keys)), aten, np.array(pidx), np.array(cfgs, dtype=np.float64),
                    np.array(ms), np.ones(len(ms), dtype=bool))


def load(folder: Path) -> BmmTable:
    """The folder's grouped shards as a table; FileNotFoundError naming data where it has none."""
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(Path(folder), KIND)
    if not rows:
        raise FileNotFoundError(f"data: no {KIND} shards in {folder} (perfmodel gen grouped)")
    return table_from_rows(rows)


def fit(table: BmmTable, train: np.ndarray, spec: Any, version: int, s: GroupedSettings,
        bmm: BmmTable | None = None) -> PerfMLP:
    """The grouped head (an average of s.members members) fitted on the problems where train is True, and on bmm's
    rows (the device's bmm table) where s.bmm_share > 0."""
    x, _ = encode(table, spec, version)
    rows = train[table.problem_idx]
    xt, yt, group = [x[torch.from_numpy(rows)]], [torch.from_numpy(np.log(table.ms[rows])).float()], \
        [table.problem_idx[rows]]
    extra_from = None
    if bmm is not None and s.bmm_share > 0:
        extra_from = len(table.problems)
        xt.append(encode(bmm, spec, version)[0])
        yt.append(torch.from_numpy(np.log(bmm.ms)).float())
        group.append(bmm.problem_idx + extra_from)
    xt, yt, group = torch.cat(xt), torch.cat(yt), np.concatenate(group)
    f, bs = floor_column("bmm", spec, version), s.bmm()
    return fit_ensemble(lambda i: fit_ranked(xt, yt, group, bs, s.seed + i, f, extra_from), s.members, "before_floor")


def figures(table: BmmTable, pred: np.ndarray, which: np.ndarray) -> dict[str, Any]:
    """pred: each row's score (the head's output before its floors, which never reorder a problem's configs but
    tie those floored at the roofline). Per problem where `which`: top-1 / top-5 efficiency (best timed ms / timed ms of the predicted best, or the
    best of the predicted top 5) and whether the predicted best beats aten's time; geomeans and the worst."""
    out = []
    for i in np.flatnonzero(which):
        rows = np.flatnonzero(table.problem_idx == i)
        order = rows[np.argsort(pred[rows], kind="stable")]
        best = table.ms[rows].min()
        out.append((best / table.ms[order[0]], best / table.ms[order[:5]].min(),
                    bool(table.ms[order[0]] < table.aten_ms[i]) if np.isfinite(table.aten_ms[i]) else None))
    if not out:
        return {"problems": 0}
    t1, t5 = np.array([o[0] for o in out]), np.array([o[1] for o in out])
    calls = [o[2] for o in out if o[2] is not None]
    return {"problems": len(out), "top1": float(np.exp(np.log(t1).mean())), "top5": float(np.exp(np.log(t5).mean())),
            "top1_min": float(t1.min()), "top5_min": float(t5.min()),
            "ranked_best_beats_aten": float(np.mean(calls)) if calls else None}


def cross_validate(table: BmmTable, spec: Any, version: int, s: GroupedSettings, bmm: BmmTable | None = None,
                   log: Any = print) -> dict[str, Any]:
    """Every model family held out once: the head fitted on the others, figures on the held-out problems; the
    pooled figures over all held-out problems, and per family."""
    pred = np.full(len(table.ms), np.nan)
    per: dict[str, Any] = {}
    x, _ = encode(table, spec, version)
    for fam in sorted(set(table.families)):
        out = table.families == fam
        head = fit(table, ~out, spec, version, s, bmm)
        rows = out[table.problem_idx]
        c = table.configs[rows]
        pred[rows] = score(head, x[torch.from_numpy(rows)]) + spill_scores(c[:, 0], c[:, 1], c[:, 5])
        per[fam] = figures(table, pred, out)
        log(f"grouped-head: {fam} held out: {per[fam]}")
    return {"pooled": figures(table, pred, np.ones(len(table.problems), dtype=bool)), "families": per}


def data_record(folder: Path) -> dict[str, Any]:
    """The folder as given and the sha256 of its grouped shard files (in name order), for the build record."""
    from .bmm_data import shard_record

    return shard_record(folder, KIND)


def grouped_step(bundle: Any, folder: Path, s: GroupedSettings, log: Any = print) -> dict[str, Any] | None:
    """Fit the grouped head on folder's grouped rows (timed on one device of the model, encoded with its spec) and
    that device's bmm rows, with the figures held out by family, and add it to bundle (metadata grouped_metrics,
    grouped_settings); None, after a message, where the folder has no grouped rows (the bundle unchanged)."""
    from dataclasses import asdict

    from perfmodel.data_gen.shards import part_files, read_dataset
    from perfmodel.features import FeatureEncoder

    from .bmm_head import has_bmm_rows, load_bmm_checked

    if not part_files(Path(folder), KIND):
        log(f"grouped-head: skipped: {folder} has no grouped rows (perfmodel gen grouped)")
        return None
    rows, headers = read_dataset(Path(folder), KIND)
    timed = {h.get("device_spec") for h in headers}
    if len(timed) != 1 or not timed <= set(bundle.devices):
        raise ValueError(f"data: the grouped shards of {folder} were timed on {sorted(map(str, timed))}; the model "
                         f"serves {', '.join(bundle.devices)} (one device's shards, of those)")
    device = timed.pop()
    spec = bundle.device_specs[device]
    table = table_from_rows(rows)
    version = int(bundle.metadata.get("encoder_version", 3))
    bmm = load_bmm_checked(Path(folder), device) if has_bmm_rows(Path(folder)) else None
    cv = cross_validate(table, spec, version, s, bmm, log)
    log(f"grouped-head: held out by family, pooled: {cv['pooled']}")
    bundle.heads[GROUPED] = fit(table, np.ones(len(table.problems), dtype=bool), spec, version, s, bmm)
    bundle.encoders[GROUPED] = FeatureEncoder(bundle.spec, "bmm", version)
    metrics = {"device": device, "heldout_by_family": cv, "problems": int(len(table.problems)),
               "rows": int(len(table.ms)),
               "families": sorted(set(map(str, table.families))), "data": data_record(Path(folder))}
    bundle.metadata = {**bundle.metadata, "grouped_metrics": metrics, "grouped_settings": asdict(s)}
    return metrics

