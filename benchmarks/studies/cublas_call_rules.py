"""Two rules for "cuBLAS or Triton", measured on the held-out problems of the shipped data (CPU).

The Predictor has to answer one question -- is cuBLAS (torch.mm) faster than the best Triton config? -- and
show the two times beside its answer. Two rules give an answer that agrees with the times shown:

- "call": the model's call head for the kernel mode (fitted to log(cuBLAS ms / best measured Triton ms))
  decides, and the cuBLAS time shown is the one it implies: the best Triton config's predicted time over
  the whole config space x exp(call), floored at the problem's roofline (what the bmm path shows for
  aten::bmm). cuBLAS wins exactly where the call is below 0.
- "times": the cuBLAS head's time against the best Triton config's predicted time over the whole space.
- "hybrid": the call head decides, the cuBLAS head's time is shown where it agrees with the call (below the
  best config's exactly where the call is below 0), the call's implied time where it does not.

For each model folder and each of its devices' held-out problems (the model's split: split_problems /
joint_split with the model's seed; val and test), this prints per rule and kernel mode:

- the call right (truth: measured cuBLAS below the best measured Triton config of the problem);
- the cuBLAS time shown against the measured one: mean |log error|, share within 10 %;
- the whole-model set-up's decision (perfmodel.serve.compile: keep Triton beside aten where the best of
  Inductor's default configs is predicted no slower than the cuBLAS time shown), replayed on the measured
  times: the share of problems keeping Triton, and the chosen kernel's time (aten, or the faster of aten
  and the model's top-3 of the defaults, benchmarked) over the best of aten and the measured defaults,
  geomean and worst.

"best over the whole space" is the gemm head (the ensemble; kernel="inductor": the config network's inductor
mode) on every config of the device's pruned space -- the times predict and rank serve. The measured truth
takes the problem's measured configs (about 94 of them, Inductor's defaults among them).

    python -m benchmarks.studies.cublas_call_rules [--model models/h100 --data data/h100] [--json out.json]

Latest: benchmarks/results/cublas_call_rules.json (docs/model.md, "The cuBLAS call"; 4 min on the 2-core CPU).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO

TOP_K = 3  # the set-up's Triton configs kept beside aten (perfmodel.serve.compile.TOP_K)


def _space_best(bundle, head, problems: np.ndarray, chunk: int = 16) -> np.ndarray:
    """Per problem (P, 8), the least predicted log ms of `head` over the device's pruned space for its dtype."""
    from perfmodel.configs import pruned_space
    from perfmodel.features import configs_tensor
    from perfmodel.schema import DTYPE_BYTES

    enc = bundle.encoders["gemm"]
    by_bytes = {DTYPE_BYTES[d]: d for d in ("float16", "float32")}
    out = np.full(len(problems), np.inf)
    for nbytes in np.unique(problems[:, 3]):
        ct = configs_tensor(pruned_space(by_bytes[int(nbytes)], bundle.spec))
        part = enc.config_part(ct)
        idx = np.flatnonzero(problems[:, 3] == nbytes)
        for s in range(0, len(idx), chunk):
            sel = idx[s:s + chunk]
            with torch.inference_mode():
                x = enc.encode_cross(torch.from_numpy(problems[sel]), ct, part)
                log_ms = head.floor(head.score(x), x).double().numpy().reshape(len(sel), -1)
            out[sel] = log_ms.min(axis=1)
    return out


def _defaults_mask(configs: np.ndarray) -> np.ndarray:
    from perfmodel.configs import inductor_default_configs

    keys = {tuple(c.triton_kwargs()[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_stages", "num_warps"))
            for c in inductor_default_configs()}
    return np.array([tuple(int(v) for v in row) in keys for row in configs])


def measure(bundle, table, mode: str) -> dict:
    """The two rules on one table's problems (GemmTable: measured rows and cuBLAS times) for a kernel mode."""
    from perfmodel import artifact
    from perfmodel.train import evaluate as ev

    head = bundle.heads[artifact.INDUCTOR_GEMM] if mode == "inductor" and artifact.INDUCTOR_GEMM in bundle.heads \
        else bundle.heads["gemm"]
    call_head = artifact.problem_output(bundle, artifact.CALL_STATIC if mode == "inductor" else artifact.CALL)
    rows = table.problem_rows()
    ok = np.array([len(r) > 0 and np.isfinite(table.cublas_ms[i]) for i, r in enumerate(rows)])
    probs = table.problems[ok]
    rows = [r for r, o in zip(rows, ok) if o]
    cub_meas = np.log(table.cublas_ms[ok])
    best_meas = np.log(np.array([table.ms[r].min() for r in rows]))
    truth = cub_meas < best_meas
    with torch.inference_mode():
        cx = bundle.encoders["cublas"].encode(torch.from_numpy(probs))
        cub_head = ev.head_outputs(artifact.problem_output(bundle, "cublas"), cx)[1]
        call = None if call_head is None else call_head.score(cx).double().numpy().reshape(-1)
        roof = cx[:, bundle.encoders["cublas"].names.index("log_roofline_ms")].double().numpy()
    space = _space_best(bundle, head, probs)
    shown = {"times": cub_head}
    if call is not None:
        shown["call"] = np.maximum(space + call, roof)
        # the cuBLAS head's time where it agrees with the call, the call's time where it does not
        shown["hybrid"] = np.where((cub_head < space) == (call < 0), cub_head, shown["call"])
    # the set-up's replay: Inductor's default configs among each problem's measured rows
    is_def = _defaults_mask(table.configs)
    with torch.inference_mode():
        P, C = torch.from_numpy(table.problems[table.problem_idx]), torch.from_numpy(table.configs)
        x = bundle.encoders["gemm"].encode(P, C)
        pred = head.floor(head.score(x), x).double().numpy()
    out: dict = {"problems": int(ok.sum()), "cublas_wins": float(truth.mean())}
    for rule, cub in shown.items():
        err = np.abs(cub - cub_meas)
        r: dict = {"call_right": float(((cub < space) == truth).mean()),
                   "cublas_abs_log_err": float(err.mean()), "cublas_within_10pct": float((err < np.log(1.1)).mean())}
        kept, ratio = [], []
        for i, rr in enumerate(rows):
            d = rr[is_def[rr]]
            if not len(d):
                continue
            order = d[np.argsort(pred[d], kind="stable")]
            keep = pred[order[0]] <= cub[i]          # decisions.triton_expected_gain at gain 0
            aten = table.cublas_ms[ok][i]
            chosen = min(aten, table.ms[order[:TOP_K]].min()) if keep else aten
            kept.append(keep)
            ratio.append(chosen / min(aten, table.ms[d].min()))
        ratio = np.asarray(ratio)
        r.update(setup_problems=len(ratio), setup_keeps_triton=float(np.mean(kept)),
                 setup_vs_best_geomean=float(np.exp(np.log(ratio).mean())), setup_worst=float(ratio.max()))
        out[rule] = r
    return out


def main(argv: list[str] | None = None) -> int:
    from perfmodel import artifact
    from perfmodel.train.data import joint_split, load_device_datasets
    from perfmodel.train.static_head import has_static_rows, load_static, split_static

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=None, help="model folder (repeatable; default both shipped)")
    ap.add_argument("--data", action="append", default=None,
                    help="dataset folders of the last --model's devices, its default device's first (repeatable)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    runs = [("models/h100", ["data/h100"]), ("models/h200", ["data/h100", "data/h200"])] if args.model is None \
        else [(m, args.data or ["data/h100"]) for m in args.model]
    torch.set_num_threads(2)
    results = []
    for model, folders in runs:
        bundle0 = artifact.load(REPO / model if not Path(model).is_absolute() else model)
        datasets = load_device_datasets([Path(f) if Path(f).is_absolute() else REPO / f for f in folders])
        seed = int(bundle0.metadata.get("settings", {}).get("seed", 0))
        splits, _ = joint_split(datasets, seed)
        for ds, split in zip(datasets, splits):
            bundle = bundle0.for_device(ds.device)
            modes = ["autotune"] + (["inductor"] if artifact.inductor_head(bundle.heads) and has_static_rows(ds.folder) else [])
            for mode in modes:
                static = load_static(ds.folder) if mode == "inductor" else None
                for part, which in (("val", 1), ("test", 2)):
                    table = ds.gemm.subset(split == which) if static is None else split_static(ds.gemm, static, split, which)
                    res = {"model": model, "device": ds.device, "kernel": mode, "split": part, **measure(bundle, table, mode)}
                    results.append(res)
                    line = f"{model} {ds.device} {mode:8s} {part:4s} n={res['problems']:3d} cuBLAS wins {res['cublas_wins']:.3f}"
                    for rule in ("call", "hybrid", "times"):
                        if rule in res:
                            r = res[rule]
                            line += (f" | {rule}: right {r['call_right']:.3f}, |log err| {r['cublas_abs_log_err']:.4f} "
                                     f"(10% {r['cublas_within_10pct']:.2f}), set-up keeps {r['setup_keeps_triton']:.3f} "
                                     f"at {r['setup_vs_best_geomean']:.4f}x (worst {r['setup_worst']:.3f})")
                    print(line, flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
