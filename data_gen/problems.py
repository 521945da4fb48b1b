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

# Linear layers of LLM families: (name, [(in_features, out_features), ...]): qkv, o, gate+up, down, and
# the vocabulary projection (lm head).
LLM_LAYERS = {
    "llama3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256)],
    "llama3-70b": [(8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192), (8192, 128256)],
    "qwen2-7b": [(3584, 4608), (3584, 3584), (3584, 37888), (18944, 3584), (3584, 152064)],
    "mistral-7b": [(4096, 6144), (4096, 4096), (4096, 14336), (14336, 4096), (4096, 32768)],
    "mixtral-8x7b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 32000)],
    "phi3-mini": [(3072, 9216), (3072, 3072), (3072, 16384), (8192, 3072), (3072, 32064)],
    "gpt2-xl": [(1600, 4800), (1600, 1600), (1600, 6400), (6400, 1600), (1600, 50257)],
}
DECODE_TOKENS = (1, 4, 16, 32, 64)
PREFILL_TOKENS = (128, 333, 512, 1000, 2048, 4096)
TRAIN_TOKENS = (8192, 16384, 32768)  # training and long-prefill batches (4k-32k tokens)

# (dtype, allow_tf32) modes and their sampling weights.
MODES = [("float16", False, 0.3), ("bfloat16", False, 0.3), ("float32", False, 0.2), ("float32", True, 0.2)]


# A GEMM row's problem fields (the dataset's row format), as GemmProblem takes them.
PROBLEM_FIELDS = ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right")


def row_problem(row: dict) -> GemmProblem:
    """The GemmProblem of a dataset row (its PROBLEM_FIELDS)."""
    return GemmProblem(**{f: row[f] for f in PROBLEM_FIELDS})


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
    max_flops: float = 1.01e13


# Real-model shapes up to 1e13 FLOP: a 32k-token batch through an 8B model's MLP is 3.8e12 FLOP and
# takes ~6 ms in fp16 on an H100. The estimate is capped at 10 ms (fp32 without tf32 runs ~15x slower
# than fp16, so it stops lower), which keeps the sweep inside one device session.
LARGE = Budget(max_est_ms=10.0, max_bytes=12e9, max_output_elems=2**31 - 1, max_flops=1.01e13)
# Elements of one operand stay below 2**31: the kernel indexes in int32, as Inductor's template does
# (it switches to int64 only past that).
MAX_TENSOR_ELEMS = 2**31 - 1


def within(p: GemmProblem, spec: DeviceSpec, budget: Budget) -> bool:
    return (estimated_ms(p, spec) <= budget.max_est_ms and p.min_bytes <= budget.max_bytes
            and p.m * p.n <= budget.max_output_elems and p.flops <= budget.max_flops
            and max(p.m * p.k, p.k * p.n, p.m * p.n) <= MAX_TENSOR_ELEMS)


def random_dim(rng: random.Random, low: int, high: int = 65536, p_unaligned: float = 0.4,
               mults: tuple[int, ...] = (16, 32, 64, 128, 256)) -> int:
    """Log-uniform in [low, high]; aligned draws are rounded to a multiple of one of mults."""
    d = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
    if rng.random() < p_unaligned or d < 16:
        return max(low, d)
    mult = rng.choice(mults)
    return max(16, (d // mult) * mult or mult)


def real_model_shapes(tokens: tuple[int, ...] = DECODE_TOKENS + PREFILL_TOKENS + TRAIN_TOKENS
                      ) -> list[tuple[int, int, int, bool]]:
    """(m, k, n, transpose_right): seed-table shapes (row-major B) and LLM linears (B = W^T)."""
    out = [(m, k, n, False) for m, k, n in SEED_SHAPES]
    for layers in LLM_LAYERS.values():
        for t in tokens:
            for k, n in layers:
                out.append((t, k, n, True))
    return out


def strides(p: GemmProblem) -> tuple[int, ...]:
    """(stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn) of the problem's layout."""
    sa = (1, p.m) if p.transpose_left else (p.k, 1)
    sb = (1, p.k) if p.transpose_right else (p.n, 1)
    return (*sa, *sb, p.n, 1)


def _cls(v: int) -> str:
    """What the kernel is compiled for of an integer argument: equal to 1, divisible by 16 (Triton's
    default specialisation), else its power-of-two divisor (kernel.divisor): N1, N2, N4, N8."""
    return "1" if v == 1 else ("D" if v % 16 == 0 else f"N{v & -v}")


def _pow2_class(v: int) -> int:
    """min(256, the largest power of two <= v): v >= BLOCK iff BLOCK <= this (blocks are powers of two)."""
    return min(256, 1 << (v.bit_length() - 1))


def spec_key(p: GemmProblem) -> tuple:
    """Everything besides the config that decides the compiled kernel (data_gen/kernel.py): dtype mode,
    layout, the specialisation of M, N, K (the strides follow from them), K's power-of-two divisor up to
    256 (EVEN_K for each BLOCK_K) and M's and N's power-of-two class (the contiguity hints need
    M >= BLOCK_M, N >= BLOCK_N). Problems with one key share every compiled kernel."""
    return (p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right, _cls(p.m), _cls(p.n), _cls(p.k),
            min(256, p.k & -p.k), _pow2_class(p.m), _pow2_class(p.n))


def gemm_problems(n_random: int, spec: DeviceSpec, seed: int = 0, budget: Budget = Budget(),
                  layouts: tuple[tuple[bool, bool], ...] = ((False, False), (False, True)),
                  large: Budget = LARGE, new_keys: int = 16) -> list[GemmProblem]:
    """The sweep's problem list: every real-model shape in every mode (within the `large` budget), then
    random ones (within `budget`). Deterministic for a seed, so shards and resumed runs agree on it.

    Compiles decide what a sweep can cover (each spec_key compiles its own kernels), so random problems
    share the spec_keys of the real-model shapes: a draw that would open a new key is kept only while
    fewer than new_keys random keys exist. Draws: a quarter have a small M (decode-like, 1-255), the rest
    M >= 256; N >= 256 but for one in ten; K more often a multiple of 256 than of a smaller power of
    two; a fifth of each dim unaligned."""
    rng = random.Random(seed)
    problems: list[GemmProblem] = []
    seen: set[GemmProblem] = set()

    def add(p: GemmProblem, b: Budget) -> None:
        if p not in seen and within(p, spec, b):
            seen.add(p)
            problems.append(p)

    for m, k, n, tr in real_model_shapes():
        for dtype, tf32, _ in MODES:
            add(GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32, transpose_right=tr), large)
    weights = [w for *_, w in MODES]
    target = len(problems) + n_random
    keys = {spec_key(p) for p in problems}
    opened = 0
    while len(problems) < target:
        dtype, tf32, _ = rng.choices(MODES, weights)[0]
        tl, tr = rng.choice(layouts)
        m = random_dim(rng, 1, 255, p_unaligned=0.5) if rng.random() < 0.25 else random_dim(rng, 256, p_unaligned=0.3)
        n = random_dim(rng, 16, 255, p_unaligned=0.2) if rng.random() < 0.1 else random_dim(rng, 256, p_unaligned=0.2)
        k = random_dim(rng, 16, p_unaligned=0.2, mults=(256, 256, 256, 64, 16))
        p = GemmProblem(m=m, n=n, k=k, dtype=dtype, allow_tf32=tf32, transpose_left=tl, transpose_right=tr)
        key = spec_key(p)
        if key not in keys:
            if opened >= new_keys or not within(p, spec, budget):
                continue
            opened += 1
            keys.add(key)
        add(p, budget)
    return problems


# Pad problems above the small-problem budget: up to 1e12 FLOP and beyond in every dtype mode.
LARGE_PAD = Budget(max_est_ms=40.0, max_bytes=12e9, max_output_elems=2**31 - 1, max_flops=2e13)


def pad_problems(n: int, spec: DeviceSpec, seed: int = 0, budget: Budget = Budget(max_est_ms=2.0),
                 n_large: int = 400, large: Budget = LARGE_PAD) -> list[PadProblem]:
    """As gen_data_pad_mm.py: random dims (uniform or powers of two / between), at least one unaligned,
    random transposes, prepadded with p=0.2, the three dtypes (fp32 with tf32 on or off). n problems
    within `budget`, then n_large more that exceed it but stay within `large` (1e11-1e13 FLOP)."""
    rng = random.Random(seed)
    out: list[PadProblem] = []
    n_small = 0
    while len(out) < n + n_large:
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
        if not p.needs_padding():  # a dim of 1 is never padded
            continue
        if within(g, spec, budget):
            if n_small < n:
                n_small += 1
                out.append(p)
        elif len(out) - n_small < n_large and within(g, spec, large):
            out.append(p)
    return out


# The alignment classes of a dim in the cuBLAS-only list (cublas_only_problems), with their weights:
# cuBLAS picks kernels by the operands' alignment (16 bytes and beyond), and a GEMM padded by Inductor's
# pad_mm pass lands on dims that are multiples of 8 elements but not of 16 -- classes the GEMM list,
# which keeps to the compile groups of real-model shapes, holds few problems of.
ALIGNMENT_CLASSES = (("aligned", 0.3), ("8 mod 16", 0.25), ("4 mod 8", 0.1), ("2 mod 4", 0.1), ("any", 0.25))


def aligned_dim(rng: random.Random, low: int, high: int, cls: str) -> int:
    """Log-uniform in [low, high], then moved to the alignment class cls (ALIGNMENT_CLASSES)."""
    d = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
    if cls == "aligned":
        mult = rng.choice((16, 64, 128, 256))
        d = max(mult, d // mult * mult)
    elif cls != "any":
        step, rem = {"8 mod 16": (16, 8), "4 mod 8": (8, 4), "2 mod 4": (4, 2)}[cls]
        d = d // step * step + rem
    return max(1, d)


def cublas_only_problems(n: int, spec: DeviceSpec, seed: int = 0, budget: Budget = LARGE,
                         exclude: frozenset[str] = frozenset()) -> list[GemmProblem]:
    """n GEMM problems for torch.mm (cuBLAS) alone, which needs no compile: every dtype mode, all four
    layouts, each of M, N and K in an alignment class of ALIGNMENT_CLASSES, M small (1-255, decode-like)
    for a quarter, within `budget` (real-model sizes up to 1e13 FLOP). Problems whose id is in exclude
    (the GEMM list's) are skipped. Deterministic for a seed."""
    rng = random.Random(seed)
    classes, weights = zip(*ALIGNMENT_CLASSES)
    modes = [w for *_, w in MODES]
    out: list[GemmProblem] = []
    seen: set[GemmProblem] = set()
    while len(out) < n:
        dtype, tf32, _ = rng.choices(MODES, modes)[0]
        cls = [rng.choices(classes, weights)[0] for _ in range(3)]
        m = (aligned_dim(rng, 1, 255, cls[0]) if rng.random() < 0.25 else aligned_dim(rng, 256, 65536, cls[0]))
        p = GemmProblem(m=m, n=aligned_dim(rng, 16, 131072, cls[1]), k=aligned_dim(rng, 16, 65536, cls[2]),
                        dtype=dtype, allow_tf32=tf32, transpose_left=rng.random() < 0.5,
                        transpose_right=rng.random() < 0.5)
        if p in seen or problem_id(p) in exclude or not within(p, spec, budget):
            continue
        seen.add(p)
        out.append(p)
    return out
