"""How much of a new GPU's data a model needs: transfer from a device with data to a new one (CPU).

Given two datasets timed with the same kernel -- the base device's (say data/h100) and the new
device's (say data/h200) -- and one split of their problems (train/data.py joint_split: the base
device's split, a problem measured on both in the same set on both), this trains small models with one
config and reports, on held-out problems:

(a) zero-shot: the base-only model on the new device's held-out problems, as served (predicting for
    the base device, as Predictor.load does on a GPU the model does not know) and with the new device's
    spec as its device features (which it never saw vary); and, with --shipped, a shipped model folder
    as it serves (its own training split may differ from this one: see the JSON's notes);
(b) the learning curve: the joint model trained on the base device's training problems and 0/10/30/100 %
    (--fractions) of the new device's (train/data.py subsample_training: nested, per dtype mode), its
    new-device top-1/top-5 per dtype and pad decisions vs the oracle, and its base-device top-1 against
    the base-only model's.

    python -m benchmarks.studies.transfer --base data/h100 --new data/h200 [--shipped models/h100] [--quick]
Writes benchmarks/results/transfer_<new device>.json and .md (--out). The training config is small
enough for a 2-core CPU (see CONFIGS; --epochs/--hidden override); --quick trains for a few batches
(for tests and smoke runs; its numbers mean little). No GPU is used.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import REPO

# The training configs: small heads, no screen (ranking is the gemm head on every config), one member
# each, no baselines. "full" is sized for a 2-core CPU (docs/transfer.md gives its measured fit time);
# "quick": one batch per head (Lightning's fast_dev_run).
CONFIGS = {
    "full": dict(epochs=6, hidden=(128, 128, 128), small_head_epochs=40, cublas_hidden=(64, 64),
                 pad_hidden=(64, 64, 64)),
    "quick": dict(epochs=1, hidden=(16, 16), small_head_epochs=1, cublas_hidden=(8,), pad_hidden=(8,),
                  fast_dev_run=True),
}
COMMON = dict(screen_hidden=(), gemm_members=1, pad_members=1, cublas_members=1, baselines=False, progress=False, register_name="")
# The figures of the tables (train/evaluate.py keys).
RANK_KEYS = ("float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "float16/top5_eff", "bfloat16/top5_eff",
             "fp32_all/top5_eff")
PAD_KEY = "pad/total_vs_oracle"


def _figures(ev: dict) -> dict[str, float]:
    r = ev["results"]["perfmodel"]
    out = {k: r[k] for k in RANK_KEYS + ("all/top1_eff", "all/top5_eff") if k in r}
    if PAD_KEY in ev.get("pad", {}):
        out[PAD_KEY] = ev["pad"][PAD_KEY]
    if "cublas/mape" in ev.get("cublas", {}):
        out["cublas/mape"] = ev["cublas"]["cublas/mape"]
    out["test_problems"] = ev["test_problems"]
    return out


def _evaluate(bundle, ds, split: tuple, seed: int) -> dict[str, float]:
    from perfmodel.train import evaluate as ev

    return _figures(ev.evaluate_bundle(bundle, (ds.gemm, ds.pads), seed=seed, baselines={}, full_space=False,
                                       split=split[0], pad_split=split[1]))


def with_spec(bundle, spec):
    """The bundle's heads with encoders for `spec`, a device the model may not have been trained for
    (ModelBundle.for_device refuses those: serving never does this; the benchmark measures it)."""
    from perfmodel.artifact import ModelBundle
    from perfmodel.features import FeatureEncoder

    encoders = {h: FeatureEncoder(spec, e.kind, e.version) for h, e in bundle.encoders.items()}
    return ModelBundle(spec, bundle.heads, encoders, bundle.metadata)


def run(base: Path, new: Path, fractions: list[float], quick: bool, seed: int, shipped: Path | None,
        overrides: dict[str, Any]) -> dict[str, Any]:
    from perfmodel import artifact
    from perfmodel.devices import get_spec
    from perfmodel.train.data import joint_split, load_device_datasets
    from perfmodel.train.pipeline import TrainSettings, fit_untracked, load_data

    t0 = time.perf_counter()
    datasets = load_device_datasets([base, new])
    b, n = datasets
    gsplit, psplit = joint_split(datasets, seed)
    splits = {b.device: (gsplit[0], psplit[0]), n.device: (gsplit[1], psplit[1])}
    config = {**CONFIGS["quick" if quick else "full"], **COMMON, **overrides, "seed": seed}
    res: dict[str, Any] = {"base": {"device": b.device, "folder": _rel(b.folder), "problems": len(b.gemm.problems)},
                           "new": {"device": n.device, "folder": _rel(n.folder), "problems": len(n.gemm.problems)},
                           "seed": seed, "quick": quick, "config": {k: list(v) if isinstance(v, tuple) else v
                                                                    for k, v in config.items()},
                           "held_out": {d: int((s[0] == 2).sum()) for d, s in splits.items()},
                           "models": {}, "notes": []}

    def fit(data: tuple, fraction: float | None) -> Any:
        s = TrainSettings(data=data, out=Path("unused"), device_fraction="" if fraction is None
                          else f"{n.device}={fraction:g}", **config)
        d = load_data(s, [ds for ds in datasets if ds.folder in data])
        t = time.perf_counter()
        bundle = fit_untracked(s, d)
        return bundle, time.perf_counter() - t, int((d.split[d.problem_device == n.device] == 0).sum())

    # (a) the base device alone: as served on the new device, and with the new device's spec
    only, secs, _ = fit((b.folder,), None)
    res["models"]["base_only"] = {
        "trained_on": f"{b.device} only", "fit_s": secs,
        "base": _evaluate(only, b, splits[b.device], seed),
        "new_as_served": _evaluate(only, n, splits[n.device], seed),
        "new_with_new_spec": _evaluate(with_spec(only, get_spec(n.device)), n, splits[n.device], seed)}
    if shipped is not None:
        sb = artifact.load(shipped)
        known = n.device in sb.devices
        res["models"]["shipped"] = {
            "folder": _rel(shipped), "trained_on": ", ".join(sb.devices), "dataset": sb.metadata.get("dataset", {}).get("path"),
            "new_as_served": _evaluate(sb.for_device(n.device if known else sb.devices[0]), n, splits[n.device],
                                       int(sb.metadata.get("settings", {}).get("seed", seed)))}
        trained_on = sb.metadata.get("dataset", {}).get("path")
        if trained_on != _rel(b.folder):
            what = f"was trained on {trained_on}, whose split is not this one" if trained_on else \
                "does not record its training dataset"
            res["notes"].append(f"the shipped model {what}: some of these held-out shapes may be among its training "
                                f"problems (on {sb.devices[0]})")
    # (b) the learning curve
    curve = []
    for f in fractions:
        joint, secs, n_train = fit((b.folder, n.folder), f)
        curve.append({"fraction": f, "new_train_problems": n_train, "fit_s": secs,
                      "new": _evaluate(joint.for_device(n.device), n, splits[n.device], seed),
                      "base": _evaluate(joint, b, splits[b.device], seed)})
    res["learning_curve"] = curve
    res["seconds"] = time.perf_counter() - t0
    return res


def average(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several seeds' (same fractions, same models): every number the mean over the seeds,
    everything else the first seed's; `seeds` lists them and `spread` holds, per learning-curve point, the
    range (max - min) of the new device's all-dtype top-1 over the seeds."""
    def mean(vals: list[Any]) -> Any:
        v0 = vals[0]
        if isinstance(v0, dict):
            return {k: mean([v[k] for v in vals]) for k in v0 if all(k in v for v in vals)}
        if isinstance(v0, list) and all(isinstance(v, list) and len(v) == len(v0) for v in vals):
            return [mean(list(col)) for col in zip(*vals)]
        if isinstance(v0, (int, float)) and not isinstance(v0, bool):
            return sum(vals) / len(vals)
        return v0

    out = mean(results)
    out["config"] = {k: v for k, v in results[0].get("config", {}).items() if k != "seed"}  # one config for every seed
    out["seeds"] = [r["seed"] for r in results]
    out["seconds"] = sum(r["seconds"] for r in results)
    out["spread"] = [max(r["learning_curve"][i]["new"]["all/top1_eff"] for r in results)
                     - min(r["learning_curve"][i]["new"]["all/top1_eff"] for r in results)
                     for i in range(len(results[0]["learning_curve"]))]
    out["per_seed"] = [{"seed": r["seed"], "new_all_top1": [c["new"]["all/top1_eff"] for c in r["learning_curve"]],
                        "base_all_top1": [c["base"]["all/top1_eff"] for c in r["learning_curve"]]} for r in results]
    return out


def _rel(p: Path) -> str:
    r = Path(p).resolve()
    return str(r.relative_to(REPO)) if r.is_relative_to(REPO) else Path(p).name


def _cells(fig: dict[str, float], keys: tuple[str, ...]) -> str:
    return " | ".join(f"{fig[k]:.3f}" if k in fig else "—" for k in keys)


def markdown(res: dict[str, Any], command: str) -> str:
    b, n = res["base"]["device"], res["new"]["device"]
    keys = RANK_KEYS + (PAD_KEY,)
    head = "| fp16 top-1 | bf16 top-1 | fp32 top-1 | fp16 top-5 | bf16 top-5 | fp32 top-5 | pad vs oracle |"
    lines = [f"# Transfer: {b} -> {n}{' (QUICK: a few batches per fit, numbers mean little)' if res['quick'] else ''}",
             "", f"Held-out problems: {res['held_out'][n]:.0f} of {n} (`{res['new']['folder']}`), {res['held_out'][b]:.0f} of "
             f"{b} (`{res['base']['folder']}`); "
             + (f"the mean over {len(res['seeds'])} seeds ({', '.join(map(str, res['seeds']))}), each its own split and "
                "training" if "seeds" in res else f"one split (seed {res['seed']})")
             + ": a shape measured on both devices is held out on both. Every model below but the shipped one trains with the same config "
             f"(`{'quick' if res['quick'] else 'full'}` of benchmarks/studies/transfer.py: gemm {res['config']['hidden']}, "
             f"epochs {res['config']['epochs']}).", "",
             f"## {n} held-out problems", "", f"| model | trained on | {head[2:]}", "|---|---|" + "---:|" * 7]
    only = res["models"]["base_only"]
    if "shipped" in res["models"]:
        s = res["models"]["shipped"]
        lines.append(f"| shipped `{s['folder']}`, as served (zero-shot) | {s['trained_on']} | {_cells(s['new_as_served'], keys)} |")
    lines.append(f"| {b}-only, as served (zero-shot) | {b} | {_cells(only['new_as_served'], keys)} |")
    lines.append(f"| {b}-only, with the {n} spec's device features | {b} | {_cells(only['new_with_new_spec'], keys)} |")
    for c in res["learning_curve"]:
        lines.append(f"| joint, {c['fraction']:.0%} of {n} training problems ({c['new_train_problems']:.0f}) | {b} + {n} | "
                     f"{_cells(c['new'], keys)} |")
    if "spread" in res:
        lines += ["", f"Seed to seed, the {n} all-dtype top-1 of the joint model spans "
                  + ", ".join(f"{s:.3f} at {c['fraction']:.0%}" for s, c in zip(res["spread"], res["learning_curve"]))
                  + " (max - min over the seeds; per seed in the JSON): differences smaller than that are noise."]
    lines += ["", f"## {b} held-out problems: joint against {b}-only", "",
              "| model | fp16 top-1 | bf16 top-1 | fp32 top-1 | all top-1 | all top-5 | pad vs oracle |",
              "|---|" + "---:|" * 6]
    bkeys = ("float16/top1_eff", "bfloat16/top1_eff", "fp32_all/top1_eff", "all/top1_eff", "all/top5_eff", PAD_KEY)
    lines.append(f"| {b}-only | {_cells(only['base'], bkeys)} |")
    for c in res["learning_curve"]:
        lines.append(f"| joint, {c['fraction']:.0%} of {n} | {_cells(c['base'], bkeys)} |")
    lines += [""] + [f"- {note}" for note in res["notes"]]
    lines += ["", f"Top-k: geomean over held-out problems of (best measured config / best of the model's k picks); pad: "
              f"the model's decisions' total time / the oracle's. {res['seconds']:.0f} s on this machine's CPU.",
              f"Regenerate: `{command}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the base device's dataset folder (the default device)")
    ap.add_argument("--new", type=Path, required=True, help="the new device's dataset folder (same kernel)")
    ap.add_argument("--shipped", type=Path, default=None, help="also a shipped model folder, zero-shot as it serves")
    ap.add_argument("--fractions", default="0,0.1,0.3,1", help="fractions of the new device's training problems")
    ap.add_argument("--quick", action="store_true", help="a few batches per fit (tests, smoke runs)")
    ap.add_argument("--seed", type=int, default=0, help="split and training seed (the shipped models': 0)")
    ap.add_argument("--seeds", default=None, help="several seeds, comma-separated: the tables give their mean")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--hidden", default=None, help="gemm head widths, e.g. 128,128,128")
    ap.add_argument("--out", type=Path, default=None, help="JSON result (default benchmarks/results/transfer_<new device>.json)")
    args = ap.parse_args(argv)
    fractions = [float(f) for f in args.fractions.split(",") if f.strip()]
    if not fractions or any(not 0 <= f <= 1 for f in fractions):
        ap.error(f"--fractions: values in [0, 1], got {args.fractions!r}")
    overrides: dict[str, Any] = {}
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.hidden:
        overrides["hidden"] = tuple(int(h) for h in args.hidden.split(","))
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    runs = [run(args.base, args.new, fractions, args.quick, sd, args.shipped, overrides) for sd in seeds]
    res = runs[0] if len(runs) == 1 else average(runs)
    command = "python -m benchmarks.studies.transfer " + " ".join(
        [f"--base {res['base']['folder']}", f"--new {res['new']['folder']}"]
        + ([f"--shipped {res['models']['shipped']['folder']}"] if "shipped" in res["models"] else [])
        + ([f"--fractions {args.fractions}"] if args.fractions != "0,0.1,0.3,1" else [])
        + (["--quick"] if args.quick else [])
        + ([f"--seeds {args.seeds}"] if args.seeds else [f"--seed {args.seed}"] if args.seed else [])
        + ([f"--epochs {args.epochs}"] if args.epochs is not None else []) + ([f"--hidden {args.hidden}"] if args.hidden else []))
    res["command"] = command
    from benchmarks._shared.runner import save_results

    out = args.out or REPO / "benchmarks" / "results" / f"transfer_{res['new']['device']}.json"
    save_results(out, res, markdown(res, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
