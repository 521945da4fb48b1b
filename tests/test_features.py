"""perfmodel.features.FeatureEncoder against a slow, per-row, pure-Python reference (math module only).

The reference is written from the meaning of each feature name (and the comments in features.py), with
exact integer arithmetic for ceil-divisions and roundings, so that it does not share code with the
batched torch implementation it checks.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, PadProblem
from perfmodel.configs import exhaustive_space
from perfmodel.devices import get_spec
from perfmodel.features import (CONFIG_COLUMNS, DEVICE_FEATURES, PAD_COLUMNS, PR156851_FEATURES, PROBLEM_COLUMNS,
                                FeatureEncoder, configs_tensor, pad_tensor, problems_tensor)

SPEC = get_spec("h100-sxm")
BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
ALIGN = {"float16": 8, "bfloat16": 8, "float32": 4}  # Inductor's pad_mm alignment, elements


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- the reference (one row at a time)

def ref_problem(m: int, n: int, k: int, dtype: str, tf32: bool, tl: bool, tr: bool) -> dict[str, float]:
    db = BYTES[dtype]
    flops = 2 * m * n * k                      # one multiply-add per (i, j, l)
    nbytes = (m * k + k * n + m * n) * db      # A and B read once, C written once
    peak = SPEC.peak_flops(dtype, tf32)        # FLOP/s
    compute_ms = flops / peak * 1e3
    memory_ms = nbytes / SPEC.peak_bytes_per_s() * 1e3
    return {
        "log_m": math.log(m), "log_n": math.log(n), "log_k": math.log(k),
        "dtype_bytes": db, "is_bf16": float(dtype == "bfloat16"), "allow_tf32": float(tf32),
        "fp32_ieee": float(dtype == "float32" and not tf32),
        "transpose_left": float(tl), "transpose_right": float(tr),
        "log_total_gb": math.log(nbytes / 1e9), "log_total_gflop": math.log(flops / 1e9),
        "log_flops_per_byte": math.log(flops / nbytes),
        "m_mod16": float(m % 16 == 0), "n_mod16": float(n % 16 == 0), "k_mod16": float(k % 16 == 0),
        "m_mod8": float(m % 8 == 0), "n_mod8": float(n % 8 == 0), "k_mod8": float(k % 8 == 0),
        "log_roofline_ms": math.log(max(compute_ms, memory_ms)),
        "log_compute_ms": math.log(compute_ms), "log_memory_ms": math.log(memory_ms),
        "log_sm_count": math.log(SPEC.sm_count), "log_peak_tflops": math.log(peak / 1e12),
        "log_dram_gbs": math.log(SPEC.dram_bw_gbs),
        # encoder version 3: the device's max SM clock, L2 size and per-block shared memory
        "log_max_sm_clock_ghz": math.log(SPEC.max_sm_clock_mhz / 1000), "log_l2_mb": math.log(SPEC.l2_bytes / 2**20),
        "log_smem_optin_kb": math.log(SPEC.shared_memory_per_block_optin / 1024),
    }


def ref_gemm(p: GemmProblem, c: GemmConfig) -> dict[str, float]:
    m, n, k, db = p.m, p.n, p.k, BYTES[p.dtype]
    bm, bn, bk = c.block_m, c.block_n, c.block_k
    sms = SPEC.sm_count
    tiles_m, tiles_n = cdiv(m, bm), cdiv(n, bn)
    tiles = tiles_m * tiles_n                  # output tiles = CTAs of the grid
    full_waves = cdiv(tiles, sms)              # waves of CTAs over the SMs, the last one possibly partial
    k_iters = cdiv(k, bk)
    smem_stage = (bm + bn) * bk * db           # one pipeline stage of A and B tiles, bytes
    # A is read once per column of tiles, B once per row of tiles, C written once.
    tiled_load = (m * k * tiles_n + k * n * tiles_m + m * n) * db
    out = ref_problem(m, n, k, p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right)
    out.update({
        "log_block_m": math.log(bm), "log_block_n": math.log(bn), "log_block_k": math.log(bk),
        "log_group_m": math.log(c.group_m), "num_stages": c.num_stages, "num_warps": c.num_warps,
        "log_tiles": math.log(tiles), "log_waves": math.log(tiles / sms),
        "last_wave_fill": tiles / (full_waves * sms),
        "tile_waste_mn": math.log(tiles_m * bm * tiles_n * bn / (m * n)),
        "tile_waste_k": math.log(k_iters * bk / k),
        "log_k_iters": math.log(k_iters),
        "log_smem_stage_kb": math.log(smem_stage / 1024),
        "smem_frac": smem_stage * c.num_stages / SPEC.shared_memory_per_block_optin,
        "log_acc_regs": math.log(bm * bn / (c.num_warps * 32)),   # fp32 accumulators per thread
        "log_tile_intensity": math.log(bm * bn / (bm + bn)),
        "log_tiled_load_gb": math.log(tiled_load / 1e9),
        "log_tiled_load_ms": math.log(tiled_load / (4 * SPEC.dram_bw_gbs * 1e9) * 1e3),  # L2 ~ 4x DRAM
        "log_full_waves": math.log(full_waves),
        "log_grouped_rows": math.log(min(c.group_m, tiles_m)),
    })
    return out


def ref_pad(p: PadProblem) -> dict[str, float]:
    a, db = ALIGN[p.dtype], BYTES[p.dtype]

    def up(d: int) -> int:
        return d if d == 1 else cdiv(d, a) * a  # a dim of 1 is never padded

    mp, kp, np_ = up(p.m), up(p.k), up(p.n)
    # Padding A (m x k) reads it and writes a zero-filled (mp x kp) copy; nothing if it arrives prepadded.
    copy_a = (mp * kp + p.m * p.k) * db if (mp, kp) != (p.m, p.k) and not p.prepadded_left else 0
    copy_b = (kp * np_ + p.k * p.n) * db if (kp, np_) != (p.k, p.n) and not p.prepadded_right else 0
    padded = ref_problem(mp, np_, kp, p.dtype, p.allow_tf32, False, False)
    out = ref_problem(p.m, p.n, p.k, p.dtype, p.allow_tf32, p.transpose_left, p.transpose_right)
    out.update({
        "prepadded_left": float(p.prepadded_left), "prepadded_right": float(p.prepadded_right),
        "log_pad_copy_gb": math.log((copy_a + copy_b) / 1e9 + 1e-9),
        "pad_m_frac": mp / p.m - 1, "pad_k_frac": kp / p.k - 1, "pad_n_frac": np_ / p.n - 1,
        "log_padded_roofline_ms": padded["log_roofline_ms"],
        "padded_all_aligned": float(mp % 16 == 0 and kp % 16 == 0 and np_ % 16 == 0),
    })
    # Leading dimensions in elements: row-major A (m x k) steps k per row; a transposed A is a view
    # of a (k x m) tensor and steps m. B: n, or k transposed. C: n. A padded operand is a new
    # row-major tensor; an operand that is not padded keeps its layout.
    lda = p.m if p.transpose_left else p.k
    ldb = p.k if p.transpose_right else p.n
    a_padded, b_padded = (mp, kp) != (p.m, p.k), (kp, np_) != (p.k, p.n)
    out.update({
        "lda_aligned16": float(lda * db % 16 == 0), "ldb_aligned16": float(ldb * db % 16 == 0),
        "ldc_aligned16": float(p.n * db % 16 == 0),
        "padded_lda_aligned16": float((kp if a_padded else lda) * db % 16 == 0),
        "padded_ldb_aligned16": float((np_ if b_padded else ldb) * db % 16 == 0),
        "padded_ldc_aligned16": float(np_ * db % 16 == 0),
        "log_copy_a_gb": math.log(copy_a / 1e9 + 1e-6), "log_copy_b_gb": math.log(copy_b / 1e9 + 1e-6),
        "copy_a_transposed": float(copy_a > 0 and p.transpose_left),
        "copy_b_transposed": float(copy_b > 0 and p.transpose_right),
    })
    return out


def ref_pr156851(p: GemmProblem, c: GemmConfig) -> list[float]:
    db = BYTES[p.dtype]
    flops = 2 * p.m * p.n * p.k
    nbytes = (p.m * p.k + p.k * p.n + p.m * p.n) * db
    raw = [db * 8, p.m, p.n, p.k, nbytes / 1e9, flops / 1e9, flops / nbytes,
           c.block_k, c.block_m, c.block_n, c.num_stages, c.num_warps]
    return [math.log(v) for v in raw]


# ---------------------------------------------------------------- cases

def _cases(seed: int = 1234) -> list[tuple[GemmProblem, GemmConfig]]:
    """A dozen seeded (problem, config) pairs, plus hand-picked edge cases."""
    rng = random.Random(seed)
    space = exhaustive_space()
    modes = [("float16", False), ("bfloat16", False), ("float32", False), ("float32", True)]
    out = []
    for i in range(12):
        dtype, tf32 = modes[i % 4]

        def dim() -> int:
            return rng.choice([1, rng.randrange(1, 64), rng.randrange(1, 20000) | 1, 16 * rng.randrange(1, 512)])

        p = GemmProblem(m=dim(), n=dim(), k=dim(), dtype=dtype, allow_tf32=tf32, transpose_left=rng.random() < 0.5,
                        transpose_right=rng.random() < 0.5)
        out.append((p, rng.choice(space)))
    out += [
        (GemmProblem(m=1, n=4096, k=4096, dtype="float16"), GemmConfig(16, 128, 64, 8, 4, 4)),
        (GemmProblem(m=4097, n=1, k=333, dtype="bfloat16", transpose_left=True, transpose_right=True),
         GemmConfig(128, 16, 32, 1, 2, 8)),
        (GemmProblem(m=8191, n=12289, k=7, dtype="float32", allow_tf32=True, transpose_right=True),
         GemmConfig(256, 256, 16, 16, 1, 2)),
        (GemmProblem(m=8191, n=12289, k=7, dtype="float32", allow_tf32=False, transpose_left=True),
         GemmConfig(256, 256, 16, 16, 1, 2)),
        (GemmProblem(m=132 * 128, n=128, k=64, dtype="float16"), GemmConfig(128, 128, 64, 8, 3, 4)),  # exactly one wave
    ]
    return out


CASES = _cases()


def test_columns_match_schema_tensors():
    p, c = CASES[1]
    assert problems_tensor([p]).shape == (1, len(PROBLEM_COLUMNS))
    assert configs_tensor([c]).shape == (1, len(CONFIG_COLUMNS))
    # the packed rows hold each problem's columns, in PROBLEM_COLUMNS order
    probs = [p for p, _ in CASES] + [GemmProblem(m=3, n=5, k=7, dtype="float32", allow_tf32=True, transpose_left=True)]
    want = [[q.m, q.n, q.k, q.dtype_bytes, q.dtype == "bfloat16", q.allow_tf32, q.transpose_left, q.transpose_right]
            for q in probs]
    assert problems_tensor(probs).tolist() == [[float(v) for v in row] for row in want]
    pp = PadProblem(m=5, k=6, n=7, dtype="float32")
    assert pad_tensor([pp]).shape == (1, len(PAD_COLUMNS))
    assert pad_tensor([pp])[0, PAD_COLUMNS.index("alignment")].item() == 4
    assert pad_tensor([PadProblem(m=5, k=6, n=7, dtype="bfloat16")])[0, PAD_COLUMNS.index("alignment")].item() == 8


def test_each_problem_attribute_moves_only_its_features():
    # one attribute of a (compute-bound) problem changed at a time: the features that depend on it move,
    # every other feature keeps its value (a transpose or a dtype flag leaking into another column would
    # show here)
    from dataclasses import replace

    enc = FeatureEncoder(SPEC, "cublas")
    sizes = {"log_total_gb", "log_total_gflop", "log_flops_per_byte", "log_roofline_ms", "log_compute_ms",
             "log_memory_ms"}
    fp16 = GemmProblem(m=4096, n=4096, k=4096, dtype="float16")
    fp32 = replace(fp16, dtype="float32")
    cases = [
        (fp16, replace(fp16, transpose_left=True), {"transpose_left"}),
        (fp16, replace(fp16, transpose_right=True), {"transpose_right"}),
        (fp16, replace(fp16, dtype="bfloat16"), {"is_bf16"}),
        (fp16, replace(fp16, m=4095), {"log_m", "m_mod16", "m_mod8"} | sizes),
        (fp16, replace(fp16, n=4104), {"log_n", "n_mod16"} | sizes),            # 4104: a multiple of 8, not 16
        (fp16, replace(fp16, k=4097), {"log_k", "k_mod16", "k_mod8"} | sizes),
        (fp32, replace(fp32, allow_tf32=True), {"allow_tf32", "fp32_ieee", "log_peak_tflops", "log_compute_ms",
                                                "log_roofline_ms"}),
        (fp16, fp32, {"dtype_bytes", "fp32_ieee", "log_peak_tflops"} | sizes - {"log_total_gflop"}),
    ]
    for a, b, moved in cases:
        x = enc.encode(problems_tensor([a, b]))
        got = {name for j, name in enumerate(enc.names) if x[0, j] != x[1, j]}
        assert got == moved, (b, got ^ moved)


@pytest.mark.parametrize("kind", ["gemm", "cublas", "pad", "pr156851"])
def test_names_match_feature_count(kind):
    enc = FeatureEncoder(SPEC, kind)
    assert len(enc) == len(enc.names) == len(set(enc.names))
    p, c = CASES[0]
    if kind == "pad":
        x = enc.encode(pad_tensor([PadProblem(m=5, k=6, n=7), PadProblem(m=8, k=8, n=8)]))
    elif kind == "cublas":
        x = enc.encode(problems_tensor([p, p]))
    else:
        x = enc.encode(problems_tensor([p, p]), configs_tensor([c, c]))
    assert x.shape == (2, len(enc.names))
    assert x.dtype == torch.float32


def test_gemm_matches_reference_per_feature():
    enc = FeatureEncoder(SPEC, "gemm")
    x = enc.encode(problems_tensor([p for p, _ in CASES]), configs_tensor([c for _, c in CASES])).double().numpy()
    ref = [ref_gemm(p, c) for p, c in CASES]
    assert set(enc.names) == set(ref[0]), "reference and encoder disagree on the feature set"
    for j, name in enumerate(enc.names):
        want = np.array([r[name] for r in ref])
        np.testing.assert_allclose(x[:, j], want, rtol=2e-6, atol=2e-6, err_msg=name)


def test_gemm_reference_values_that_are_known_by_hand():
    """Anchor the reference itself on cases whose answer needs no formula."""
    enc = FeatureEncoder(SPEC, "gemm")
    p, c = GemmProblem(m=132 * 128, n=128, k=64, dtype="float16"), GemmConfig(128, 128, 64, 8, 3, 4)
    row = dict(zip(enc.names, enc.encode(problems_tensor([p]), configs_tensor([c]))[0].tolist()))
    assert row["log_tiles"] == pytest.approx(math.log(132))
    assert row["log_waves"] == pytest.approx(0.0, abs=1e-6)        # exactly one full wave
    assert row["last_wave_fill"] == pytest.approx(1.0)
    assert row["tile_waste_mn"] == pytest.approx(0.0, abs=1e-6)    # tiles divide the problem
    assert row["log_acc_regs"] == pytest.approx(math.log(128))     # 128*128 / (4 warps * 32 threads)
    # one tile more than a wave: the second wave holds 1 of 132 CTAs
    p2 = GemmProblem(m=132 * 128 + 1, n=128, k=64, dtype="float16")
    row2 = dict(zip(enc.names, enc.encode(problems_tensor([p2]), configs_tensor([c]))[0].tolist()))
    assert row2["last_wave_fill"] == pytest.approx(133 / 264)
    assert row2["log_full_waves"] == pytest.approx(math.log(2))


def test_cublas_matches_reference():
    enc = FeatureEncoder(SPEC, "cublas")
    ps = [p for p, _ in CASES]
    x = enc.encode(problems_tensor(ps)).double().numpy()
    for j, name in enumerate(enc.names):
        want = np.array([ref_problem(p.m, p.n, p.k, p.dtype, p.allow_tf32, p.transpose_left,
                                     p.transpose_right)[name] for p in ps])
        np.testing.assert_allclose(x[:, j], want, rtol=2e-6, atol=2e-6, err_msg=name)
    # the cuBLAS encoder is the problem part of the GEMM encoder
    g = FeatureEncoder(SPEC, "gemm")
    assert g.names[:len(enc.names)] == enc.names


def test_tf32_and_dtype_change_the_peak():
    enc = FeatureEncoder(SPEC, "cublas")
    ps = [GemmProblem(m=512, n=512, k=512, dtype=d, allow_tf32=t) for d, t in
          (("float16", False), ("bfloat16", False), ("float32", True), ("float32", False))]
    peak = enc.encode(problems_tensor(ps))[:, enc.names.index("log_peak_tflops")].exp()
    assert peak[0] == peak[1] > peak[2] > peak[3]
    ieee = enc.encode(problems_tensor(ps))[:, enc.names.index("fp32_ieee")].tolist()
    assert ieee == [0.0, 0.0, 0.0, 1.0]


def test_encode_cross_is_problem_major_repeat():
    enc = FeatureEncoder(SPEC, "gemm")
    P = problems_tensor([p for p, _ in CASES[:5]])
    C = configs_tensor([c for _, c in CASES[5:12]])
    cross = enc.encode_cross(P, C)
    # row p*C + c is (problem p, config c), written out with explicit repeats
    rows_p = torch.cat([P[i:i + 1].expand(len(C), -1) for i in range(len(P))])
    rows_c = torch.cat([C] * len(P))
    explicit = enc.encode(rows_p, rows_c)
    assert cross.shape == (len(P) * len(C), len(enc))
    torch.testing.assert_close(cross, explicit, rtol=0, atol=0)
    # and one row by itself
    torch.testing.assert_close(cross[2 * len(C) + 3], enc.encode(P[2:3], C[3:4])[0], rtol=0, atol=0)


def test_pr156851_is_the_twelve_log_features_in_order():
    enc = FeatureEncoder(SPEC, "pr156851")
    assert enc.names == list(PR156851_FEATURES)
    assert enc.names == ["dtype_size", "dim_m", "dim_n", "dim_k", "total_gb", "total_gflop", "flops_per_byte",
                         "config_block_k", "config_block_m", "config_block_n", "config_num_stages",
                         "config_num_warps"]
    x = enc.encode(problems_tensor([p for p, _ in CASES]), configs_tensor([c for _, c in CASES])).double().numpy()
    want = np.array([ref_pr156851(p, c) for p, c in CASES])
    assert x.shape == (len(CASES), 12)
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=2e-6)
    # dtype size in bits: log(16) for fp16/bf16, log(32) for fp32
    assert x[0, 0] == pytest.approx(math.log(16 if BYTES[CASES[0][0].dtype] == 2 else 32))


def _pad_cases(seed: int = 99) -> list[PadProblem]:
    rng = random.Random(seed)
    out = []
    for i in range(12):
        dtype = ("float16", "bfloat16", "float32")[i % 3]
        dims = [rng.choice([1, rng.randrange(2, 100), rng.randrange(100, 9000), 8 * rng.randrange(1, 500)])
                for _ in range(3)]
        m, k, n = dims
        out.append(PadProblem(m=m, k=k, n=n, dtype=dtype, transpose_left=rng.random() < 0.5,
                              transpose_right=rng.random() < 0.5, prepadded_left=rng.random() < 0.3,
                              prepadded_right=rng.random() < 0.3, allow_tf32=dtype == "float32" and rng.random() < 0.5))
    out += [
        PadProblem(m=1, k=7, n=1, dtype="float16"),                                 # only k pads: both operands copy
        PadProblem(m=13, k=64, n=64, dtype="float16", prepadded_left=True),         # only A pads, and it is prepadded
        PadProblem(m=13, k=64, n=64, dtype="float16"),                              # the same, not prepadded
        PadProblem(m=64, k=64, n=13, dtype="float32", prepadded_right=True),        # only B pads, prepadded
        PadProblem(m=6, k=6, n=6, dtype="float32", prepadded_left=True, prepadded_right=True),
        PadProblem(m=6, k=6, n=6, dtype="bfloat16"),
        PadProblem(m=16, k=16, n=16, dtype="float16"),                              # aligned: nothing to pad
    ]
    return out


PAD_CASES = _pad_cases()


def test_pad_matches_reference_per_feature():
    enc = FeatureEncoder(SPEC, "pad")
    x = enc.encode(pad_tensor(PAD_CASES)).double().numpy()
    ref = [ref_pad(p) for p in PAD_CASES]
    assert set(enc.names) == set(ref[0])
    for j, name in enumerate(enc.names):
        want = np.array([r[name] for r in ref])
        np.testing.assert_allclose(x[:, j], want, rtol=2e-6, atol=2e-6, err_msg=name)


def test_pad_copy_rules_by_hand():
    enc = FeatureEncoder(SPEC, "pad")
    rows = {i: dict(zip(enc.names, r)) for i, r in enumerate(enc.encode(pad_tensor(PAD_CASES[-7:])).tolist())}
    nothing = math.log(1e-9)
    # (1, 7, 1) fp16: m and n stay 1, k 7 -> 8; A (1x7 -> 1x8) and B (7x1 -> 8x1) both copied
    assert rows[0]["pad_m_frac"] == 0 and rows[0]["pad_n_frac"] == 0
    assert rows[0]["pad_k_frac"] == pytest.approx(1 / 7)
    assert rows[0]["log_pad_copy_gb"] == pytest.approx(math.log((8 + 7 + 8 + 7) * 2 / 1e9 + 1e-9), rel=1e-6)
    assert rows[1]["log_pad_copy_gb"] == pytest.approx(nothing)     # prepadded A: no copy
    assert rows[2]["log_pad_copy_gb"] == pytest.approx(math.log((16 * 64 + 13 * 64) * 2 / 1e9 + 1e-9), rel=1e-6)
    assert rows[3]["log_pad_copy_gb"] == pytest.approx(nothing)     # prepadded B: no copy
    assert rows[4]["log_pad_copy_gb"] == pytest.approx(nothing)
    assert rows[4]["pad_m_frac"] == pytest.approx(2 / 6)            # fp32 pads 6 -> 8
    assert rows[5]["pad_m_frac"] == pytest.approx(2 / 6)            # bf16 pads 6 -> 8
    assert rows[6]["pad_m_frac"] == rows[6]["pad_k_frac"] == rows[6]["pad_n_frac"] == 0
    assert rows[6]["log_pad_copy_gb"] == pytest.approx(nothing)
    assert rows[6]["padded_all_aligned"] == 1.0 and rows[4]["padded_all_aligned"] == 0.0


@pytest.mark.parametrize("kind", ["gemm", "cublas", "pad", "pr156851"])
def test_finite_over_the_full_dim_range(kind):
    big = 2**31 - 1
    dims = [1, 2, 7, 4096, 65535, big]
    triples = [(m, n, k) for m in dims for n in dims for k in dims]
    enc = FeatureEncoder(SPEC, kind)
    if kind == "pad":
        pads = [PadProblem(m=m, k=k, n=n, dtype=d, prepadded_left=pl) for (m, n, k) in triples
                for d in ("float16", "float32") for pl in (False, True)]
        x = enc.encode(pad_tensor(pads))
    else:
        probs = [GemmProblem(m=m, n=n, k=k, dtype=d, allow_tf32=t) for (m, n, k) in triples
                 for d, t in (("float16", False), ("float32", True), ("float32", False))]
        if kind == "cublas":
            x = enc.encode(problems_tensor(probs))
        else:
            cfgs = exhaustive_space()[::25] + [GemmConfig(16, 16, 16, 1, 1, 8), GemmConfig(256, 256, 256, 16, 5, 2)]
            x = enc.encode_cross(problems_tensor(probs), configs_tensor(cfgs))
    assert torch.isfinite(x).all(), [enc.names[j] for j in torch.nonzero(~torch.isfinite(x))[:, 1].unique()]
    assert x.abs().max() < 1e6


# ---------------------------------------------------------------- encoder versions and devices

def _encode_all(enc: FeatureEncoder) -> torch.Tensor:
    if enc.kind == "pad":
        return enc.encode(pad_tensor(PAD_CASES))
    if enc.kind == "cublas":
        return enc.encode(problems_tensor([p for p, _ in CASES]))
    return enc.encode(problems_tensor([p for p, _ in CASES]), configs_tensor([c for _, c in CASES]))


@pytest.mark.parametrize("kind", ["gemm", "cublas", "pad", "pr156851"])
def test_version_2_is_version_3_without_the_device_features(kind):
    """A model folder of encoder version 2 (models/h100 as shipped) encodes exactly as before: version 3
    only adds DEVICE_FEATURES, and every other column is unchanged."""
    v2, v3 = FeatureEncoder(SPEC, kind, 2), FeatureEncoder(SPEC, kind, 3)
    assert v2.version == 2 and v3.version == 3
    if kind == "pr156851":
        assert v2.names == v3.names == list(PR156851_FEATURES)
    else:
        assert [n for n in v3.names if n not in DEVICE_FEATURES] == v2.names
        assert set(v3.names) - set(v2.names) == set(DEVICE_FEATURES)
    x2, x3 = _encode_all(v2), _encode_all(v3)
    keep = [v3.names.index(n) for n in v2.names]
    assert torch.equal(x3[:, keep], x2)


def test_version_2_names_are_the_shipped_models():
    import json

    from perfmodel.locations import default_model_dir

    meta = json.loads((default_model_dir() / "metadata.json").read_text())
    if meta["encoder_version"] != 2:
        pytest.skip("the shipped model was retrained with another encoder version")
    for name, head in meta["heads"].items():
        assert FeatureEncoder(SPEC, head.get("encoder_kind", name), 2).names == head["features"], name


@pytest.mark.parametrize("kind", ["gemm", "cublas", "pad"])
def test_device_features_follow_the_spec(kind):
    """Every device property of the issue's list is a feature (SM count, max SM clock, DRAM bandwidth, L2,
    shared memory, the row's peak FLOP/s), taken from the spec: constant over rows, different between devices."""
    want = {"log_sm_count": lambda s: math.log(s.sm_count), "log_dram_gbs": lambda s: math.log(s.dram_bw_gbs),
            "log_max_sm_clock_ghz": lambda s: math.log(s.max_sm_clock_mhz / 1000),
            "log_l2_mb": lambda s: math.log(s.l2_bytes / 2**20),
            "log_smem_optin_kb": lambda s: math.log(s.shared_memory_per_block_optin / 1024)}
    rows = {}
    for name in ("h100-sxm", "h200", "a100-sxm"):
        spec = get_spec(name)
        enc = FeatureEncoder(spec, kind)
        x = _encode_all(enc).double()
        for feat, f in want.items():
            col = x[:, enc.names.index(feat)]
            np.testing.assert_allclose(col.numpy(), f(spec), rtol=1e-6, err_msg=f"{name} {feat}")
        rows[name] = x
    # H200 vs H100 SXM: same SMs, clock and arithmetic, more DRAM bandwidth (and L2): memory-bound
    # features move, the peak does not
    h100, h200 = FeatureEncoder(get_spec("h100-sxm"), kind), FeatureEncoder(get_spec("h200"), kind)
    for feat in ("log_dram_gbs", "log_memory_ms"):
        j = h100.names.index(feat)
        assert (rows["h200"][:, j] > rows["h100-sxm"][:, j] if feat == "log_dram_gbs"
                else rows["h200"][:, j] < rows["h100-sxm"][:, j]).all(), feat
    for feat in ("log_sm_count", "log_peak_tflops", "log_max_sm_clock_ghz", "log_compute_ms", "log_m"):
        j = h100.names.index(feat)
        assert torch.equal(rows["h200"][:, j], rows["h100-sxm"][:, j]), feat
    assert not torch.equal(rows["a100-sxm"], rows["h100-sxm"])
    assert h200.names == h100.names


def test_errors():
    with pytest.raises(ValueError, match="version"):
        FeatureEncoder(SPEC, "gemm", 1)
    with pytest.raises(ValueError, match="kind"):
        FeatureEncoder(SPEC, "conv")
    p, _ = CASES[0]
    with pytest.raises(ValueError, match="configs"):
        FeatureEncoder(SPEC, "gemm").encode(problems_tensor([p]))
