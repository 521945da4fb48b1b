"""`perfmodel train`: load the shards, split by problem, fit the heads with Lightning, evaluate against
baselines on held-out problems, track everything in MLflow, and write the model folder atomically
(a failed run leaves the previous model in place)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from perfmodel import __version__, artifact
from perfmodel.analytic import estimate_ms
from perfmodel.devices import DEFAULT_DEVICE, get_spec
from perfmodel.features import FeatureEncoder
from perfmodel.locations import checkout_root, default_data_dir, default_model_dir
from perfmodel.model import MLPConfig, PerfMLP, floor_features

from . import evaluate as ev
from .data import GemmTable, PadTable, dataset_hash, load_gemm, load_pad, make_loader, split_problems
from .plots import model_plots

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


@dataclass
class TrainSettings:
    data: Path = field(default_factory=default_data_dir)
    out: Path = field(default_factory=default_model_dir)  # replaces the shipped default model
    device_spec: str = DEFAULT_DEVICE
    seed: int = 0
    epochs: int = 40
    hidden: tuple[int, ...] = (256, 256, 256)  # 3x128 missed the bf16/fp32 top-1 targets on the v2 data
    norm: str = "batch"
    lr: float = 2e-3
    weight_decay: float = 1e-5
    rank_weight: float = 2.0          # weight of the within-problem (ranking) loss term
    rank_tau: float = 0.3             # its focus on fast configs (0: uniform)
    problems_per_batch: int = 16
    small_head_epochs: int = 150       # cuBLAS and pad heads (a few thousand rows)
    screen_hidden: tuple[int, ...] = (64, 64)  # the screen head: ranks every config cheaply for serving
    screen_epochs: int = 40
    screen_keep: int = artifact.DEFAULT_SCREEN_KEEP  # configs per problem the gemm head scores after the screen
    pad_members: int = 5               # the pad head averages this many seeds (one MLP, PerfMLP.ensemble)
    gemm_members: int = 1              # the gemm head averages this many seeds' log ms (each floored first:
                                       # their raw outputs below the overhead are not fitted)
    baselines: bool = True             # also train/evaluate the PR 156851 baseline
    accelerator: str = "cpu"
    devices: str = "auto"
    strategy: str = "auto"
    tracking_uri: str | None = None    # default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    experiment: str = "perfmodel"
    register_name: str | None = "perfmodel-h100"
    alias: str = "candidate"
    fast_dev_run: bool = False
    progress: bool = True
    command: str = ""


def tracking_uri(settings: TrainSettings) -> str:
    return settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _trainer(settings: TrainSettings, logger, epochs: int):
    import lightning as L

    return L.Trainer(max_epochs=epochs, accelerator=settings.accelerator, devices=settings.devices,
                     strategy=settings.strategy, logger=logger, enable_checkpointing=False,
                     enable_progress_bar=settings.progress, enable_model_summary=False,
                     fast_dev_run=settings.fast_dev_run, deterministic=True, log_every_n_steps=10)


def fit_head(head: PerfMLP, x: torch.Tensor, y: torch.Tensor, split: np.ndarray, groups: np.ndarray | None,
             settings: TrainSettings, logger, epochs: int, prefix: str, rank_weight: float) -> PerfMLP:
    """Fit one head on rows with split==0, validating on split==1."""
    from .module import PerfModule

    tr, va = split == 0, split == 1
    head.set_normalisation(x[tr].mean(0), x[tr].std(0))
    gtr = groups[tr] if groups is not None else None
    gva = groups[va] if groups is not None else None
    if gtr is not None:  # dense problem ids for the batch sampler
        gtr = np.unique(gtr, return_inverse=True)[1]
        gva = np.unique(gva, return_inverse=True)[1]
    train_dl = make_loader(x[tr], y[tr], gtr, settings.problems_per_batch, True, settings.seed, batch_rows=256)
    val_dl = make_loader(x[va], y[va], gva, 64, False, settings.seed, batch_rows=4096)
    module = PerfModule(head, lr=settings.lr, weight_decay=settings.weight_decay, rank_weight=rank_weight,
                        max_epochs=epochs, prefix=prefix, rank_tau=settings.rank_tau)
    _trainer(settings, logger, epochs).fit(module, train_dl, val_dl)
    return head.eval()


def _fit_members(make, n: int, x: torch.Tensor, y: torch.Tensor, split: np.ndarray, groups: np.ndarray | None,
                 settings: TrainSettings, logger, epochs: int, prefix: str, rank_weight: float,
                 average: str = "before_floor") -> PerfMLP:
    """n heads fitted from seeds seed, seed + 1, ...; their average as one MLP (PerfMLP.ensemble) when n > 1.
    A single head keeps its metric prefix "<prefix>_", members are "<prefix>0_", "<prefix>1_", ..."""
    if n <= 1:
        return fit_head(make(), x, y, split, groups, settings, logger, epochs, f"{prefix}_", rank_weight)
    members = []
    for i in range(n):
        torch.manual_seed(settings.seed + i)
        members.append(fit_head(make(), x, y, split, groups, replace(settings, seed=settings.seed + i), logger,
                                epochs, f"{prefix}{i}_", rank_weight))
    return PerfMLP.ensemble(members, average)


@torch.inference_mode()
def predict_rows(head: PerfMLP, x: torch.Tensor) -> np.ndarray:
    return head.eval()(x).double().numpy()


def model_card(meta: dict[str, Any]) -> str:
    """The model card, built from the folder's metadata alone (so it can be regenerated from it)."""
    results = {"perfmodel": meta["metrics"], **meta.get("baselines", {})}
    table_md = ev.format_table(results, ev.TABLE_KEYS)
    nets = []
    for name, head in sorted(meta.get("heads", {}).items()):
        mlp = head["mlp"]
        k = int(mlp.get("members", 1))
        shape = "x".join(str(w // k) for w in mlp["hidden"])
        nets.append(f"{name} {shape}" if k == 1 else
                    f"{name} {k} x {shape}, averaged {mlp.get('average', 'before_floor').replace('_', ' ')}")
    pad_md = "\n".join(f"- {k}: {v:.4f}" for k, v in {**meta.get("pad_metrics", {}), **meta.get("cublas_metrics", {})}.items()
                       if not k.endswith("problems"))
    return f"""# perfmodel H100 model

Generated by `perfmodel train`; do not edit. Regenerate with:

    {meta['training_command']}

- Device: {meta['device_spec']['name']} ({meta['device_spec']['marketing_name']}, {meta['device_spec']['sm_count']} SMs);
  the model predicts for this device only (its features use the device's SM count and peaks).
- Dataset: `{meta['dataset']['path']}`, sha256 `{meta['dataset']['sha256']}`, {meta['dataset']['gemm_rows']} GEMM rows over
  {meta['dataset']['gemm_problems']} problems, {meta['dataset']['pad_rows']} pad rows.
- Split: by problem (seed {meta['settings']['seed']}): train {meta['split']['train']}, val {meta['split']['val']}, test {meta['split']['test']} problems;
  no problem is in two sets. Metrics below are on the test problems only.
- Heads: gemm (Triton config runtime), cublas (torch.mm runtime), pad (orig and padded runtime), and
  screen (a small head distilled from gemm: ranking scores every config with it and the gemm head
  only its best {meta.get('screen_keep', '-')} per problem, when there are more than twice as many).
  Networks (hidden widths): {'; '.join(nets) or '-'}.
  Output layer `logsumexp(f(x), log overhead)`; learned overhead {meta['learned_overhead_ms']:.5f} ms.
- Schema version {meta['schema_version']}, encoder version {meta['encoder_version']}; weights `model.safetensors`
  (loaded with safetensors, no pickle) and `model.onnx` (single file, BatchNorm folded).
- Training time on the training machine's CPU: {meta['train_seconds']:.0f} s.
- Trained with perfmodel {meta.get('package_version', '(version not recorded)')}.

## Ranking Triton configs (held-out problems)

Efficiency = geomean over problems of (fastest measured config / the best of the method's top-k).

{table_md}

## Pad decisions and cuBLAS (held-out problems)

{pad_md}

## Caveats

- The sweep measured Inductor's default configs plus a stratified sample of the pruned config space
  per problem (128 configs for aligned compile groups, 40 otherwise), so "oracle" is the best
  measured config, not the best of the whole space.
- cuBLAS times are the dataset's quiet re-time (`perfmodel gen cublas`) where it has one.
"""


def _portable(path: Path) -> str:
    """A path as recorded in the model's metadata: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _dataset_path(data: Path) -> str:
    """The dataset as recorded in the model's metadata: relative to the checkout (data/h100) when run
    from one, else as given."""
    root = checkout_root()
    return os.path.relpath(data, root) if root is not None else _portable(data)


def run(settings: TrainSettings) -> dict[str, Any]:
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    t_start = time.perf_counter()
    torch.manual_seed(settings.seed)
    spec = get_spec(settings.device_spec)
    gemm = load_gemm(settings.data)
    pads = load_pad(settings.data)
    split = split_problems(gemm.modes, settings.seed)
    row_split = split[gemm.problem_idx]

    enc = FeatureEncoder(spec, "gemm")
    x = enc.encode(torch.from_numpy(gemm.problems[gemm.problem_idx]), torch.from_numpy(gemm.configs))
    y = torch.from_numpy(np.log(gemm.ms)).float()

    uri = tracking_uri(settings)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(settings.experiment)
    with mlflow.start_run(run_name=f"train-{time.strftime('%Y%m%d-%H%M%S')}") as run:
        logger = MLFlowLogger(experiment_name=settings.experiment, tracking_uri=uri, run_id=run.info.run_id)
        # Several fits share this run: Lightning's finalize() would mark it finished after the first;
        # the `with` block ends it (FINISHED or FAILED).
        logger.finalize = lambda status="success": None
        params = {k: (_portable(v) if isinstance(v, Path) else str(v) if isinstance(v, tuple) else v)
                  for k, v in asdict(settings).items()}
        mlflow.log_params({k: v for k, v in params.items() if k not in ("command",)})
        mlflow.log_param("dataset_sha256", dataset_hash(settings.data))
        mlflow.log_param("package_version", __version__)

        gemm_head = _fit_members(lambda: PerfMLP(MLPConfig(len(enc), settings.hidden, settings.norm,
                                                                   floor_features=floor_features(enc.names, 1))),
                                 settings.gemm_members, x, y, row_split, gemm.problem_idx, settings, logger,
                                 settings.epochs, "gemm", settings.rank_weight, average="after_floor")
        # The screen head learns the gemm head's predictions (distillation: it must keep the configs the
        # gemm head would rank first, not re-learn the timings), with the within-problem ranking term.
        screen_head = None
        if settings.screen_hidden:
            screen_y = torch.from_numpy(predict_rows(gemm_head, x)).float()
            screen_head = fit_head(PerfMLP(MLPConfig(len(enc), settings.screen_hidden, settings.norm,
                                                      floor_features=floor_features(enc.names, 1))), x, screen_y,
                                   row_split, gemm.problem_idx, settings, logger, settings.screen_epochs, "screen_", 1.0)

        cenc = FeatureEncoder(spec, "cublas")
        has_cb = np.isfinite(gemm.cublas_ms)
        cx = cenc.encode(torch.from_numpy(gemm.problems[has_cb]))
        cy = torch.from_numpy(np.log(gemm.cublas_ms[has_cb])).float()
        cublas_head = fit_head(PerfMLP(MLPConfig(len(cenc), (128, 128, 128), settings.norm,
                                                  floor_features=floor_features(cenc.names, 1))), cx, cy,
                               split[has_cb], None, settings, logger, settings.small_head_epochs, "cublas_", 0.0)

        penc = FeatureEncoder(spec, "pad")
        px = penc.encode_pad(torch.from_numpy(pads.pads))
        py = torch.from_numpy(np.log(np.stack([pads.orig_ms, pads.padded_ms], 1))).float()
        pad_split = split_problems(pads.modes, settings.seed)
        # Single pad heads vary by seed (1.02-1.05x of the oracle's total time on held-out problems): their
        # average is steadier, and written as one wider MLP it serves and exports like any head.
        pad_head = _fit_members(lambda: PerfMLP(MLPConfig(len(penc), (128, 128, 128), settings.norm, n_outputs=2,
                                                            floor_features=floor_features(penc.names, 2))),
                                settings.pad_members, px, py, pad_split, None, settings, logger,
                                settings.small_head_epochs, "pad", 0.0)

        # ---- evaluation on held-out problems
        test = gemm.subset(split == 2)
        xt = x[torch.from_numpy(row_split == 2)]
        from .eval_cmd import head_outputs

        score, pred = head_outputs(gemm_head.eval(), xt)
        screen_pred = head_outputs(screen_head.eval(), xt)[0] if screen_head is not None else None
        results = {"perfmodel": ev.rank_path(test, pred, screen_pred, settings.screen_keep, score)}
        if screen_head is not None:
            results["perfmodel, gemm head on every config"] = ev.summarize(test, pred, score)
        if settings.baselines:
            benc = FeatureEncoder(spec, "pr156851")
            bx = benc.encode(torch.from_numpy(gemm.problems[gemm.problem_idx]), torch.from_numpy(gemm.configs))
            base = fit_head(PerfMLP(MLPConfig(12, (256,) * 6, "batch", learn_overhead=False)), bx, y, row_split,
                            gemm.problem_idx, settings, logger, settings.epochs, "pr156851_", 0.0)
            results["PR 156851 model"] = ev.summarize(test, predict_rows(base, bx[torch.from_numpy(row_split == 2)]))
        analytic = estimate_ms(torch.from_numpy(test.problems[test.problem_idx]), torch.from_numpy(test.configs), spec)
        results["analytic (Triton-style)"] = ev.summarize(test, np.log(analytic.numpy()))
        results["random choice"] = ev.random_choice(test)
        defaults = ev.inductor_defaults(test)
        results["Inductor defaults, best measured"] = {k.replace("best_of_defaults_eff", "top1_eff"): v
                                                      for k, v in defaults.items()}
        # cuBLAS and pad heads
        best_pred = np.full(len(test.problems), np.inf)
        np.minimum.at(best_pred, test.problem_idx, pred)
        cmet = ev.cublas_metrics(test, predict_rows(cublas_head, cenc.encode(torch.from_numpy(test.problems))), best_pred)
        ptest = pad_split == 2
        ptable = PadTable(pads.pads[ptest], pads.orig_ms[ptest], pads.padded_ms[ptest], pads.modes[ptest])
        pmet = ev.pad_metrics(ptable, predict_rows(pad_head, px[torch.from_numpy(ptest)]))

        heads = {"gemm": gemm_head, "cublas": cublas_head, "pad": pad_head}
        encoders = {"gemm": enc, "cublas": cenc, "pad": penc}
        if screen_head is not None:
            heads["screen"], encoders["screen"] = screen_head, enc
            from .eval_cmd import full_space_agreement

            with torch.inference_mode():
                cmet.update(full_space_agreement(artifact.ModelBundle(spec, heads, encoders), test, settings.screen_keep))

        flat = {f"{method}/{k}": v for method, m in results.items() for k, v in m.items()}
        mlflow.log_metrics({_mlflow_key(k): float(v) for k, v in {**flat, **cmet, **pmet}.items()
                            if v is not None and np.isfinite(v)})
        train_seconds = time.perf_counter() - t_start

        bundle = artifact.ModelBundle(spec, heads, encoders)
        meta = {
            "device": spec.name,
            "dataset": {"path": _dataset_path(settings.data), "sha256": dataset_hash(settings.data),
                        "gemm_rows": int(len(gemm.ms)), "gemm_problems": int(len(gemm.problems)),
                        "pad_rows": int(len(pads.orig_ms))},
            "split": {"train": int((split == 0).sum()), "val": int((split == 1).sum()), "test": int((split == 2).sum())},
            "metrics": results["perfmodel"], "baselines": {k: v for k, v in results.items() if k != "perfmodel"},
            "cublas_metrics": cmet, "pad_metrics": pmet, "pad_threshold": 1.0, "screen_keep": settings.screen_keep,
            "settings": {k: v for k, v in params.items()}, "training_command": settings.command,
            "train_seconds": train_seconds, "learned_overhead_ms": float(gemm_head.log_overhead.detach().mean().exp()),
            "mlflow_run_id": run.info.run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "package_version": __version__,  # the perfmodel that trained it
        }
        if settings.fast_dev_run:
            meta["fast_dev_run"] = True
        out = write_model_folder(bundle, meta, settings.out)
        with tempfile.TemporaryDirectory() as tmp:
            rank_score = ev.screened(test, pred, screen_pred, settings.screen_keep) if screen_pred is not None else None
            for p in model_plots(test, pred, Path(tmp), rank_score, results):
                mlflow.log_artifact(str(p), "plots")
        mlflow.log_artifacts(str(out), "model")
        version = None
        if settings.register_name:
            version = register(run.info.run_id, settings.register_name, settings.alias)
        print(ev.format_table(results, ev.TABLE_KEYS))
        return {"out": str(out), "run_id": run.info.run_id, "model_version": version, "metrics": results,
                "cublas": cmet, "pad": pmet, "train_seconds": train_seconds, "tracking_uri": uri}


def _mlflow_key(k: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in k).replace(" ", "_").replace(",", "")


def write_model_folder(bundle: artifact.ModelBundle, meta: dict[str, Any], out: Path) -> Path:
    """Write to a temporary sibling folder, verify it loads, then swap it in: the previous model stays
    in place if anything fails before the swap."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        bundle.metadata = meta
        artifact.save(bundle, tmp)
        artifact.export_onnx(bundle, tmp / artifact.ONNX)
        (tmp / "MODEL_CARD.md").write_text(model_card(bundle.metadata))
        artifact.load(tmp)  # refuse to ship what does not load
        backup = out.with_name(f".{out.name}.old")
        if backup.exists():
            shutil.rmtree(backup)
        if out.exists():
            out.rename(backup)
        tmp.rename(out)
        if backup.exists():
            shutil.rmtree(backup)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        backup = out.with_name(f".{out.name}.old")
        if backup.exists() and not out.exists():  # interrupted between the two renames: put it back
            backup.rename(out)
        raise
    return out


def register(run_id: str, name: str, alias: str) -> str:
    """Register the run's model folder as a new version of `name` and point `alias` at it."""
    from mlflow import MlflowClient

    client = MlflowClient()
    try:
        client.get_registered_model(name)
    except Exception:  # not registered yet (MLflow raises RestException / MlflowException)
        client.create_registered_model(name)
    source = f"runs:/{run_id}/model"
    mv = client.create_model_version(name, source=source, run_id=run_id)
    client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)
