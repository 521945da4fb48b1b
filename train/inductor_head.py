"""The inductor head: the config network's inductor mode, fitted on its own (`perfmodel build --only gemm_inductor`).

A model whose gemm head is a config network (train/config_net.py, `[train].config_net = true`) serves
kernel="inductor" from that one network. A model of several devices cannot be built that way today: its gemm
head is trained on every device's rows, while the static rows (the `gemm_static` parts, the dataset's problems
timed as Inductor compiles its mm template) exist per device, and refitting the gemm head moves every
autotune-mode decision the model's whole-model figures were measured with. The inductor head is that config
network fitted beside the gemm head instead: the same MLP, inputs (the gemm encoder's features and the kernel-mode
flag), loop and loss (fit_config_net), on every data folder with static rows -- each folder's gemm rows (flag 0)
and static rows (flag 1), encoded for its device, each mode's rows of a problem a group -- then stored with the
flag folded in at its inductor value (PerfMLP.with_input): a head on the gemm encoder's features that the folder
stores as INDUCTOR_GEMM and that serves kernel="inductor" as a config network's inductor mode does. The gemm
head, and with it kernel="autotune", is left as it was.

It is split by family by default (whole weight shapes held out on every device, train/families.py): its figures
are the held-out-by-family ranking of Inductor's template on the test families' static rows. Needs Lightning
(the loop), not MLflow.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from perfmodel import artifact

from .config_net import AUTOTUNE, INDUCTOR, JointRows, fit_config_net, joint_rows, with_mode
from .folder import SHARD_KINDS, append_step, data_sha256, settings_record, step_record, write_model_folder
from .static_head import has_static_rows, load_static, mode_figures, paired_split, split_static

SPLITS = ("family", "problem")
READS = tuple(k for k in SHARD_KINDS if k != "bmm")  # the shard kinds the fit reads (its record hashes them)


@dataclass
class InductorSettings:
    """The fit's settings: the gemm head's of the recipes (recipes/h100.toml [train]), the split by family."""

    hidden: tuple[int, ...] = (256, 256, 256)
    norm: str = "batch"
    members: int = 3
    epochs: int = 60
    lr: float = 2e-3
    weight_decay: float = 1e-5
    rank_weight: float = 2.0
    rank_tau: float = 0.3
    problems_per_batch: int = 16
    split: str = "family"     # the held-out split of the folders' problems: "family" or "problem" (the model's seed)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {self.split!r}")
        for name in ("members", "epochs", "problems_per_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if not self.hidden or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.hidden):
            raise ValueError(f"hidden: expected positive widths, got {self.hidden!r}")

    def train_settings(self, folders: Sequence[Path]) -> Any:
        """The TrainSettings that load_data and the loop take (the Trainer's defaults, no progress bar)."""
        from .pipeline import TrainSettings

        return TrainSettings(data=tuple(folders), split=self.split, seed=self.seed, hidden=tuple(self.hidden),
                             norm=self.norm, lr=self.lr, weight_decay=self.weight_decay, rank_weight=self.rank_weight,
                             rank_tau=self.rank_tau, problems_per_batch=self.problems_per_batch, epochs=self.epochs,
                             gemm_members=self.members, progress=False, register_name=None)


def device_rows(d: Any, log: Any = print, kind: str = "gemm_static", what: str = "inductor-head",
                plain: bool = False, record: dict | None = None
                ) -> tuple[JointRows, list[tuple[Any, Any, np.ndarray, np.ndarray | None]], dict[str, int]]:
    """The fit's rows over every dataset of d (train/pipeline.py TrainData) that has static rows: each one's gemm
    rows and static rows (joint_rows), encoded with its device's spec, groups offset past the earlier devices'; and
    per such dataset (DeviceDataset, its static table, its split). ValueError where none has static rows. A
    dataset's gemm rows are d.x's (encoded once by load_data, each dataset's rows contiguous, in its order).
    kind: the second mode's shard kind (gemm_static: Inductor's template; gemm_tutorial: the tutorial's kernel).
    plain: a dataset without such rows still gives its gemm rows (flag 0), so that the network knows its device
    in the first mode and the second mode's difference, learnt on the other devices, carries over.
    record: the family split (held_out_record) where the fit is split by family: then the second mode's rows of
    problems the gemm rows lack (the tutorial kernel's own shapes) join the fit too, split by train/families.py
    extra_sides; without it they are left out. Also returns the extra keys' sides (with_extra_keys)."""
    from .families import extra_sides, family_keys
    from .pipeline import encode_by_device

    row_device = d.problem_device[d.gemm.problem_idx]
    parts, used, offset, extra = [], [], 0, {}
    gemm_keys = {k for ds in d.datasets for k in family_keys(ds.gemm.problems)} if record is not None else set()
    for ds in d.datasets:
        split = d.split[d.problem_device == ds.device]
        x_gemm = d.x[torch.from_numpy(row_device == ds.device)]
        if not has_static_rows(ds.folder, kind):
            log(f"{what}: {ds.folder} ({ds.device}) has no {kind} rows: its device is served from the "
                f"other devices' {kind} rows" + (" and its own gemm rows" if plain else ""))
            if plain:
                parts.append(JointRows(with_mode(x_gemm, AUTOTUNE), torch.from_numpy(np.log(ds.gemm.ms)).float(),
                                       split[ds.gemm.problem_idx], ds.gemm.problem_idx + offset))
                offset += 2 * len(ds.gemm.problems)
            continue
        static = load_static(ds.folder, kind)
        with torch.inference_mode():
            xs = encode_by_device(d.specs, "gemm", np.full(len(static.ms), ds.device, dtype=object),
                                  torch.from_numpy(static.problems[static.problem_idx]),
                                  torch.from_numpy(static.configs))
        st_split = None
        if record is not None:
            st_split, more = extra_sides(static.problems, record, gemm_keys)
            extra.update(more)
        rows = joint_rows(ds.gemm, static, split, x_gemm, xs, st_split)
        rows.groups = np.where(rows.groups >= 0, rows.groups + offset, -1)
        offset += 2 * len(ds.gemm.problems) + len(static.problems)
        parts.append(rows)
        used.append((ds, static, split, st_split))
        own = len(set(static.problem_keys) - set(ds.gemm.problem_keys))
        log(f"{what}: {ds.device}: {len(ds.gemm.ms)} gemm rows, {len(static.ms)} {kind} rows "
            f"({len(static.problems)} problems, {own} of them not in the gemm rows"
            + ("" if st_split is not None or not own else ": left out, the fit is not split by family") + ")")
    if not used:  # (a folder's plain gemm rows alone fit no second mode)
        raise ValueError(f"data: no folder has {kind} rows (the mode's data: perfmodel gen static"
                         f"{'' if kind == 'gemm_static' else ' --kind ' + kind})")
    return JointRows(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]),
                     np.concatenate([p.split for p in parts]), np.concatenate([p.groups for p in parts])), used, extra


def fit_inductor_head(bundle: artifact.ModelBundle, folders: Sequence[Path], s: InductorSettings,
                      log: Any = print, datasets: list | None = None, kind: str = "gemm_static",
                      what: str = "inductor-head", plain: bool = False) -> tuple[Any, dict[str, Any]]:
    """(the inductor head, its metadata entries) for bundle on the data folders (one per device of the model, in its
    order; those without static rows fit nothing): the config network fitted on their rows, its inductor mode
    folded; figures per device on its test problems' static rows, ranked by the serving path with the head (keys
    "test_static/static_head/...") and with the autotune mode ("test_static/without/..."). datasets: the folders'
    DeviceDatasets where the caller has loaded them (a build), else they are read. kind: the second mode's rows
    (gemm_tutorial fits train/tutorial_head.py's head the same way); what: the log lines' name."""
    from .pipeline import load_data

    if len(folders) > len(bundle.devices):
        raise ValueError(f"data: {len(folders)} folders for a model of {len(bundle.devices)} device(s) "
                         f"({', '.join(bundle.devices)}): one per device, in that order")
    if bundle.lead_keep and s.members < 2:  # the lead member passes configs on to the whole ensemble, in both modes
        raise ValueError(f"members: this model's ranking passes its lead member's best {bundle.lead_keep} on to the "
                         f"whole ensemble (lead_keep), which needs an ensemble: at least 2 members, got {s.members}")
    t0 = time.perf_counter()
    ts = s.train_settings(folders)
    d = load_data(ts, datasets)
    unknown = [dev for dev in d.devices if dev not in bundle.devices]
    if unknown:
        raise ValueError(f"data: {', '.join(unknown)} timings, for a model of {', '.join(bundle.devices)}")
    if d.enc.names != bundle.encoders["gemm"].names:
        raise ValueError("data: the folders' gemm features differ from the model's gemm head's (encoder version "
                         f"{d.enc.version} against {bundle.encoders['gemm'].version})")
    record = None
    if s.split == "family":
        from .families import held_out_record

        record = held_out_record(d.datasets, s.seed)
    rows, used, extra = device_rows(d, log, kind, what, plain, record)
    log(f"{what}: fitting {s.members} member(s), {s.epochs} epochs, on {len(rows.y)} rows, split by {s.split}")
    torch.manual_seed(s.seed)
    net = fit_config_net(rows, d.enc.names, ts, s.epochs, s.members, False)
    head = net.with_input(net.cfg.n_inputs - 1, INDUCTOR)
    metrics: dict[str, Any] = {"split": s.split, "seed": s.seed, "rows": int(len(rows.y)),
                               "rows/train": int((rows.split == 0).sum()), "devices": {}}
    served = artifact.ModelBundle(bundle.spec, {**bundle.heads, artifact.INDUCTOR_GEMM: head},
                                  {**bundle.encoders, artifact.INDUCTOR_GEMM: bundle.encoders["gemm"]},
                                  bundle.metadata)
    for ds, static, split, st_split in used:
        st = split_static(ds.gemm, static, split, static_split=st_split)
        if st_split is None:
            _, prob, part = paired_split(ds.gemm, static, split)
            train = len(set(prob[part == 0].tolist()))
        else:
            train = int((st_split == 0).sum())
        m = {"static_rows": int(len(static.ms)), "static_problems": int(len(static.problems)),
             "problems/train": int(train)}
        if len(st.problems):
            m.update(mode_figures(served.for_device(ds.device), head, st, log, f"{what} ({ds.device})",
                                  ("autotune mode", what.replace("-", " "))))
        metrics["devices"][ds.device] = m
    if record is not None:
        from .families import with_extra_keys

        metrics["family_split"] = with_extra_keys(record, extra) if extra else record
    reads = READS if kind == "gemm_static" else ("gemm", kind)
    metrics["data"] = [{**data_sha256(ds.folder, reads), "device": ds.device} for ds in d.datasets]
    metrics["seconds"] = time.perf_counter() - t0
    return head, metrics


def inductor_step(bundle: artifact.ModelBundle, folders: Sequence[Path], s: InductorSettings,
                  log: Any = print, datasets: list | None = None) -> dict[str, Any]:
    """fit_inductor_head into bundle: the head as INDUCTOR_GEMM (on the gemm encoder), metadata "inductor_metrics"
    and "inductor_settings"; returns the metrics. ValueError for a model whose gemm head is a config network (it
    serves kernel="inductor" itself)."""
    if bundle.config_net is not None:
        raise ValueError("inductor: this model's gemm head is a config network, which serves kernel='inductor' "
                         "itself; the inductor head is for a model without one")
    head, metrics = fit_inductor_head(bundle, folders, s, log, datasets)
    bundle.heads[artifact.INDUCTOR_GEMM] = head
    bundle.encoders[artifact.INDUCTOR_GEMM] = bundle.encoders["gemm"]
    bundle.metadata = {**bundle.metadata, "inductor_metrics": metrics, "inductor_settings": settings_record(s)}
    return metrics


def refit_inductor(s: Any, model: Path, data: Sequence[Path], log: Any = print, command: str = "") -> dict[str, Any]:
    """`perfmodel build --only gemm_inductor`: the inductor head of the folder `model` (train/inductor_head.py
    inductor_step) on the data folders (one per device of the model, in its order), added in place."""
    return refit_mode_head(inductor_step, "inductor-head", s, model, data, log, command)


def refit_mode_head(step_fn: Any, name: str, s: Any, model: Path, data: Sequence[Path], log: Any = print,
                    command: str = "") -> dict[str, Any]:
    """A mode head's `build --only`: step_fn(bundle, data, s, log) (inductor_step, tutorial_step) on the folder
    `model`, recorded as build step `name` (a refit), the folder rewritten in place; returns step_fn's metrics."""
    from .refit import load_model

    t0 = time.perf_counter()
    bundle = load_model(model, 0)
    metrics = step_fn(bundle, data, s, log)
    step = step_record(name, settings_record(s), time.perf_counter() - t0, refit=True, command=command)
    bundle.metadata = append_step(bundle.metadata, step)
    write_model_folder(bundle, bundle.metadata, model)
    return metrics


__all__ = ["InductorSettings", "fit_inductor_head", "inductor_step", "refit_inductor", "refit_mode_head"]
