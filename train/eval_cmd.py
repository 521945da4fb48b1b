"""`perfmodel eval`: the held-out evaluation table of a model folder, with baselines (the evaluation
itself is train/evaluate.py's evaluate_bundle, the one `perfmodel train` runs too)."""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from perfmodel import artifact
from perfmodel.locations import default_data_dir

from . import evaluate as ev
from .regret import format_regret


def evaluate_datasets(bundle: artifact.ModelBundle, datasets: list, plots=None, full_space: bool = True,
                      seed: int | None = None, split: str | None = None) -> list[dict]:
    """evaluate_bundle on each dataset (train/data.py DeviceDataset), on its test problems of the joint
    split of the datasets in the order given (joint_split: give the model's default device's first, as
    training did). Each predicts for the data's device when the model was trained for it, else
    (zero-shot) for the model's default device, as Predictor.load does for a GPU the model does not know.
    Each result has "device": {"data", "predicted_for", "zero_shot"}, "split" (train/heldout.py
    choose_split: which split, None for the model's own, and whether the model trained on it) and
    "regret" (the rank path's regret distribution, train/regret.py)."""
    from .heldout import choose_split, rank_path_regret

    if seed is None:
        seed = int(bundle.metadata.get("settings", {}).get("seed", 0))
    default = bundle.devices[0]
    later_known = [ds.device for ds in datasets[1:] if ds.device in bundle.devices]
    if later_known and datasets[0].device != default:
        raise ValueError(f"data: the held-out problems of {', '.join(later_known)} follow the split of the model's "
                         f"default device {default}: give its dataset first (--data <{default} folder> --data ...)")
    gemm_splits, pad_splits, split_info = choose_split(bundle, datasets, split, seed)
    static_splits, static_source, static_record = _static_splits(bundle, datasets, gemm_splits, split_info)
    tutorial_splits, tutorial_source, tutorial_record = _static_splits(bundle, datasets, gemm_splits, split_info,
                                                                       "tutorial")
    out = []
    for ds, gs, ps in zip(datasets, gemm_splits, pad_splits):
        known = ds.device in bundle.devices
        target = ds.device if known else default
        res = ev.evaluate_bundle(bundle.for_device(target), (ds.gemm, ds.pads), plots=plots if not out else None,
                                 full_space=full_space, seed=seed, split=gs, pad_split=ps)
        res["device"] = {"data": ds.device, "predicted_for": target, "zero_shot": not known,
                         "folder": ds.folder.name}
        res["split"] = split_info
        if split_info["contaminated"]:  # the training run's baseline figures are of the model's own split
            res["results"] = {k: v for k, v in res["results"].items() if not k.endswith("(training run)")}
        res["regret"] = rank_path_regret(bundle.for_device(target), ds.gemm.subset(gs == 2))
        static = static_results(bundle.for_device(ds.device), ds, static_splits[len(out)], static_record) \
            if known else None
        if static:
            res["static"] = {**static, "split": static_source}
        tutorial = tutorial_results(bundle.for_device(ds.device), ds, tutorial_splits[len(out)], tutorial_record) \
            if known else None
        if tutorial:
            res["tutorial"] = {**tutorial, "split": tutorial_source}
        out.append(res)
    return out


def _static_splits(bundle: artifact.ModelBundle, datasets: list, gemm_splits: list, split_info: dict,
                   mode: str = "inductor") -> tuple[list, str, dict | None]:
    """The splits a kernel mode's figures are taken on (mode "inductor" or "tutorial"): held out by family, the
    mode's head's own family split where its metadata records one (<mode>_metrics.family_split: the head was fitted
    on it, the rest of the model maybe not; also returned, as it splits the mode's own problems too), else the
    evaluation's split."""
    record = (bundle.metadata.get(f"{mode}_metrics") or {}).get("family_split")
    if split_info["kind"] != "family" or not record:
        return gemm_splits, "the evaluation's split", None
    from .families import joint_family_split

    return joint_family_split(datasets, int(record.get("seed", 0)), record)[0], \
        f"the {mode} head's family split (its metadata)", record


def _mode_test_rows(ds, static, split: np.ndarray, record: dict | None):
    """A kernel mode's rows of test problems: by the head's recorded family split where given (every problem of
    the mode's rows, those the gemm rows lack too: split_from_record), else by the gemm problems' split."""
    from .families import split_from_record
    from .static_head import split_static

    return split_static(ds.gemm, static, split, static_split=split_from_record(static.problems, record)
                        if record is not None else None)


def static_results(bundle: artifact.ModelBundle, ds, split: np.ndarray, record: dict | None = None) -> dict | None:
    """The kernel modes on the dataset's test problems that were timed statically (its gemm_static parts),
    ranked against those static times, in the autotune mode and in the inductor mode (with the static head,
    or a config network's inductor mode; train/static_head.py's ranking_metrics); None when the model has no
    inductor mode or the folder no static rows of test problems."""
    from .static_head import has_static_rows, load_static, ranking_metrics, worst_static

    mode = artifact.inductor_mode(bundle.heads)
    if mode is None or not has_static_rows(ds.folder):
        return None
    st = _mode_test_rows(ds, load_static(ds.folder), split, record)
    if not len(st.problems):
        return None
    calls = {name: artifact.problem_output(bundle, name) for name in (artifact.CALL, artifact.CALL_STATIC)}
    return {"problems": len(st.problems), "autotune": ranking_metrics(bundle, None, st, calls[artifact.CALL]),
            "inductor": ranking_metrics(bundle, mode, st, calls[artifact.CALL_STATIC]),
            "worst": {"autotune": worst_static(bundle, None, st), "inductor": worst_static(bundle, mode, st)}}


def tutorial_results(bundle: artifact.ModelBundle, ds, split: np.ndarray, record: dict | None = None) -> dict | None:
    """The Triton tutorial's kernel on the dataset's test problems that have its timings (gemm_tutorial parts),
    ranked in the autotune mode and with the tutorial head (kernel="tutorial"); None when the model has no tutorial
    head or the folder no such rows of test problems."""
    from .static_head import has_static_rows, load_static, ranking_metrics, worst_static

    name = artifact.mode_head(bundle.heads, "tutorial")
    if name is None or not has_static_rows(ds.folder, "gemm_tutorial"):
        return None
    st = _mode_test_rows(ds, load_static(ds.folder, "gemm_tutorial"), split, record)
    if not len(st.problems):
        return None
    head = bundle.heads[name]
    keep = lambda m: {k: v for k, v in m.items() if not k.startswith("cublas/")}  # noqa: E731  (no torch.mm times)
    return {"problems": len(st.problems), "autotune": keep(ranking_metrics(bundle, None, st)),
            "tutorial": keep(ranking_metrics(bundle, head, st)),
            "worst": {"autotune": worst_static(bundle, None, st), "tutorial": worst_static(bundle, head, st)}}


def run_eval(args: argparse.Namespace) -> int:
    from .data import load_device_datasets

    bundle = artifact.load(args.model)
    folders = args.data or [default_data_dir()]
    datasets = load_device_datasets(folders)
    if len(bundle.devices) > 1 and datasets[0].device != bundle.devices[0] and datasets[0].device in bundle.devices:
        raise ValueError(f"data: {datasets[0].folder} is {datasets[0].device}'s; its held-out problems follow the "
                         f"split of the model's default device {bundle.devices[0]}: give that device's dataset "
                         "first (--data <its folder> --data ...)")
    results = evaluate_datasets(bundle, datasets, plots=args.plots, split=args.split)
    if args.log_mlflow:
        import mlflow

        import os

        from .tracking import DEFAULT_TRACKING_URI, mlflow_key as _mlflow_key

        mlflow.set_tracking_uri(args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
        mlflow.set_experiment("perfmodel-eval")
        with mlflow.start_run(run_name="eval"):
            for out in results:  # several datasets: each one's metrics prefixed with its device
                pre = f"{out['device']['data']}/" if len(results) > 1 else ""
                flat = {f"{m}/{k}": v for m, mm in out["results"].items() for k, v in mm.items()}
                mlflow.log_metrics({_mlflow_key(pre + k): float(v) for k, v in {**flat, **out["cublas"], **out["pad"]}.items()
                                    if v is not None and np.isfinite(v)})
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        return 0
    for i, out in enumerate(results):
        if i:
            print()
        _print(out)
    return 0


def _print(out: dict) -> None:
    dev = out["device"]
    zero = f" (zero-shot: the model was not trained for {dev['data']})" if dev["zero_shot"] else ""
    sp = out["split"]
    print(f"Held-out problems: {out['test_problems']} of {dev['data']}, split by {sp['kind']} (seed {sp['seed']}, "
          f"the model's metadata); predicting for {dev['predicted_for']}{zero}")
    if sp["contaminated"]:
        print(f"Note: the model was trained on the split by {sp['model_split']}, which puts "
              f"{100 * sp['trained_share']:.0f} % of these test problems in its training set: the figures flatter it.")
    if sp["kind"] == "family":
        print(f"Held-out weight shapes (K x N; {sp['source']}): {', '.join(sp['test_keys'])}")
    print()
    print(ev.format_table(out["results"], ev.TABLE_KEYS))
    print()
    for k, v in {**out["cublas"], **out["pad"]}.items():
        print(f"{k:32s} {v:.4f}")
    print("\nRegret of the rank path on these problems (the pick's time / the fastest measured - 1):\n")
    print(format_regret(out["regret"]))
    st = out.get("static")
    if st:
        keys = ["float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "all/top1_eff", "all/top5_eff",
                "cublas/choice_accuracy"]
        same = "The same test problems" if st.get("split", "").startswith("the evaluation") else \
            f"Test problems of {st.get('split', 'the evaluation')}"
        print(f"\n{same} timed statically ({st['problems']}, the dataset's gemm_static rows), ranked per kernel "
              "mode:\n")
        print("| kernel mode | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for mode in ("autotune", "inductor"):
            print(f"| {mode} | " + " | ".join(f"{st[mode].get(k, float('nan')):.4f}" for k in keys) + " |")
    tu = out.get("tutorial")
    if tu:
        keys = ["float16/top1_eff", "bfloat16/top1_eff", "tf32/top1_eff", "float32/top1_eff", "layout/NN/top1_eff",
                "layout/NT/top1_eff", "all/top1_eff", "all/top5_eff"]
        print(f"\nTest problems of {tu.get('split', 'the evaluation')} timed with the Triton tutorial's kernel "
              f"({tu['problems']}, the dataset's gemm_tutorial rows), ranked per kernel mode:\n")
        print("| kernel mode | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for mode in ("autotune", "tutorial"):
            print(f"| {mode} | " + " | ".join(f"{tu[mode].get(k, float('nan')):.4f}" for k in keys) + " |")
