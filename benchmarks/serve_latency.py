"""Serving latency: our Predictor (torch and onnxruntime backends) vs PR 156851's serving path, on the CPU.

Ranks 368 configs (a stratified sample of the H100 fp16 pruned space) for one problem, and for 100
problems (rank / rank_many, top 5; and the screened fast path, rank(screened=True)), and predicts the time of
every one of them (predict / predict_many; the PR path: its encoding and network without the sort), and
reports p50/p90 wall time of each path and the speed-ups, plus the model's load time.

The PR 156851 path is reproduced from its torch/_inductor/models/mm_kernel_prediction_model.py
(shared/seeds/004): per request a pandas DataFrame of the 9 raw columns built from each config's
all_kwargs(), the derived total_gb / total_gflop / flops_per_byte columns, the 12 columns reordered,
np.log of every column, standardisation with its fixed mean/std, then its NeuralNetwork -- 6 hidden
layers of 256 with BatchNorm (eval mode), and logsumexp with the fixed 0.00541 ms overhead -- on the
CPU (the PR ran an AOTInductor package on CUDA; its weights were never published, so they are random
here: only the latency is compared). It handles one problem per call, as the PR did; ours batches.

    python -m benchmarks.serve_latency [--model PATH] [--repeats 50] [--block 10] [--out results.json]
    python -m benchmarks.serve_latency --synthetic     # random-weight model, before a trained one exists

pandas is imported only here (the reproduced path needs it; serving does not).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from benchmarks import REPO

from perfmodel.configs import pruned_space, stratified_sample
from perfmodel.devices import DEFAULT_DEVICE, get_spec
from perfmodel.locations import default_model_dir
from perfmodel.schema import GemmConfig, GemmProblem

N_CONFIGS = 368
N_PROBLEMS = 100

# --------------------------------------------------------------------------------------------------
# PR 156851's serving path (torch/_inductor/models/mm_kernel_prediction_model.py), CPU instead of CUDA.
PR_COLUMNS = ["dtype_size", "dim_m", "dim_n", "dim_k", "total_gb", "total_gflop", "flops_per_byte",
              "config_block_k", "config_block_m", "config_block_n", "config_num_stages", "config_num_warps"]
PR_MEAN = [2.78275084, 8.23996746, 7.27791873, 7.92035942, -2.39558163, 3.40679233, 5.80237395, 3.95781827,
           4.19478321, 4.19098234, 0.9045909, 1.28331208]
PR_STD = [0.08322756, 2.31893439, 1.65605574, 2.15447078, 2.19682881, 2.99600806, 1.24328795, 0.92352521,
          0.93849802, 0.93872011, 0.57455891, 0.5837217]


class PRNeuralNetwork(nn.Module):
    """The PR's NeuralNetwork: Linear+BatchNorm+ReLU hidden layers, a Linear to 1, then
    logsumexp(pred, log(kernel_overhead))."""

    def __init__(self, n_inputs: int = 12, hidden_layer_widths: Sequence[int] = (256,) * 6,
                 kernel_overhead: float = 0.00541) -> None:
        super().__init__()
        self.log_kernel_overhead = float(np.log(kernel_overhead))
        widths_out = list(hidden_layer_widths) + [1]
        widths_in = [n_inputs] + list(hidden_layer_widths)
        layers: list[nn.Module] = []
        for n_in, n_out in zip(widths_in, widths_out, strict=True):
            layers += [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out), nn.ReLU()]
        self.linear_relu_stack = nn.Sequential(*layers[:-2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        log_base_pred = self.linear_relu_stack(x)
        log_overhead_tsr = torch.full_like(input=log_base_pred, fill_value=self.log_kernel_overhead)
        return torch.logsumexp(torch.stack([log_base_pred, log_overhead_tsr], dim=-1), dim=-1)


class PRModelWrapper:
    """ModelWrapper.encode / get_nn_x / inference, as in the PR."""

    def __init__(self) -> None:
        import pandas as pd  # the PR's dependency; only this benchmark imports it

        self.pd = pd
        self.model = PRNeuralNetwork().eval()
        self.mean_for_standardization = torch.tensor(PR_MEAN, dtype=torch.float64)
        self.std_for_standardization = torch.tensor(PR_STD, dtype=torch.float64)

    @staticmethod
    def vec(m: int, n: int, k: int, dsize: int, config: Any) -> tuple[int, ...]:
        kwargs = config.all_kwargs()
        return (int(m), int(n), int(k), int(dsize), int(kwargs["BLOCK_M"]), int(kwargs["BLOCK_N"]),
                int(kwargs["BLOCK_K"]), int(kwargs["num_stages"]), int(kwargs["num_warps"]))

    def get_nn_x(self, df: Any) -> torch.Tensor:
        x_df = df[PR_COLUMNS].copy()
        for col in x_df.columns:
            x_df[col] = np.log(x_df[col])
        x_tens = torch.from_numpy(x_df.astype(float).to_numpy())
        x_tens -= self.mean_for_standardization
        x_tens /= self.std_for_standardization
        return x_tens.to(torch.float32)

    def encode(self, m: int, n: int, k: int, dtype: torch.dtype, configs: list[Any]) -> torch.Tensor:
        if dtype == torch.bfloat16 or dtype == torch.float16:
            dsize = 16
        elif dtype == torch.float32:
            dsize = 32
        else:
            raise ValueError(f"Unsupported dtype: {dtype}. Add support for this dtype.")
        df = self.pd.DataFrame(
            columns=["dim_m", "dim_n", "dim_k", "dtype_size", "config_block_m", "config_block_n",
                     "config_block_k", "config_num_stages", "config_num_warps"],
            data=[self.vec(m, n, k, dsize, config) for config in configs])
        dm, dn, dk, ds = df["dim_m"], df["dim_n"], df["dim_k"], df["dtype_size"] / 8
        df["total_gb"] = (((dm * dk + dk * dn + dm * dn) * ds) / 1e9).astype(np.float32)
        df["total_gflop"] = ((2 * dm * dn * dk) / 1e9).astype(np.float32)
        df["flops_per_byte"] = df["total_gflop"] / df["total_gb"]
        return self.get_nn_x(df[PR_COLUMNS])

    def inference(self, inp: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.model(inp)

    def predict(self, m: int, n: int, k: int, dtype: torch.dtype, configs: list[Any]) -> np.ndarray:
        """The PR's predicted times for every config (its inference on its encoding), as ms."""
        return self.inference(self.encode(m, n, k, dtype, configs)).squeeze(-1).exp().numpy()

    def rank(self, m: int, n: int, k: int, dtype: torch.dtype, configs: list[Any], top_k: int = 5) -> list[Any]:
        pred = self.inference(self.encode(m, n, k, dtype, configs)).squeeze(-1)
        return [configs[i] for i in torch.argsort(pred)[:top_k].tolist()]


def _triton_configs(configs: Sequence[GemmConfig]) -> list[Any]:
    """The PR ranked Inductor's triton.Config objects; use them when triton is importable."""
    try:
        from triton import Config
    except ImportError:
        class Config:  # type: ignore[no-redef]  # the part of triton.Config the PR touches
            def __init__(self, kwargs: dict, num_warps: int, num_stages: int) -> None:
                self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages

            def all_kwargs(self) -> dict:
                return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}
    return [Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m},
                   num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


# --------------------------------------------------------------------------------------------------
def _problems(n: int, seed: int) -> list[GemmProblem]:
    rng = np.random.default_rng(seed)
    dims = np.exp(rng.uniform(np.log(16), np.log(16384), size=(n, 3))).astype(int)
    return [GemmProblem(m=int(m), n=int(nn_), k=int(k), dtype="float16") for m, nn_, k in dims]


def _time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3,
                      block: int = 1) -> dict[str, dict]:
    """Times every path `repeats` times, alternating between paths in blocks of `block` calls (the
    first path of a round rotates): a slow spell of a shared, noisy machine then hits all paths alike
    instead of whichever ran during it. block=1 alternates call by call, so each call runs right after
    another path's (caches and predictors hold that path's state); a larger block times each path warm,
    as repeated calls from one caller run. Per path: p50/p90 ms, and the median over rounds of
    (first path's block median / this path's), the speed-up measured side by side."""
    names = list(fns)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    ts: dict[str, list[float]] = {n: [] for n in names}
    rounds: dict[str, list[float]] = {n: [] for n in names}
    block = max(1, block)
    for r in range(max(1, repeats // block)):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, times = fns[name], []
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            ts[name] += times
            rounds[name].append(float(np.median(times)))
    base = np.asarray(rounds[names[0]])
    return {n: {"p50_ms": float(np.percentile(t, 50)), "p90_ms": float(np.percentile(t, 90)), "n": len(t),
                "speedup_round_median": float(np.median(base / np.asarray(rounds[n])))} for n, t in ts.items()}


def _cpu_times() -> list[int] | None:
    """The aggregate 'cpu' line of /proc/stat (Linux): user nice system idle iowait irq softirq steal."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None


def _portable(path: Path) -> str:
    """The model path as recorded: relative to the checkout when inside it (no machine paths)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return Path(path).name


def run(model: Path, repeats: int, seed: int, block: int = 10) -> dict[str, Any]:
    from perfmodel.serve import Predictor

    spec = get_spec(DEFAULT_DEVICE)
    configs = stratified_sample(pruned_space("float16", spec), N_CONFIGS, seed)
    problems = _problems(N_PROBLEMS, seed)
    one = GemmProblem(m=4096, n=4096, k=4096, dtype="float16")
    out: dict[str, Any] = {"model": _portable(model), "n_configs": len(configs), "n_problems": len(problems),
                           "torch": torch.__version__, "python": platform.python_version(),
                           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                           "block": block}
    load: dict[str, float] = {}
    preds: dict[str, Any] = {}
    for backend in ("torch", "onnx"):
        t0 = time.perf_counter()
        preds[backend] = Predictor.load(model, backend=backend)
        load[backend] = (time.perf_counter() - t0) * 1e3
    out["load_ms"] = load
    out["predict_head"] = preds["onnx"].predict_head
    try:
        out["loadavg_before"] = os.getloadavg()[0]
    except OSError:
        pass
    out["torch_threads"] = torch.get_num_threads()

    pr = PRModelWrapper()
    tconfigs = _triton_configs(configs)
    base_name = "PR 156851 (pandas + eager MLP)"
    # what is timed, per call kind: the PR path's call, and ours (p: a Predictor)
    calls: dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]] = {
        "one": (lambda: pr.rank(one.m, one.n, one.k, torch.float16, tconfigs),
                lambda p: p.rank(one, configs, top_k=5)),
        # one batched pass over 100 problems x 368 configs
        "many": (lambda: [pr.rank(p.m, p.n, p.k, torch.float16, tconfigs) for p in problems],
                 lambda p: p.rank_many(problems, configs, top_k=5)),
        "predict_one": (lambda: pr.predict(one.m, one.n, one.k, torch.float16, tconfigs),
                        lambda p: p.predict(one, configs)),
        "predict_many": (lambda: [pr.predict(p.m, p.n, p.k, torch.float16, tconfigs) for p in problems],
                         lambda p: p.predict_many(problems, configs)),
        # the named fast path: the screen (the student) on every config, the gemm head on its best
        "one_screened": (lambda: pr.rank(one.m, one.n, one.k, torch.float16, tconfigs),
                         lambda p: p.rank(one, configs, top_k=5, screened=True)),
        "many_screened": (lambda: [pr.rank(p.m, p.n, p.k, torch.float16, tconfigs) for p in problems],
                          lambda p: p.rank_many(problems, configs, top_k=5, screened=True)),
    }
    before = _cpu_times()
    # Each backend is interleaved with the PR path on its own: a process serves with one backend, and
    # one backend's idle threads would otherwise compete with the other's.
    rows: dict[str, dict[str, Any]] = {}
    for backend, p in preds.items():
        name = f"ours, {backend}"
        base_row: dict[str, Any] = {}
        row: dict[str, Any] = {}
        for kind, (pr_fn, our_fn) in calls.items():
            fns = {base_name: pr_fn, name: lambda our_fn=our_fn, p=p: our_fn(p)}
            if kind.endswith("many"):  # a 100-problem call is long: call by call
                t = _time_interleaved(fns, max(3, repeats // 10), warmup=1)
            else:
                t = _time_interleaved(fns, repeats, block=block)
            base_row[kind], row[kind] = t[base_name], t[name]
            base_row[f"speedup_{kind}_p50"] = 1.0
            row[f"speedup_{kind}_p50"] = t[base_name]["p50_ms"] / t[name]["p50_ms"]
        # the PR path as timed next to this backend, and this backend
        rows[f"{base_name}, next to {backend}"] = base_row
        rows[name] = row
    if all(p.has_bmm for p in preds.values()):
        out["bmm"] = _bmm_latency(preds, repeats, block)
    after = _cpu_times()
    if before and after:  # a VM's steal time: CPU the hypervisor gave to others while we ran
        delta = [b - a for a, b in zip(before, after)]
        out["steal_pct"] = 100.0 * delta[7] / max(1, sum(delta))
    out["results"] = rows
    return out


BMM_PROBLEM = GemmProblem(m=384, n=384, k=64, dtype="float16", transpose_right=True, batch=256)  # BERT's QK^T


def _bmm_latency(preds: dict[str, Any], repeats: int, block: int) -> dict[str, Any]:
    """One batched problem (BMM_PROBLEM) over the model device's whole bmm config space: candidates() (the
    ranking, aten::bmm's implied time and the call, what the hooks ask per bmm) and rank(), per backend,
    the backends interleaved. The PR path has no bmm: ours only."""
    space = len(preds["onnx"].rank(BMM_PROBLEM, top_k=10**6))
    fns: dict[str, Callable[[], Any]] = {}
    for backend, p in preds.items():
        fns[f"candidates, {backend}"] = lambda p=p: p.candidates(BMM_PROBLEM, top_k=3)
        fns[f"rank, {backend}"] = lambda p=p: p.rank(BMM_PROBLEM, top_k=3)
    t = _time_interleaved(fns, repeats, block=block)
    return {"problem": str(BMM_PROBLEM), "n_configs": space,
            "results": {n: {k: v for k, v in r.items() if k != "speedup_round_median"} for n, r in t.items()}}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"{res['n_configs']} configs on the CPU ({res['cpu_count']} cores, torch {res['torch']}, "
             f"{res['torch_threads']} torch threads); model {res['model']}; one problem: paths "
             + (f"alternating in blocks of {res['block']} calls" if res.get("block", 1) > 1 else "alternating call by call")
             + f"; {res['n_problems']} problems: call by call. Speed-up: the PR path's p50 / ours, and the median "
               "over rounds of the same ratio", ""]
    for title, one, many in (("rank (top 5)", "one", "many"), ("predict (every config)", "predict_one", "predict_many"),
                             ("rank(screened=True), the fast path (top 5)", "one_screened", "many_screened")):
        lines += [f"| {title} | 1 problem p50 ms | p90 ms | speed-up (p50s) | (per round) | {res['n_problems']} "
                  "problems p50 ms | p90 ms | speed-up (p50s) | (per round) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in res["results"].items():
            if one not in r:
                continue
            lines.append(f"| {name} | {r[one]['p50_ms']:.2f} | {r[one]['p90_ms']:.2f} | {r[f'speedup_{one}_p50']:.1f}x "
                         f"| {r[one]['speedup_round_median']:.1f}x | {r[many]['p50_ms']:.1f} | {r[many]['p90_ms']:.1f} "
                         f"| {r[f'speedup_{many}_p50']:.1f}x | {r[many]['speedup_round_median']:.1f}x |")
        lines.append("")
    if "bmm" in res:
        b = res["bmm"]
        lines += [f"| bmm: {b['problem']}, {b['n_configs']} configs (ours only) | p50 ms | p90 ms |", "|---|---:|---:|"]
        lines += [f"| {n} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} |" for n, r in b["results"].items()] + [""]
    lines += ["Model load: " + ", ".join(f"{b} {ms:.0f} ms" for b, ms in res["load_ms"].items())]
    if "predict_head" in res:
        lines.append(f"predict served by the {res['predict_head']} head")
    if "steal_pct" in res:
        lines.append(f"CPU steal time during the timed rounds: {res['steal_pct']:.1f} % (VM hypervisor)")
    if "loadavg_before" in res:
        lines.append(f"Load average (1 min) before the run: {res['loadavg_before']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default_model_dir(), help="model folder (default: shipped)")
    ap.add_argument("--synthetic", action="store_true", help="time a random-weight model instead (no trained one yet)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block", type=int, default=10,
                    help="one problem: calls per path before switching to the other path (1: call by call, "
                         "each call right after the other path's)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="perfmodel-bench-") as tmp:
        model = args.model
        if args.synthetic:
            from tests._synthetic import write_synthetic_model

            model = write_synthetic_model(Path(tmp) / "synthetic")
        elif not (model / "metadata.json").is_file():
            print(f"serve_latency: no model at {model} (no metadata.json). Train one, pass --model, or use "
                  "--synthetic to time a random-weight model.", file=sys.stderr)
            return 2
        res = run(model, args.repeats, args.seed, args.block)
        if args.synthetic:
            res["model"] = "SYNTHETIC (random weights)"
    print(markdown(res))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
