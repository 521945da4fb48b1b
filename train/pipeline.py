"""`perfmodel train`: load the shards, split by problem, fit the heads with Lightning, evaluate against
baselines on held-out problems, track everything in MLflow, and write the model folder atomically
(train/folder.py: a failed run leaves the previous model in place). `perfmodel build` (train/recipe.py)
runs the same fits as its first step."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import __version__, artifact
from perfmodel.devices import get_spec
from perfmodel.features import FeatureEncoder
from perfmodel.locations import default_data_dir, default_model_dir
from perfmodel.model import MLPConfig, PerfMLP, floor_features

from . import evaluate as ev
from . import tracking
from .config_net import fit_config_head
from .cublas_head import CublasHeadSettings, CublasRows, fit_cublas_head as fit_cublas_rows, folder_rows, thin_extra_rows
from .data import (GemmTable, PadTable, concat_gemm, concat_pad, data_domain, load_device_datasets, joint_split,
                   parse_device_fractions, subsample_training)
from .distill import DistillSettings
from .folder import data_sha256, dataset_path, settings_record, write_model_folder
from .loop import fit_lightning, fit_members  # noqa: F401  (fit_members: re-exported)
from .refit import add_student, inductor_figures_step


def _setting(default: Any = None, help: str = "", *, factory: Any = None, flag: str | None = None,
             choices: tuple[str, ...] | None = None, cli: bool = True) -> Any:
    """A TrainSettings field: its default, and what `perfmodel train` makes of it (train/cli.py
    generates one flag per field, --<name> with dashes, typed by the annotation, helped by `help`)."""
    meta = {"help": help, "flag": flag, "choices": choices, "cli": cli}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainSettings:
    """Every setting of a training run; recorded in the model's metadata and the MLflow run.
    `perfmodel train` has one flag per field (train/cli.py): adding a setting is one line here."""
    data: tuple[Path, ...] = _setting(
        factory=lambda: (default_data_dir(),),
        help="dataset folder; repeat for a model of several devices (--data data/h100 --data data/h200), each "
             "folder one device's, named by its shard headers; the first is the model's default device")
    out: Path = _setting(factory=default_model_dir,  # replaces the shipped default model
                         help="model folder to write (replaced only on success)")
    device_spec: str | None = _setting(None, "the device of a single --data folder (perfmodel.devices); default: "
                                             "its shard headers' (a value that differs from them is refused)")
    device_fraction: str = _setting("", "train on a fraction of a device's training problems, e.g. h200=0.1 "
                                        "(comma-separated; validation and test problems unchanged)")
    # ---- the gemm head (Triton config runtime)
    epochs: int = _setting(40)
    hidden: tuple[int, ...] = _setting((256, 256, 256),  # 3x128 missed the bf16/fp32 top-1 targets on the v2 data
                                       "hidden widths, e.g. 256,256,256,256")
    norm: str = _setting("batch", choices=("batch", "layer", "none"))
    config_net: bool = _setting(False, "the gemm head a config network: a kernel-mode input, trained on the data "
                                       "folder's gemm and gemm_static rows, serving kernel='inductor' in place of "
                                       "a static head (train/config_net.py)")
    lr: float = _setting(2e-3)
    weight_decay: float = _setting(1e-5)
    rank_weight: float = _setting(2.0, "weight of the within-problem loss")
    rank_tau: float = _setting(0.3, "focus of that term on fast configs (0: uniform)")
    problems_per_batch: int = _setting(16)
    # ---- the cuBLAS and pad heads (a few thousand rows)
    small_head_epochs: int = _setting(150)
    cublas_hidden: tuple[int, ...] = _setting((128, 128, 128), "hidden widths of the problem network's cuBLAS "
                                              "output fitted here (a build without a [problem] step)")
    pad_hidden: tuple[int, ...] = _setting((128, 128, 128), "hidden widths of each pad head member")
    # ---- the screen head of an older layout (perfmodel/heads/legacy.py): none; the student screens
    # ([student].screens). Kept, empty, so that the recipes of the shipped folders (which set it) still read.
    screen_hidden: tuple[int, ...] = _setting((), "must be empty: the student screens ([student].screens)")
    pad_members: int = _setting(5, "seeds averaged into the pad head")  # one MLP, PerfMLP.ensemble
    cublas_members: int = _setting(5, "seeds averaged into that cuBLAS output")  # likewise
    gemm_members: int = _setting(1, "seeds averaged into the gemm head")  # each one's log ms floored first:
    # their raw outputs below the overhead are not fitted
    screen_keep: int = _setting(artifact.DEFAULT_SCREEN_KEEP,
                                "configs per problem that the gemm head scores after the screen")
    lead_keep: int = _setting(12, "of those, how many the gemm ensemble's first member passes on to the whole "
                                  "ensemble (0: none; used with --gemm-members 2 or more)")
    # ---- the student head that predict serves (train/distill.py), distilled from the gemm head
    student_hidden: tuple[int, ...] = _setting(
        (128, 128, 128), "hidden widths of the student head ('' for none: predict runs the gemm head)")
    student_epochs: int = _setting(24)
    seed: int = _setting(0)
    split: str = _setting("problem", "the held-out split: by problem, or by family (whole weight shapes held out, "
                                     "train/families.py)", choices=("problem", "family"))
    # ---- the PR 156851 baseline (its 12 features, 6x256, BatchNorm, no learned overhead)
    baselines: bool = _setting(True, "skip training the PR 156851 baseline", flag="--no-baselines")
    baseline_hidden: tuple[int, ...] = _setting((256,) * 6, "hidden widths of the PR 156851 baseline")
    # ---- Lightning
    accelerator: str = _setting("cpu", "Lightning accelerator: cpu, gpu, auto")
    devices: int | str = _setting("auto", "Lightning devices (e.g. 2 for two-GPU DDP)")
    strategy: str = _setting("auto", "Lightning strategy (e.g. ddp)")
    # ---- MLflow
    tracking_uri: str | None = _setting(None, "MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    experiment: str = _setting("perfmodel")
    register_name: str | None = _setting("perfmodel-h100", "registered model name ('' to skip)")
    alias: str = _setting("candidate")
    fast_dev_run: bool = _setting(False, "one batch per stage (smoke test)")
    progress: bool = _setting(True, flag="--no-progress")
    command: str = _setting("", cli=False)  # the command line, for the model card (set by the CLI)

    def __post_init__(self) -> None:
        if isinstance(self.data, (str, os.PathLike)):  # one folder, as before several were allowed
            self.data = (Path(self.data),)
        self.data = tuple(Path(p) for p in self.data)
        if not self.data:
            raise ValueError("data: at least one dataset folder")


@dataclass
class TrainData:
    """The dataset of a run (one or several devices' folders, concatenated in order), encoded per row
    with its device's spec, with its split by problem (0 train, 1 val, 2 test, -1 unused: dropped by
    --device-fraction), stratified per device and dtype mode."""
    spec: Any                # the default device's (the first folder's)
    gemm: GemmTable
    pads: PadTable
    split: np.ndarray        # (problems,)
    row_split: np.ndarray    # (gemm rows,)
    pad_split: np.ndarray    # (pad rows,)
    enc: FeatureEncoder      # gemm rows (the default device's; feature names are every device's)
    x: torch.Tensor          # (gemm rows, features)
    y: torch.Tensor          # (gemm rows,) log ms
    datasets: list = field(default_factory=list)          # DeviceDataset per folder
    specs: dict = field(default_factory=dict)             # device name -> DeviceSpec
    problem_device: np.ndarray | None = None              # (problems,) device name
    pad_device: np.ndarray | None = None                  # (pad rows,) device name

    @property
    def devices(self) -> list[str]:
        return [ds.device for ds in self.datasets]


def encode_by_device(specs: dict, kind: str, device: np.ndarray, *columns: torch.Tensor) -> torch.Tensor:
    """Rows encoded each with its device's spec (FeatureEncoder(specs[device], kind)), in row order."""
    out = None
    for name in dict.fromkeys(device.tolist()):
        rows = torch.from_numpy(np.flatnonzero(device == name))
        x = FeatureEncoder(specs[name], kind).encode(*(c[rows] for c in columns))
        if out is None:
            out = torch.empty(len(device), x.shape[1], dtype=x.dtype)
        out[rows] = x
    if out is None:
        return torch.empty(0, len(FeatureEncoder(next(iter(specs.values())), kind)))
    return out


def load_data(settings: TrainSettings, datasets: list | None = None) -> TrainData:
    """datasets: settings.data's DeviceDatasets when the caller has loaded them already (in that order)."""
    datasets = load_device_datasets(settings.data) if datasets is None else datasets
    if settings.device_spec and len(datasets) == 1 and datasets[0].device != settings.device_spec:
        raise ValueError(f"device_spec: {settings.data[0]} holds {datasets[0].device} timings, not "
                         f"{settings.device_spec}")
    if settings.device_spec and len(datasets) > 1:
        raise ValueError("device_spec: with several --data folders each one's device comes from its shard headers")
    specs = {ds.device: get_spec(ds.device) for ds in datasets}
    fractions = parse_device_fractions(settings.device_fraction)
    unknown = set(fractions) - set(specs)
    if unknown:
        raise ValueError(f"device_fraction: no --data folder of {', '.join(sorted(unknown))} "
                         f"(the datasets' devices: {', '.join(specs)})")
    gemm = concat_gemm([ds.gemm for ds in datasets])
    pads = concat_pad([ds.pads for ds in datasets])
    problem_device = np.concatenate([np.full(len(ds.gemm.problems), ds.device, dtype=object) for ds in datasets])
    pad_device = np.concatenate([np.full(len(ds.pads.orig_ms), ds.device, dtype=object) for ds in datasets])
    if settings.split == "family":
        from .families import joint_family_split

        gemm_splits, pad_splits = joint_family_split(datasets, settings.seed)
    else:
        gemm_splits, pad_splits = joint_split(datasets, settings.seed)
    split = subsample_training(np.concatenate(gemm_splits), problem_device, gemm.modes, fractions, settings.seed)
    pad_split = subsample_training(np.concatenate(pad_splits), pad_device, pads.modes, fractions, settings.seed)
    spec = specs[datasets[0].device]
    enc = FeatureEncoder(spec, "gemm")
    x = encode_by_device(specs, "gemm", problem_device[gemm.problem_idx],
                         torch.from_numpy(gemm.problems[gemm.problem_idx]), torch.from_numpy(gemm.configs))
    y = torch.from_numpy(np.log(gemm.ms)).float()
    return TrainData(spec, gemm, pads, split, split[gemm.problem_idx], pad_split, enc, x, y, datasets, specs,
                     problem_device, pad_device)


def fit_cublas_head(settings: TrainSettings, d: TrainData, cenc: FeatureEncoder) -> tuple[PerfMLP, dict[str, Any]]:
    """The cuBLAS head, as `perfmodel cublas-head` fits it (train/cublas_head.py): on every torch.mm time of
    each dataset folder -- its GEMM problems' (this run's split), its cublas_only problems' and its pad rows'
    unpadded times (split within their kind; a row of a held-out GEMM problem left out; a device's
    device_fraction applied to their train rows too) -- the average of cublas_members plain MLPs; with its
    figures on each kind's val and test rows (cublas_head_metrics)."""
    rows = CublasRows.concat([folder_rows(ds.folder, ds.gemm, d.split[d.problem_device == ds.device], settings.seed,
                                          ds.device) for ds in d.datasets])
    rows.split = thin_extra_rows(rows, parse_device_fractions(settings.device_fraction), settings.seed)
    x = encode_by_device(d.specs, "cublas", rows.device, torch.from_numpy(rows.problems))
    cs = CublasHeadSettings(hidden=tuple(settings.cublas_hidden), members=settings.cublas_members,
                            epochs=1 if settings.fast_dev_run else settings.small_head_epochs, seed=settings.seed)
    log = print if settings.progress else (lambda *a: None)
    return fit_cublas_rows(x, rows, d.devices, cs, floor_features(cenc.names, 1), log)


def fit_heads(settings: TrainSettings, d: TrainData, logger, cublas: bool = True) -> artifact.ModelBundle:
    """The served heads (gemm, the problem network's cuBLAS output, pad) as a bundle, its metadata not yet
    written (but for the devices and their specs, which the evaluation's for_device needs). cublas False: no
    problem network (a build whose problem step fits it: the problem features' encoder is set all the same).
    ValueError for a screen head (screen_hidden), a head of an older layout."""
    if settings.screen_hidden:
        raise ValueError("screen_hidden: the screen head is of an older layout (perfmodel/heads/legacy.py); the "
                         "student screens ([student].screens = true): leave it empty")
    enc, x, gemm = d.enc, d.x, d.gemm
    net = fit_config_head(settings, d, logger) if settings.config_net else None
    gemm_head = artifact.config_heads(net, artifact.KERNEL_MODE_VALUES)["gemm"] if net is not None else fit_members(
        lambda: PerfMLP(MLPConfig(len(enc), settings.hidden, settings.norm, floor_features=floor_features(enc.names, 1))),
        settings.gemm_members, x, d.y, d.row_split, gemm.problem_idx, settings, logger, settings.epochs, "gemm",
        settings.rank_weight, average="after_floor")
    heads, encoders = {"gemm": gemm_head}, {"gemm": enc}
    cenc = FeatureEncoder(d.spec, "cublas")
    cublas_fit = None
    if cublas:  # the problem network with its first output alone, torch.mm's time
        heads[artifact.PROBLEM], cublas_fit = fit_cublas_head(settings, d, cenc)
        encoders[artifact.PROBLEM] = cenc
    encoders["cublas"] = cenc

    penc = FeatureEncoder(d.spec, "pad")
    px = encode_by_device(d.specs, "pad", d.pad_device, torch.from_numpy(d.pads.pads))
    py = torch.from_numpy(np.log(np.stack([d.pads.orig_ms, d.pads.padded_ms], 1))).float()
    # Single pad heads vary by seed (1.02-1.05x of the oracle's total time on held-out problems): their
    # average is steadier, and written as one wider MLP it serves and exports like any head.
    heads["pad"] = fit_members(lambda: PerfMLP(MLPConfig(len(penc), settings.pad_hidden, settings.norm, n_outputs=2,
                                                          floor_features=floor_features(penc.names, 2))),
                                settings.pad_members, px, py, d.pad_split, None, settings, logger,
                                settings.small_head_epochs, "pad", 0.0)
    encoders["pad"] = penc
    # What the evaluation reads from the metadata before the folder's own is written.
    bundle = artifact.ModelBundle(d.spec, heads, encoders, {"screen_keep": settings.screen_keep, "pad_threshold": 1.0,
                                                            "lead_keep": effective_lead_keep(settings, heads),
                                                            **({"cublas_head_metrics": cublas_fit,
                                                                "problem_outputs": ["cublas"]} if cublas else {}),
                                                            **device_metadata(d)})
    return bundle if net is None else artifact.config_network(bundle, net)


def effective_lead_keep(settings: Any, heads: dict[str, Any], screen: str | None = None) -> int:
    """settings.lead_keep where the model can use it (a screen head -- the head named `screen`, None for none --,
    an ensemble gemm head, a lead_keep below screen_keep), else 0; a negative value is refused."""
    if settings.lead_keep < 0:
        raise ValueError(f"lead_keep: must be >= 0, got {settings.lead_keep}")
    usable = screen is not None and screen in heads and heads["gemm"].has_lead and settings.lead_keep < settings.screen_keep
    return settings.lead_keep if usable else 0


def device_metadata(d: TrainData) -> dict[str, Any]:
    """The devices a model is trained for (the default first) and their specs, as the artifact stores them."""
    return {"devices": d.devices, "device_specs": {n: d.specs[n].as_dict() for n in d.devices}}


def fit_untracked(settings: TrainSettings, d: TrainData) -> artifact.ModelBundle:
    """fit_heads without MLflow or a Lightning logger (benchmarks/studies/transfer.py's many small fits); no
    model folder is written."""
    torch.manual_seed(settings.seed)
    return fit_heads(settings, d, logger=False)


def fit_baselines(settings: TrainSettings, d: TrainData, logger) -> dict[str, tuple[PerfMLP, FeatureEncoder]]:
    """{name: (head, encoder)} of the baselines trained alongside (the PR 156851 model), for the evaluation."""
    if not settings.baselines:
        return {}
    benc = FeatureEncoder(d.spec, "pr156851")
    bx = benc.encode(torch.from_numpy(d.gemm.problems[d.gemm.problem_idx]), torch.from_numpy(d.gemm.configs))
    base = fit_lightning(PerfMLP(MLPConfig(len(benc), settings.baseline_hidden, "batch", learn_overhead=False)), bx, d.y,
                    d.row_split, d.gemm.problem_idx, settings, logger, settings.epochs, "pr156851_", 0.0)
    return {"PR 156851 model": (base, benc)}


def model_metadata(settings: TrainSettings, d: TrainData, bundle: artifact.ModelBundle, evaluation: dict,
                   params: dict[str, Any], run_id: str, train_seconds: float) -> dict[str, Any]:
    """evaluation: the default device's (evaluate_bundle), with "by_device" holding every device's when the
    model has several."""
    results = evaluation["results"]

    def dataset(ds) -> dict[str, Any]:
        return {"path": dataset_path(ds.folder), "sha256": data_sha256(ds.folder)["sha256"], "device": ds.device,
                "gemm_rows": int(len(ds.gemm.ms)), "gemm_problems": int(len(ds.gemm.problems)),
                "pad_rows": int(len(ds.pads.orig_ms))}

    def split_counts(mask: np.ndarray) -> dict[str, int]:
        return {name: int((d.split[mask] == i).sum()) for i, name in enumerate(("train", "val", "test"))}

    meta = {
        "device": d.spec.name, **device_metadata(d),
        "dataset": dataset(d.datasets[0]),
        "split": split_counts(d.problem_device == d.spec.name),
        "metrics": results["perfmodel"], "baselines": {k: v for k, v in results.items() if k != "perfmodel"},
        "cublas_metrics": evaluation["cublas"], "pad_metrics": evaluation["pad"], "pad_threshold": 1.0,
        **{k: bundle.metadata[k] for k in ("cublas_head_metrics", "problem_outputs") if k in bundle.metadata},
        "screen_keep": settings.screen_keep, "lead_keep": bundle.lead_keep,
        "settings": {k: v for k, v in params.items()}, "training_command": settings.command,
        "train_seconds": train_seconds,
        "learned_overhead_ms": float(bundle.heads["gemm"].log_overhead.detach().mean().exp()),
        "mlflow_run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "package_version": __version__,  # the perfmodel that trained it
        # the shapes of the rows each kind of head is fitted on: the Predictor warns outside them (perfmodel.domain)
        "domain": data_domain([ds.folder for ds in d.datasets]),
    }
    if len(d.datasets) > 1:  # a model of several devices: each one's data, split and held-out metrics
        meta["datasets"] = [dataset(ds) for ds in d.datasets]
        meta["split_by_device"] = {n: split_counts(d.problem_device == n) for n in d.devices}
        meta["metrics_by_device"] = {n: {"results": ev_d["results"]["perfmodel"], "cublas": ev_d["cublas"],
                                         "pad": ev_d["pad"]} for n, ev_d in evaluation["by_device"].items()}
    if settings.split == "family":  # the held-out keys, for `perfmodel eval` to reuse
        from .families import held_out_record

        meta["family_split"] = held_out_record(d.datasets, settings.seed)
    if settings.device_fraction:
        meta["device_fraction"] = parse_device_fractions(settings.device_fraction)
    if settings.fast_dev_run:
        meta["fast_dev_run"] = True
    if bundle.config_net is not None:  # the gemm head's kernel-mode input (perfmodel/artifact.py config_heads)
        meta[artifact.KERNEL_MODE_INPUT] = bundle.metadata[artifact.KERNEL_MODE_INPUT]
    return meta


def run(settings: TrainSettings) -> dict[str, Any]:
    """Load the data, fit the heads and the baselines, evaluate them on held-out problems, write the
    model folder, and record it all in MLflow (registering the folder under settings.register_name)."""
    import mlflow

    t_start = time.perf_counter()
    torch.manual_seed(settings.seed)
    d = load_data(settings)
    with tracking.mlflow_run(settings.tracking_uri, settings.experiment, "train") as (run, logger, uri):
        params = settings_record(settings)
        mlflow.log_params({k: v for k, v in params.items() if k not in ("command",)})
        mlflow.log_param("dataset_sha256", data_sha256(settings.data[0])["sha256"])
        mlflow.log_param("package_version", __version__)
        bundle = fit_heads(settings, d, logger)
        evaluation = evaluate_tracked(bundle, d, settings.seed, fit_baselines(settings, d, logger))
        student: dict[str, Any] = {}
        if settings.student_hidden:  # after the evaluation: ranking does not use it
            student = add_student(bundle, d.gemm, student_settings(settings), print, d.split, d.problem_device)
            tracking.log_metrics(student["student_metrics"])
        if bundle.config_net is not None:  # its inductor mode's figures (static_metrics), the screen in place
            student["static_metrics"] = inductor_figures_step(bundle, d.datasets[0], d.split)
        train_seconds = time.perf_counter() - t_start
        meta = {**model_metadata(settings, d, bundle, evaluation, params, run.info.run_id, train_seconds), **student}
        out = write_model_folder(bundle, meta, settings.out)
        mlflow.log_artifacts(str(out), "model")
        version = tracking.register(run.info.run_id, settings.register_name, settings.alias) \
            if settings.register_name else None
        print(ev.format_table(evaluation["results"], ev.TABLE_KEYS))
        return {"out": str(out), "run_id": run.info.run_id, "model_version": version, "metrics": evaluation["results"],
                "cublas": evaluation["cublas"], "pad": evaluation["pad"], "train_seconds": train_seconds,
                "tracking_uri": uri}


def evaluate_tracked(bundle: artifact.ModelBundle, d: TrainData, seed: int, baselines: dict | None) -> dict:
    """evaluate_devices, with its plots and metrics logged to the active MLflow run (every device's prefixed
    with its name for a model of several)."""
    import tempfile

    import mlflow

    with tempfile.TemporaryDirectory() as plots:
        evaluation = evaluate_devices(bundle, d, seed, baselines, Path(plots))
        mlflow.log_artifacts(plots, "plots")
    results, cmet, pmet = evaluation["results"], evaluation["cublas"], evaluation["pad"]
    flat = {f"{method}/{k}": v for method, m in results.items() for k, v in m.items()}
    if len(d.datasets) > 1:  # every device's, prefixed with its name
        flat = {f"{dev}/{method}/{k}": v for dev, e in evaluation["by_device"].items()
                for method, m in {**e["results"], "heads": {**e["cublas"], **e["pad"]}}.items()
                for k, v in m.items()}
    tracking.log_metrics({**flat, **cmet, **pmet})
    return evaluation


def student_settings(settings: TrainSettings) -> DistillSettings:
    """The student step's settings from a training run's (a smoke test: a few random problems, one epoch)."""
    ds = DistillSettings(data=settings.data[0] if len(settings.data) == 1 else settings.data,
                         hidden=settings.student_hidden, epochs=settings.student_epochs, seed=settings.seed)
    return replace(ds, epochs=1, random_problems=8) if settings.fast_dev_run else ds


def device_tables(d: TrainData, device: str) -> tuple[GemmTable, PadTable]:
    """One device's tables (its folder's, as loaded)."""
    ds = next(ds for ds in d.datasets if ds.device == device)
    return ds.gemm, ds.pads


def evaluate_devices(bundle: artifact.ModelBundle, d: TrainData, seed: int, baselines: dict | None,
                     plots: Path | None = None, full_space: bool = True) -> dict:
    """evaluate_bundle per device of the data, the bundle encoding for that device (for_device), on that
    device's test problems of the run's split (train/data.py joint_split). Returns the default
    device's evaluation with "by_device" {device: evaluation} added (plots: the default device's)."""
    by_device = {}
    for i, name in enumerate(d.devices):
        by_device[name] = ev.evaluate_bundle(bundle.for_device(name), device_tables(d, name), seed=seed,
                                             baselines=baselines, plots=plots if i == 0 else None,
                                             full_space=full_space, split=d.split[d.problem_device == name],
                                             pad_split=d.pad_split[d.pad_device == name])
    return {**by_device[d.devices[0]], "by_device": by_device}
