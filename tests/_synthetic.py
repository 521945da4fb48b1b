"""A model folder with RANDOM weights, in the real artifact format -- for tests and for timing the
serving path before a trained model exists. Its predictions mean nothing.

The normalisation statistics are those of a realistic sample of problems and configs, and every
BatchNorm carries non-trivial running statistics, so that folding and standardisation are exercised.

A test fixture, not part of the package (the wheel does not ship tests/): tests import it as
tests._synthetic, and benchmarks (--synthetic) likewise, with the repo root on sys.path.
"""
from __future__ import annotations

import copy
import random
from pathlib import Path

import torch

from perfmodel.artifact import ModelBundle, export_onnx_all, save
from perfmodel.configs import pruned_space
from perfmodel.devices import DEFAULT_DEVICE, get_spec
from perfmodel.features import FeatureEncoder, configs_tensor, pad_tensor, problems_tensor
from perfmodel.model import MLPConfig, PerfMLP, floor_features
from perfmodel.schema import DTYPES, GemmProblem, PadProblem


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
                          devices: tuple[str, ...] = (DEFAULT_DEVICE,)) -> ModelBundle:
    """An H100 bundle whose heads have random weights (seeded) and realistic normalisation.
    devices: the device specs it claims to be trained for, its default first (more than one: metadata
    "devices" and "device_specs" as a joint model's; the normalisation is the first device's).
    screen: "copy" (a screen head identical to the gemm head: ranking must then equal the full
    ranking), "random" (its own random weights, 2 x 64), or None (no screen head).
    members: > 1 makes the gemm head an ensemble (PerfMLP.ensemble, averaged `average`) of that many
    random heads."""
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
        for _ in range(members if kind == "gemm" else 1):
            head = PerfMLP(MLPConfig(n_inputs=len(enc), hidden=hidden, n_outputs=2 if kind == "pad" else 1,
                                     floor_features=floor_features(enc.names, 2 if kind == "pad" else 1)))
            head.set_normalisation(x.mean(0), x.std(0))
            _randomise_batchnorm(head, gen)
            parts.append(head.eval())
        head = parts[0] if len(parts) == 1 else PerfMLP.ensemble(parts, average)
        heads[kind], encoders[kind] = head.eval(), enc
        if kind == "gemm" and screen == "copy":
            heads["screen"], encoders["screen"] = copy.deepcopy(head).eval(), enc
        elif kind == "gemm" and screen == "random":
            small = PerfMLP(MLPConfig(n_inputs=len(enc), hidden=(64, 64), floor_features=floor_features(enc.names, 1)))
            small.set_normalisation(x.mean(0), x.std(0))
            _randomise_batchnorm(small, gen)
            heads["screen"], encoders["screen"] = small.eval(), enc
    meta = {"pad_threshold": 1.1, "synthetic": True, "seed": seed}
    if len(devices) > 1:
        meta.update(devices=list(devices), device_specs={d: get_spec(d).as_dict() for d in devices})
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
