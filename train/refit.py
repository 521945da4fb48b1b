"""The steps that add a head to a model bundle in memory -- the student, the problem network, the bmm heads, the
grouped head -- and the refits (`perfmodel build --only HEAD`) that run one of them on a model folder: load it,
fit, append the step to the folder's build record (train/folder.py) and rewrite the folder atomically. `perfmodel
build` (train/recipe.py) runs the same steps in order. The fitters themselves (train/distill.py, problem_head.py,
bmm_head.py, grouped_head.py) return (head, metrics) and write nothing. No step writes a head of an older layout
(perfmodel/heads/legacy.py: the screen, static, cublas and call heads)."""
from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.locations import default_data_dir

from . import evaluate as ev
from .bmm_head import (BmmHeadSettings, bmm_data_record, cross_validate, fit_bmm_heads, has_bmm_rows, load_bmm_checked,
                       other_device_split, split_by_shape, static_table, zero_shot_figures)
from .data import (GemmTable, concat_gemm, joint_split, load_device_datasets, load_gemm, parse_device_fractions,
                   subsample_training)
from .distill import DistillSettings, fit_student_head
from .folder import append_step, setting_value, settings_record, step_record, write_model_folder
from .problem_head import ProblemHeadSettings, fit_problem_head, with_problem_head
from .static_head import load_static


# ---------------------------------------------------------------- the steps (a bundle in memory)

def student_step(bundle: artifact.ModelBundle, datasets: list, s: DistillSettings, log: Any = print,
                 split: np.ndarray | None = None) -> dict[str, Any]:
    """Fit the student of bundle's gemm head on datasets (DeviceDatasets, one per device of the model in its
    order) and add it to bundle; returns the metadata entries added. split: the model's split of the
    datasets' problems, concatenated (default: the joint split with the model's seed, its device_fraction's
    left-out training problems unused)."""
    table = concat_gemm([ds.gemm for ds in datasets])
    device = np.concatenate([np.full(len(ds.gemm.problems), ds.device, dtype=object) for ds in datasets])
    if split is None:
        split = subsample_training(np.concatenate(model_splits(bundle, datasets)), device, table.modes,
                                   bundle.metadata.get("device_fraction") or {}, model_seed(bundle))
    return add_student(bundle, table, s, log, split, device)


def add_student(bundle: artifact.ModelBundle, table: GemmTable, s: DistillSettings, log: Any = print,
                split: np.ndarray | None = None, problem_device: np.ndarray | None = None) -> dict[str, Any]:
    """fit_student_head on table (split, problem_device: as it takes them), the student added to bundle
    (heads, encoders, metadata); returns the metadata entries added."""
    student, added = fit_student_head(bundle, table, s, log, split=split, problem_device=problem_device)
    bundle.heads[artifact.STUDENT], bundle.encoders[artifact.STUDENT] = student, bundle.encoders["gemm"]
    if s.screens:  # one speed head: the student screens
        added["screen_head"] = artifact.STUDENT
    bundle.metadata = {**bundle.metadata, **added}
    return added


def inductor_figures_step(bundle: artifact.ModelBundle, ds: Any, split: np.ndarray | None = None,
                          log: Any = print) -> dict[str, Any]:
    """A config network's inductor-mode figures on ds's static rows (train/config_net.py inductor_figures; split:
    the model's split of ds's problems, default model_splits) into bundle's metadata "static_metrics", as the
    static head's step writes its own; after the screen and lead are set (they rank in both modes)."""
    from .config_net import inductor_figures

    split = model_splits(bundle, [ds])[0] if split is None else split
    metrics = inductor_figures(bundle, ds.gemm, load_static(ds.folder), split, log)
    bundle.metadata = {**bundle.metadata, "static_metrics": metrics}
    return metrics


def problem_step(bundle: artifact.ModelBundle, datasets: list, s: ProblemHeadSettings, log: Any = print,
                 splits: list[np.ndarray] | None = None) -> dict[str, Any]:
    """Fit the problem network (train/problem_head.py) on datasets and put it in bundle in place of the cublas,
    call and call_static heads (splits: each dataset's split of its problems, default model_splits); its
    figures into cublas_head_metrics and call_metrics, the held-out GEMM problems' cuBLAS figures
    re-evaluated with it. Returns its metrics."""
    splits = model_splits(bundle, datasets) if splits is None else splits
    fractions = parse_device_fractions(str(bundle.metadata.get("settings", {}).get("device_fraction") or ""))
    head, metrics = fit_problem_head(bundle, datasets, splits, s, fractions, model_seed(bundle), log)
    served = with_problem_head(bundle, head, tuple(metrics["outputs"]))
    bundle.heads, bundle.encoders = served.heads, served.encoders
    saved = {**settings_record(s, exclude=("data",)), "data": [setting_value(ds.folder) for ds in datasets]}
    meta = {k: v for k, v in served.metadata.items() if k not in ("call_settings", "cublas_head_settings")}
    meta.update({"cublas_head_metrics": metrics["cublas_head_metrics"], "call_metrics": metrics["call_metrics"],
                 "problem_settings": saved})
    devices = [ds.device for ds in datasets]
    by_call = metrics["call_metrics"].get("by_device") or {devices[0]: metrics["call_metrics"]}
    got = {ds.device: gemm_test_metrics(served.for_device(ds.device), ds.gemm, split_)
           for ds, split_ in zip(datasets, splits)}
    for dev, m in by_call.items():
        if f"{artifact.CALL}/test/choice_accuracy" in m:
            got[dev]["cublas/choice_accuracy"] = m[f"{artifact.CALL}/test/choice_accuracy"]
    merge_cublas_metrics(meta, devices, got)
    bundle.metadata = meta
def bmm_step(bundle: artifact.ModelBundle, folder: Path | Sequence[Path], s: BmmHeadSettings,
             log: Any = print) -> dict[str, Any] | None:
    """Fit the bmm heads (bmm, bmm_aten) on the bmm rows of folder (the model's default device's dataset; a list:
    one folder per device of the model, in its order, each with bmm rows fitted on, encoded for its device) with
    the model's seed and add them to bundle (bmm_metrics, bmm_settings); returns their metrics. None, after a
    message saying why, where the first folder has no bmm rows (the step is skipped, the bundle unchanged)."""
    from perfmodel.devices import get_spec
    from perfmodel.features import FeatureEncoder

    folders = [Path(folder)] if isinstance(folder, (str, Path)) else [Path(f) for f in folder]
    if len(folders) > len(bundle.devices):
        raise ValueError(f"data: {len(folders)} folders for a model of {len(bundle.devices)} device(s) "
                         f"({', '.join(bundle.devices)}): one per device, in that order")
    if not has_bmm_rows(folders[0]):
        log(f"bmm-head: skipped: {folders[0]} has no bmm rows (perfmodel gen bmm), so the model gets no bmm head")
        return None
    table = load_bmm_checked(folders[0], bundle.devices[0])
    version = bundle.encoders["gemm"].version
    split = split_by_shape(table, model_seed(bundle))
    others, used = [], [folders[0]]
    for f, dev in zip(folders[1:], bundle.devices[1:]):
        if not has_bmm_rows(f):
            log(f"bmm-head: {f} ({dev}) has no bmm rows: the heads serve {dev} from the other devices' rows")
            continue
        t = load_bmm_checked(f, dev)
        others.append((t, other_device_split(table, split, t, model_seed(bundle)), get_spec(dev)))
        used.append(f)
    extra = static_table(folders[0])  # the folder's gemm_static rows as batch-1 rows (s.static_rows)
    heads, metrics = fit_bmm_heads(table, split, bundle.spec, version, s, log, extra, others)
    metrics["zero_shot"] = zero_shot_figures(bundle, table, split)
    if s.cv_folds:
        metrics.update(cross_validate(table, bundle.spec, version, s, model_seed(bundle), extra, log))
    kinds = {artifact.BMM: "bmm", artifact.BMM_ATEN: "bmm_aten", artifact.BMM_CALL: "bmm_aten"}
    for name in kinds:  # the heads of an earlier fit go (a folder refitted without the bmm_aten head loses it)
        bundle.heads.pop(name, None)
        bundle.encoders.pop(name, None)
    for name, head in heads.items():
        bundle.heads[name] = head
        bundle.encoders[name] = FeatureEncoder(bundle.spec, kinds[name], version)
    data = bmm_data_record(folders[0]) if len(used) == 1 else [bmm_data_record(f) for f in used]
    settings = {**settings_record(s, exclude=("data",)), "data": data, "split_seed": model_seed(bundle)}
    bundle.metadata = {**bundle.metadata, "bmm_metrics": metrics, "bmm_settings": settings}
    return metrics


def model_splits(bundle: artifact.ModelBundle, datasets: list) -> list[np.ndarray]:
    """The model's split of each dataset's GEMM problems: the family split as its metadata records it for a
    model trained on one (settings.split "family", train/families.py), else the joint split by problem."""
    if bundle.metadata.get("settings", {}).get("split") == "family":
        from .families import joint_family_split

        return joint_family_split(datasets, model_seed(bundle), bundle.metadata.get("family_split"))[0]
    return joint_split(datasets, model_seed(bundle))[0]


def model_seed(bundle: artifact.ModelBundle) -> int:
    """The model's split seed (its metadata's settings.seed)."""
    return int(bundle.metadata.get("settings", {}).get("seed", 0))


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


def gemm_test_metrics(bundle: artifact.ModelBundle, table: GemmTable, split: np.ndarray) -> dict[str, float]:
    """evaluate.cublas_metrics on the model's test GEMM problems (split == 2) of one device (the bundle
    encoding for it; the call by the call head, if any)."""
    test = table.subset(split == 2)
    P, C = torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs)
    with torch.inference_mode():
        pred = ev.head_outputs(bundle.heads["gemm"], bundle.encoders["gemm"].encode(P, C))[1]
        best = np.full(len(test.problems), np.inf)
        np.minimum.at(best, test.problem_idx, pred)
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(test.problems))
        call = artifact.problem_output(bundle, artifact.CALL)
        return ev.cublas_metrics(test, ev.head_outputs(artifact.problem_output(bundle, "cublas"), cx)[1], best,
                                 None if call is None else call.eval().score(cx).double().numpy())


# ---------------------------------------------------------------- the refit commands (a model folder)

def load_model(model: Path, threads: int) -> artifact.ModelBundle:
    """The model folder a head is added to, with torch's CPU threads set (threads > 0)."""
    if threads > 0:
        torch.set_num_threads(threads)
    return artifact.load(model)


def model_datasets(s: Any, bundle: artifact.ModelBundle) -> list:
    """The DeviceDatasets of s.data (s: a head's settings), one folder per device of the model in its order.
    None gives the folders the model's metadata names where they exist (else, for a model of one device,
    the default dataset). ValueError naming data for folders that are not one per device in that order."""
    if s.data is None:
        known = [Path(d["path"]) for d in bundle.metadata.get("datasets") or [] if d.get("path")]
        if len(known) == len(bundle.devices) and all(p.is_dir() for p in known):
            folders = known
        elif len(bundle.devices) > 1:
            raise ValueError(f"data: {s.model} serves {', '.join(bundle.devices)}; give one --data folder per "
                             "device, in that order")
        else:
            folders = [default_data_dir()]
    else:
        folders = [Path(s.data)] if isinstance(s.data, (str, Path)) else [Path(p) for p in s.data]
    datasets = load_device_datasets(folders)
    if [ds.device for ds in datasets] != list(bundle.devices):
        raise ValueError(f"data: {s.model} serves {', '.join(bundle.devices)}; the folders given hold "
                         f"{', '.join(f'{ds.folder}: {ds.device}' for ds in datasets)} (one per device, in that order)")
    return datasets


def _rewrite(bundle: artifact.ModelBundle, s: Any, name: str, t0: float, command: str) -> None:
    """Append the refit step to the folder's build record and rewrite the folder (atomically)."""
    step = step_record(name, settings_record(s), time.perf_counter() - t0, refit=True,
                       command=command or f"perfmodel {name}")
    bundle.metadata = append_step(bundle.metadata, step)
    write_model_folder(bundle, bundle.metadata, s.model)


def refit_student(s: DistillSettings, log: Any = print, command: str = "") -> dict[str, Any]:
    """`perfmodel distill`: the student of the folder s.model, on its datasets s.data (each device's, in the
    model's order), rewritten in place."""
    t0 = time.perf_counter()
    bundle = load_model(s.model, 0)
    folders = (s.data,) if isinstance(s.data, (str, Path)) else tuple(s.data)
    family = bundle.metadata.get("settings", {}).get("split") == "family"
    if len(folders) == 1 and len(bundle.devices) == 1 and not family:  # the model's split of its one dataset
        added = add_student(bundle, load_gemm(Path(folders[0])), s, log)
    else:
        datasets = load_device_datasets([Path(f) for f in folders])
        if [ds.device for ds in datasets] != list(bundle.devices):
            raise ValueError(f"data: this model was trained for {', '.join(bundle.devices)}; give one --data folder "
                             f"per device in that order (got {', '.join(ds.device for ds in datasets)})")
        added = student_step(bundle, datasets, s, log)
    _rewrite(bundle, s, "distill", t0, command)
    return added["student_metrics"]


def refit_problem(s: ProblemHeadSettings, log: Any = print, command: str = "") -> dict[str, Any]:
    """`perfmodel problem-head`: the problem network of the folder s.model, in place of its cublas, call and
    call_static heads (or its problem network refitted), rewritten in place."""
    t0 = time.perf_counter()
    bundle = load_model(s.model, s.threads)
    metrics = problem_step(bundle, model_datasets(s, bundle), s, log)
    _rewrite(bundle, s, "problem-head", t0, command)
    return metrics


def refit_bmm(s: BmmHeadSettings, log: Any = print, command: str = "") -> dict[str, Any]:
    """`perfmodel bmm-head`: the bmm heads of the folder s.model, fitted on the bmm rows of s.data (one folder per
    device of the model, in its order; default: the model's datasets as its metadata names them) and added in
    place; nothing is written (a message says why) where the first folder has none."""
    t0 = time.perf_counter()
    bundle = load_model(s.model, s.threads)
    if s.data is not None:
        folder = [Path(s.data)] if isinstance(s.data, (str, Path)) else [Path(p) for p in s.data]
    else:  # the model's folders as its metadata names them (those that exist, in device order), else the default
        meta = bundle.metadata
        known = [Path(d["path"]) for d in (meta.get("datasets") or [meta.get("dataset") or {}]) if d.get("path")]
        folder = list(itertools.takewhile(Path.is_dir, known)) or [default_data_dir()]
    metrics = bmm_step(bundle, folder, s, log)
    if metrics is None:
        return {}
    _rewrite(bundle, s, "bmm-head", t0, command)
    return metrics


def grouped_folder(folders: Sequence[Path]) -> Path | None:
    """The first of a model's data folders with grouped rows (`perfmodel gen grouped`), None where none has."""
    from perfmodel.data_gen.shards import part_files

    from .grouped_head import KIND

    return next((Path(f) for f in folders if part_files(Path(f), KIND)), None)


def refit_grouped(s: Any, model: Path, data: Sequence[Path], log: Any = print, command: str = "") -> dict[str, Any]:
    """`perfmodel build --only grouped`: the grouped head of the folder `model` (train/grouped_head.py grouped_step),
    on the first of `data` with grouped rows, added in place; nothing is written (a message says why) where none
    has them."""
    from .grouped_head import grouped_step

    t0 = time.perf_counter()
    bundle = load_model(model, 0)
    folder = grouped_folder(data)
    metrics = None if folder is None else grouped_step(bundle, folder, s, log)
    if metrics is None:
        log(f"grouped-head: skipped: none of {', '.join(map(str, data))} has grouped rows")
        return {}
    step = step_record("grouped-head", settings_record(s), time.perf_counter() - t0, refit=True, command=command)
    bundle.metadata = append_step(bundle.metadata, step)
    write_model_folder(bundle, bundle.metadata, model)
    return metrics
