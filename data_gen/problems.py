"""GEMM and pad problems to measure: random dims (aligned and unaligned, as AutoHeuristic's
gen_data_pad_mm.py) and the GEMM shapes of real models, within a memory/time budget."""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from perfmodel.devices import DeviceSpec
from perfmodel.schema import GemmProblem, PadProblem

# (M, K, N) of the seed table (benchmarks/dynamo/microbenchmarks/inductor_mm.py): A is (M, K), B is (K, N).
SEED_SHAPES = [
    (128, 9216, 4096), (128, 4096, 4096), (128, 4096, 1000),   # AlexNet
    (2048, 768, 768), (2048, 768, 3072), (2048, 3072, 768),     # BERT
    (1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768), (1024, 768, 2304),  # GPT-2
]

# Linear layers of LLM families: (name, [(in_features, out_features), ...]): qkv, o, gate+up, down.
LLM_LAYERS = {
    "llama3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)],
    "llama3-70b": [(8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192)],
    "qwen2-7b": [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584)],
    "mistral-7b": [(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096)],
    "phi3-mini": [(3072, 9216), (3072, 3072), (3072, 16384), (8192, 3072)],
    "gpt2-xl": [(1600, 4800), (1600, 1600), (1600, 6400), (6400, 1600)],
}
DECODE_TOKENS = (1, 4, 16, 32, 64)
PREFILL_TOKENS = (128, 333, 512, 1000, 2048, 4096)

# (dtype, allow_tf32) modes and their sampling weights.
MODES = [("float16", False, 0.3), ("bfloat16", False, 0.3), ("float32", False, 0.2), ("float32", True, 0.2)]


def problem_id(p: GemmProblem) -> str:
    key = f"{p.m}x{p.n}x{p.k}:{p.dtype}:{int(p.allow_tf32)}:{int(p.transpose_left)}{int(p.transpose_right)}"
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def estimated_ms(p: GemmProblem, spec: DeviceSpec) -> float:
    """A roofline guess (60% of peak FLOP/s, 70% of DRAM bandwidth) used only to budget the sweep."""
    return 1e3 * max(p.flops / (0.6 * spec.peak_flops(p.dtype, p.allow_tf32)),
                     p.min_bytes / (0.7 * spec.peak_bytes_per_s()))


@dataclass(frozen=True)
class Budget:
    max_est_ms: float = 0.4        # roofline estimate of the best kernel's time
    max_bytes: float = 2e9         # operands + output (the checker needs ~3x the output more)
    max_output_elems: int = 2**27  # keeps the full-output correctness check cheap


def within(p: GemmProblem, spec: DeviceSpec, budget: Budget) -> bool:
    return (estimated_ms(p, spec) <= budget.max_est_ms and p.min_bytes <= budget.max_bytes
            and p.m * p.n <= budget.max_output_elems)


def random_dim(rng: random.Random, low: int, high: int = 65536, p_unaligned: float = 0.4) -> int:
    """Log-uniform in [low, high]; aligned draws are rounded to a multiple of a power of two >= 16."""
    d = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
    if rng.random() < p_unaligned or d < 16:
        return max(low, d)
    mult = rng.choice([16, 32, 64, 128, 256])
    return max(16, (d // mult) * mult or mult)


def real_model_shapes() -> list[tuple[int, int, int, bool]]:
    """(m, k, n, transpose_right): seed-table shapes (row-major B) and LLM linears (B = W^T)."""
    out = [(m, k, n, False) for m, k, n in SEED_SHAPES]
    for layers in LLM_LAYERS.values():
        for tokens in DECODE_TOKENS + PREFILL_TOKENS:
            for k, n in layers:
                out.append((tokens, k, n, True))
    return out


def gemm_problems(n_random: int, spec: DeviceSpec, seed: int = 0, budget: Budget = Budget(),
                  layouts: tuple[tuple[bool, bool], ...] = ((False, False), (False, True))) -> list[GemmProblem]:
    """The sweep's problem list: every real-model shape in every mode (within budget), then random ones.
    Deterministic for a seed, so shards and resumed runs agree on it."""
    rng = random.Random(seed)
    problems: list[GemmProblem] = []
    seen: set[GemmProblem] = set()

    def add(p: GemmProblem) -> None:
        if p not in seen and within(p, spec, budget):
            seen.add(p)
            problems.append(p)

    for m, k, n, tr in real_model_shapes():
        for dtype, tf32, _ in MODES:
            add(GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32, transpose_right=tr))
    weights = [w for *_, w in MODES]
    target = len(problems) + n_random
    while len(problems) < target:
        dtype, tf32, _ = rng.choices(MODES, weights)[0]
        tl, tr = rng.choice(layouts)
        # M is not a specialised argument (it only enters masks): unaligned M is cheap to cover;
        # unaligned K/N change the compiled kernel, so they are rarer (they cost a compile group).
        add(GemmProblem(m=random_dim(rng, 1, p_unaligned=0.5), n=random_dim(rng, 16, p_unaligned=0.2),
                        k=random_dim(rng, 16, p_unaligned=0.2),
                        dtype=dtype, allow_tf32=tf32, transpose_left=tl, transpose_right=tr))
    return problems


def pad_problems(n: int, spec: DeviceSpec, seed: int = 0, budget: Budget = Budget(max_est_ms=2.0)) -> list[PadProblem]:
    """As gen_data_pad_mm.py: random dims (uniform or powers of two / between), at least one unaligned,
    random transposes, prepadded with p=0.2, the three dtypes."""
    rng = random.Random(seed)
    out: list[PadProblem] = []
    while len(out) < n:
        dtype = rng.choice(["float16", "bfloat16", "float32"])

        def dim() -> int:
            r = rng.random()
            if r < 0.35:
                return int(round(math.exp(rng.uniform(0, math.log(32768)))))
            if r < 0.7:
                i = rng.randint(4, 14)
                return rng.randint(2**i, 2**(i + 1))
            return 2 ** rng.randint(4, 15)

        m, k, n_ = dim(), dim(), dim()
        p = PadProblem(m=m, k=k, n=n_, dtype=dtype, transpose_left=rng.random() < 0.5,
                       transpose_right=rng.random() < 0.5, prepadded_left=rng.random() < 0.2,
                       prepadded_right=rng.random() < 0.2,
                       allow_tf32=dtype == "float32" and rng.random() < 0.5)
        g = p.gemm(padded=True)
        if p.needs_padding() and within(g, spec, budget):  # a dim of 1 is never padded
            out.append(p)
    return out
