"""A model folder with RANDOM weights, in the real artifact format -- for tests and for timing the
serving path before a trained model exists. Its predictions mean nothing.

The normalisation statistics are those of a realistic sample of problems and configs, and every
BatchNorm carries non-trivial running statistics, so that folding and standardisation are exercised.

A test fixture, not part of the package (the wheel does not ship tests/): tests import it as
tests._synthetic, and benchmarks (--synthetic) likewise, with the repo root on sys.path.
"""
from __future__ import annotations

import copy
import hashlib
import math
import random
from pathlib import Path
from typing import Any

import torch

from perfmodel.onnx_export import export_onnx_all
from perfmodel.artifact import (KERNEL_MODE_VALUES, ModelBundle, config_heads, config_network,
                                save)
from perfmodel.configs import exhaustive_space, pruned_space
from perfmodel.devices import DEFAULT_DEVICE, get_spec
from perfmodel.features import FeatureEncoder, configs_tensor, pad_tensor, problems_tensor
from perfmodel.model import MLPConfig, PerfMLP, floor_features
from perfmodel.schema import DTYPES, GemmConfig, GemmProblem, PadProblem


def _sample_problems(rng: random.Random, n: int) -> list[GemmProblem]:
    def dim() -> int:
        return max(1, int(2 ** rng.uniform(0, 14)))

    out = []
    for _ in range(n):
        dtype = rng.choice(DTYPES)
        out.append(GemmProblem(m=dim(), n=dim(), k=dim(), dtype=dtype,
                               allow_tf32=dtype == "float32" and rng.random() < 0.5,
                               transpose_left=rng.random() < 0.3, transpose_right=rng.random() < 0.3))
    return out


def _sample_pads(rng: random.Random, n: int) -> list[PadProblem]:
    def dim() -> int:
        return max(1, int(2 ** rng.uniform(0, 14)))

    return [PadProblem(m=dim(), k=dim(), n=dim(), dtype=rng.choice(DTYPES), transpose_left=rng.random() < 0.3,
                       transpose_right=rng.random() < 0.3, prepadded_left=rng.random() < 0.2,
                       prepadded_right=rng.random() < 0.2) for _ in range(n)]


def _randomise_batchnorm(head: PerfMLP, gen: torch.Generator) -> None:
    with torch.no_grad():
        for mod in head.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=gen) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=gen) * 1.5 + 0.5)
                mod.weight.copy_(torch.rand(mod.num_features, generator=gen) * 0.5 + 0.75)
                mod.bias.copy_(torch.randn(mod.num_features, generator=gen) * 0.05)


def make_synthetic_bundle(seed: int = 0, hidden: tuple[int, ...] = (256, 256, 256, 256),
                          with_pad: bool = True, with_cublas: bool = True, screen: str | None = "copy",
                          members: int = 1, average: str = "after_floor",
                          devices: tuple[str, ...] = (DEFAULT_DEVICE,), screen_keep: int | None = None,
                          lead_keep: int | None = None, config_net: bool = False) -> ModelBundle:
    """An H100 bundle whose heads have random weights (seeded) and realistic normalisation.
    devices: the device specs it claims to be trained for, its default first (more than one: metadata
    "devices" and "device_specs" as a joint model's; the normalisation is the first device's).
    screen: "copy" (a student head identical to the gemm head, screening the ranking: ranking must then equal
    the full ranking), "random" (a screening student of its own random weights, 2 x 64), or None (no student).
    with_cublas: a problem network of one output, torch.mm's time (metadata "problem_outputs": ["cublas"]).
    Only heads of the current layout (perfmodel/heads/); an older folder is tests/test_migrate.py's to make.
    members: > 1 makes the gemm head an ensemble (PerfMLP.ensemble, averaged `average`) of that many
    random heads. screen_keep / lead_keep: set in the metadata when given (perfmodel.ranking).
    config_net: the gemm head a config network (one input more, the kernel mode; perfmodel.artifact.config_network)
    serving both kernel modes; a "copy" screen is then a copy of its autotune mode."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    spec = get_spec(devices[0])
    problems = _sample_problems(rng, 64)
    configs = pruned_space("float16", spec)
    kinds = ["gemm"] + (["cublas"] if with_cublas else []) + (["pad"] if with_pad else [])
    heads, encoders = {}, {}
    for kind in kinds:
        enc = FeatureEncoder(spec, kind)
        if kind == "gemm":
            x = enc.encode_cross(problems_tensor(problems), configs_tensor(configs))
        elif kind == "cublas":
            x = enc.encode(problems_tensor(problems))
        else:
            x = enc.encode_pad(pad_tensor(_sample_pads(rng, 256)))
        parts = []
        modes = config_net and kind == "gemm"
        if modes:  # the kernel-mode column: half the rows each mode
            x = torch.cat([x, (torch.arange(len(x)) % 2).float().unsqueeze(1)], 1)
        for _ in range(members if kind == "gemm" else 1):
            head = PerfMLP(MLPConfig(n_inputs=len(enc) + modes, hidden=hidden, n_outputs=2 if kind == "pad" else 1,
                                     floor_features=floor_features(enc.names, 2 if kind == "pad" else 1)))
            head.set_normalisation(x.mean(0), x.std(0))
            _randomise_batchnorm(head, gen)
            parts.append(head.eval())
        head = parts[0] if len(parts) == 1 else PerfMLP.ensemble(parts, average)
        name = "problem" if kind == "cublas" else kind  # the problem network with its cuBLAS output alone
        heads[name], encoders[name] = head.eval(), enc
        if modes:
            net = heads.pop("gemm")
            heads.update(config_heads(net, KERNEL_MODE_VALUES))
            x = x[:, :-1]
        if kind == "gemm" and screen == "copy":
            heads["student"], encoders["student"] = copy.deepcopy(head).eval(), enc
        elif kind == "gemm" and screen == "random":
            small = PerfMLP(MLPConfig(n_inputs=len(enc), hidden=(64, 64), floor_features=floor_features(enc.names, 1)))
            small.set_normalisation(x.mean(0), x.std(0))
            _randomise_batchnorm(small, gen)
            heads["student"], encoders["student"] = small.eval(), enc
    meta = {"pad_threshold": 1.1, "synthetic": True, "seed": seed}
    if screen is not None:
        meta["screen_head"] = "student"
    if with_cublas:
        meta["problem_outputs"] = ["cublas"]
        encoders["cublas"] = encoders["problem"]
    meta.update({k: v for k, v in (("screen_keep", screen_keep), ("lead_keep", lead_keep)) if v is not None})
    if len(devices) > 1:
        meta.update(devices=list(devices), device_specs={d: get_spec(d).as_dict() for d in devices})
    if config_net:
        return config_network(ModelBundle(spec, heads, encoders, meta), net)
    return ModelBundle(spec, heads, encoders, meta)


def write_synthetic_model(folder: Path, seed: int = 0, onnx: bool = True, **kwargs) -> Path:
    """Writes a complete model folder (weights, metadata, model.onnx, card) with random weights."""
    folder = Path(folder)
    bundle = make_synthetic_bundle(seed, **kwargs)
    save(bundle, folder)
    if onnx:
        export_onnx_all(bundle, folder)
    (folder / "MODEL_CARD.md").write_text(
        "# SYNTHETIC model (random weights)\n\nWritten by tests._synthetic.write_synthetic_model for tests "
        f"and latency benchmarks (seed {seed}). Its predictions mean nothing.\n")
    return folder


# ---------------------------------------------------------------- SYNTHETIC dataset shards
# Shards in the real format whose timings come from a formula with noise: for tests of the loaders,
# training and the transfer benchmark only. Never written into data/ (tests write under tmp_path).

SYNTHETIC_DEVICE_NAMES = {"h100-sxm": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "a100-sxm": "NVIDIA A100-SXM4-80GB"}


def synthetic_header(device: str = DEFAULT_DEVICE, with_spec_name: bool = True) -> dict:
    """A shard header of `device` (as data_gen writes it; with_spec_name=False: without its device_spec
    field, as a header the loader must match by device name and SM count)."""
    spec = get_spec(device)
    h = {"device_name": SYNTHETIC_DEVICE_NAMES[device], "sm_count": spec.sm_count,
         "capability": "8.0" if device.startswith("a100") else "9.0", "kernel_hash": "synthetic-test",
         "schema_version": 1}
    return {**h, "device_spec": device, "spec": spec.as_dict()} if with_spec_name else h


def _fake_ms(p: GemmProblem, c: GemmConfig | None, rng: random.Random, dram_gbs: float) -> float:
    """A deterministic roofline-ish formula (with a tile-waste term and the compulsory bytes at the
    device's DRAM bandwidth) times 5% log-normal noise."""
    rate = {"float16": 600e12, "bfloat16": 600e12, "float32": 50e12}[p.dtype] * (8 if p.allow_tf32 else 1)
    work = 2 * p.m * p.n * p.k
    if c is not None:
        work = 2 * (-(-p.m // c.block_m) * c.block_m) * (-(-p.n // c.block_n) * c.block_n) * p.k
        rate *= min(1.0, c.num_warps * c.num_stages / 12)
    memory = (p.m * p.k + p.k * p.n + p.m * p.n) * p.dtype_bytes / (dram_gbs * 1e9)
    return round((0.006 + max(work / rate, memory) * 1e3) * math.exp(rng.gauss(0, 0.05)), 6)


def write_synthetic_dataset(folder: Path, seed: int = 0, device: str = DEFAULT_DEVICE, n_problems: int = 32,
                            configs: int = 8, n_pads: int = 40, header: dict | None = None) -> Path:
    """n_problems problems x `configs` configs over the four modes (plus a cuBLAS row each) and n_pads pad
    rows of one device, written with ShardWriter in the row format of data_gen/gemm_sweep.py and
    data_gen/pad_sweep.py. The same seed gives the same problems and configs on every device."""
    rng = random.Random(seed)
    dram = get_spec(device).dram_bw_gbs
    header = synthetic_header(device) if header is None else header
    space = exhaustive_space()
    modes = [("float16", False), ("bfloat16", False), ("float32", False), ("float32", True)]
    from perfmodel.data_gen.shards import ShardWriter

    with ShardWriter(folder, "gemm", header) as w:
        for i in range(n_problems):
            dtype, tf32 = modes[i % 4]
            p = GemmProblem(m=rng.randrange(1, 3000), n=rng.randrange(16, 3000), k=rng.randrange(16, 3000),
                            dtype=dtype, allow_tf32=tf32, transpose_left=rng.random() < 0.3,
                            transpose_right=rng.random() < 0.5)
            rows = [{**p.as_dict(), "kind": "cublas", "status": "ok", "flag": None, "ms": _fake_ms(p, None, rng, dram),
                     "reps": 100}]
            for c in rng.sample(space, configs):
                rows.append({**p.as_dict(), "kind": "triton", **c.as_dict(), "status": "ok", "flag": None,
                             "ms": _fake_ms(p, c, rng, dram), "reps": 100})
            # a failed config is data too, and must be skipped by the loader
            rows.append({**p.as_dict(), "kind": "triton", **space[0].as_dict(), "status": "fail:launch:OutOfResources",
                         "ms": None})
            w.write_unit(hashlib.sha1(f"problem-{i}".encode()).hexdigest()[:12], rows)
    with ShardWriter(folder, "pad", header) as w:
        pads = []
        for i in range(n_pads):
            dtype = ("float16", "bfloat16", "float32")[i % 3]
            pp = PadProblem(m=rng.randrange(1, 2000) | 1, k=rng.randrange(2, 2000) | 1, n=rng.randrange(2, 2000),
                            dtype=dtype, transpose_left=rng.random() < 0.3, transpose_right=rng.random() < 0.3,
                            prepadded_left=rng.random() < 0.2, prepadded_right=rng.random() < 0.2,
                            allow_tf32=dtype == "float32" and rng.random() < 0.5)
            mp, kp, np_ = pp.padded_dims()
            orig = _fake_ms(pp.gemm(), None, rng, dram) * (1.5 if pp.needs_padding() else 1.0)
            copy_ms = 2 * mp * kp * pp.gemm().dtype_bytes / (dram * 1e9) * 1e3 * (not pp.prepadded_left)
            padded = _fake_ms(pp.gemm(padded=True), None, rng, dram) + 1e-3 * (not pp.prepadded_left) + copy_ms
            pads.append({**pp.as_dict(), "padded_m": mp, "padded_k": kp, "padded_n": np_, "orig_ms": orig,
                         "padded_ms": round(padded, 6), "reps": 100, "status": "ok", "flag": None})
        for j in range(0, len(pads), 25):
            w.write_unit(f"pad-unit-{j}", pads[j:j + 25])
    return folder


def write_synthetic_bmm(folder: Path, seed: int = 0, device: str = DEFAULT_DEVICE, n_problems: int = 24,
                        configs: int = 8, header: dict | None = None) -> Path:
    """n_problems bmm problems (every fourth one a re-batched copy of the one before: the sweep's "rebatch")
    over the four modes, `configs` configs each plus a failed one, an aten::bmm row and an aten_pad row,
    written with ShardWriter in the row format of data_gen/bmm_sweep.py. Timings: _fake_ms of one matrix
    times the batch."""
    from perfmodel.data_gen.bmm import problem_id
    from perfmodel.data_gen.shards import ShardWriter

    rng = random.Random(seed)
    dram = get_spec(device).dram_bw_gbs
    header = {**(synthetic_header(device) if header is None else header), "kind": "bmm"}
    space = exhaustive_space()
    modes = [("float16", False), ("bfloat16", False), ("float32", False), ("float32", True)]
    with ShardWriter(folder, "bmm", header) as w:
        p = None
        for i in range(n_problems):
            dtype, tf32 = modes[i % 4]
            if p is not None and i % 4 == 3:
                p = GemmProblem(**{**p.as_dict(), "batch": p.batch * 2})
            else:
                p = GemmProblem(m=rng.randrange(16, 1000), n=rng.randrange(16, 1000), k=rng.randrange(16, 600),
                                dtype=dtype, allow_tf32=tf32, transpose_right=rng.random() < 0.5,
                                batch=rng.choice((8, 16, 64)))
            one = GemmProblem(**{**p.as_dict(), "batch": 1})
            base = {**p.as_dict(), "batch": p.batch, "family": ("attn_score", "small")[i % 2]}
            rows = [{**base, "kind": "aten", "status": "ok", "ms": p.batch * _fake_ms(one, None, rng, dram)},
                    {**base, "kind": "aten_pad", "status": "ok", "ms": 1.0, "padded_m": p.m, "padded_k": p.k,
                     "padded_n": p.n}]
            for j, c in enumerate(rng.sample(space, configs)):
                rows.append({**base, "kind": "triton", **c.as_dict(), "source": "default" if j < configs // 2 else
                             "exhaustive", "status": "ok", "ms": p.batch * _fake_ms(one, c, rng, dram)})
            rows.append({**base, "kind": "triton", **space[0].as_dict(), "source": "default",
                         "status": "fail:launch:OutOfResources", "ms": None})
            w.write_unit(problem_id(p), rows)
    return folder


def write_retimed_run(folder: Path, run: Path, pick: slice, factor: Any = 1.1, **extra: Any) -> Path:
    """SYNTHETIC: a GPU run folder as benchmarks/static_retime.py or tutorial_kernel.py `sweep` writes it
    (run/static_rows.jsonl.gz): the Triton rows of the folder's problems sorted[pick] (by unit), each row's ms times
    `factor` (a number, or a function of the row), with the `extra` fields added. Returns run."""
    import gzip
    import json

    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(folder, "gemm")
    keep = set(sorted({r["unit"] for r in rows})[pick])
    scale = factor if callable(factor) else (lambda r: factor)
    run.mkdir(parents=True)
    with gzip.open(run / "static_rows.jsonl.gz", "wt") as fh:
        for r in rows:
            if r["unit"] in keep and r["kind"] == "triton":
                fh.write(json.dumps({**r, "ms": r["ms"] and r["ms"] * scale(r), **extra}) + "\n")
    return run
