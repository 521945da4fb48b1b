"""Inductor's EXHAUSTIVE GEMM config space and its per-device pruning."""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import astuple

import numpy as np

from .devices import DeviceSpec
from .schema import BLOCK_SIZES, DTYPE_BYTES, NUM_STAGES, GemmConfig


def _smem_bytes(bm, bn, bk, stages, dtype_bytes):
    """(BM*BK + BN*BK) * dtype_bytes * num_stages, on ints or numpy arrays alike."""
    return (bm * bk + bn * bk) * dtype_bytes * stages


def _acc_registers(bm, bn, warps):
    """BM*BN / (num_warps*32), on ints or numpy arrays alike."""
    return bm * bn / (warps * 32)


def shared_memory_bytes(cfg: GemmConfig, dtype: str) -> int:
    """(BM*BK + BN*BK) * dtype_bytes * num_stages: the operand tiles of every pipeline stage."""
    return _smem_bytes(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages, DTYPE_BYTES[dtype])


def accumulator_registers(cfg: GemmConfig) -> float:
    """fp32 accumulator registers per thread: BM*BN / (num_warps*32)."""
    return _acc_registers(cfg.block_m, cfg.block_n, cfg.num_warps)


# fp32 accumulator registers a thread at or past which a config runs but spills: in the H200's grouped-GEMM sweep
# (data/h200 grouped parts) every such config (128x256 tiles on 4 warps) ran 2.0-8.5x the problem's best time on all
# 51 problems that timed it; the served grouped ranking puts them last.
SPILL_REGISTERS = 256
SPILL_SCORE = 10.0  # added to a spilling config's log-ms score: last, whatever the head says


def spill_scores(block_m, block_n, num_warps):
    """SPILL_SCORE where a config's accumulator spills (see SPILL_REGISTERS), else 0; ints or numpy arrays."""
    return np.where(_acc_registers(np.asarray(block_m, dtype=np.float64), np.asarray(block_n, dtype=np.float64),
                                   np.asarray(num_warps, dtype=np.float64)) >= SPILL_REGISTERS, SPILL_SCORE, 0.0)


def _within(smem, regs, spec: DeviceSpec):
    return (smem <= spec.shared_memory_per_block_optin) & (regs <= spec.registers_per_thread_max)


def _async_copies(rows, cols, contiguous, stride, dtype_bytes, warps):
    """Whether Triton pipelines an operand tile's loads with cp.async (at least 4 bytes a thread): the bytes one
    thread can move at once -- the 16-byte alignment of the stride between contiguous runs (stride * dtype bytes),
    the run within the tile (contiguous * dtype bytes), the tile's bytes per thread, 16 at most -- reach 4."""
    align = np.gcd(np.asarray(stride * dtype_bytes, dtype=np.int64), 16)
    vec = np.minimum(np.minimum(align, contiguous * dtype_bytes), rows * cols * dtype_bytes // (32 * warps))
    return vec >= 4


def shared_memory_need(bm, bn, bk, stages, warps, dtype_bytes, ieee_fp32, m, n, k, transpose_left, transpose_right,
                       static=True):
    """Triton 3.6's shared memory for the mm template's operand buffers on sm_90 (Hopper), on ints or numpy arrays
    broadcast together (e.g. configs (1, C), problems (P, 1)). Per operand tile (A: BM x BK, B: BK x BN): num_stages
    buffers where the dot is wgmma (fp16 / bf16 / TF32 with num_warps >= 4 and BLOCK_M >= 64), num_stages - 1 where
    it is not (IEEE fp32, or mma.sync), if the tile's loads are pipelined (cp.async: `_async_copies`; more than one
    stage; with static shapes, as Inductor compiles, more than one K iteration); else one buffer. Triton's epilogue
    scratch (at most BM x BN x dtype bytes, reused after the loop) is left out: it never exceeds 128 KiB for a tile
    within the register bound, so it decides nothing. Fitted on Triton's compile for sm_90 of the timed rows
    (benchmarks/studies/runnable_rule.py --measure; benchmarks/results/runnable_rule.txt): never above Triton's
    count, equal to it wherever the operand buffers are the larger."""
    bm, bn, bk, stages, warps, e = (np.asarray(x, dtype=np.int64) for x in (bm, bn, bk, stages, warps, dtype_bytes))
    m, n, k = (np.asarray(x, dtype=np.int64) for x in (m, n, k))
    tl, tr, ieee = (np.asarray(x, dtype=bool) for x in (transpose_left, transpose_right, ieee_fp32))
    wgmma = ~ieee & (warps >= 4) & (bm >= 64)
    loop = (stages > 1) & (~np.asarray(static, dtype=bool) | (k > bk))
    buffers = np.where(wgmma, stages, stages - 1)
    a = _async_copies(bm, bk, np.where(tl, bm, bk), np.where(tl, m, k), e, warps) & loop
    b = _async_copies(bk, bn, np.where(tr, bk, bn), np.where(tr, k, n), e, warps) & loop
    return bm * bk * e * np.where(a, buffers, 1) + bn * bk * e * np.where(b, buffers, 1)


def runnable(configs: np.ndarray, dtype_bytes: np.ndarray | float, spec: DeviceSpec) -> np.ndarray:
    """`fits` for many at once: configs (C, 6) in GemmConfig field order, dtype_bytes broadcastable to
    (P, 1) or a scalar -> bool (P, C) (or (C,)): within the device's shared memory and registers for every
    problem (the operand tiles of every stage, which `shared_memory_need` never exceeds); `runnable_for` says
    which of the others a given problem runs."""
    bm, bn, bk, _, stages, warps = (configs[:, i] for i in range(6))
    return _within(_smem_bytes(bm, bn, bk, stages, np.asarray(dtype_bytes, dtype=np.float64)),
                   _acc_registers(bm, bn, warps), spec)


def runnable_for(configs: np.ndarray, problems, spec: DeviceSpec) -> np.ndarray:
    """(P, C) bool: which configs (C, 6, GemmConfig field order) the device runs for each problem (a sequence of
    perfmodel.schema.GemmProblem): `shared_memory_need` at the problem's sizes, layout, dtype and TF32 flag within
    the device's shared memory, and the accumulator within its registers."""
    cols = np.array([(p.m, p.n, p.k, DTYPE_BYTES[p.dtype], p.dtype == "float32" and not p.allow_tf32,
                      p.transpose_left, p.transpose_right) for p in problems], dtype=np.int64).reshape(-1, 7)
    m, n, k, e, ieee, tl, tr = (cols[:, i:i + 1] for i in range(7))
    bm, bn, bk, _, stages, warps = (np.asarray(configs[:, i], dtype=np.int64)[None, :] for i in range(6))
    need = shared_memory_need(bm, bn, bk, stages, warps, e, ieee.astype(bool), m, n, k, tl.astype(bool),
                              tr.astype(bool))
    return _within(need, _acc_registers(bm, bn, warps), spec)


def rule_key(p) -> tuple:
    """What of a problem `runnable_for` reads: its dtype size, IEEE fp32 or not, layouts, the 16-byte alignment
    of M, N and K in bytes, and K up to the largest BLOCK_K (one K iteration or more). Problems with equal keys get
    equal masks (serve caches them per config set)."""
    e = DTYPE_BYTES[p.dtype]
    return (e, p.dtype == "float32" and not p.allow_tf32, p.transpose_left, p.transpose_right,
            math.gcd(p.m * e, 16), math.gcd(p.n * e, 16), math.gcd(p.k * e, 16), min(p.k, max(BLOCK_SIZES) + 1))


def fits(cfg: GemmConfig, dtype: str, spec: DeviceSpec, problem=None) -> bool:
    """Whether the device runs cfg: for every problem of dtype (problem None: the operand tiles of every stage
    within shared memory), or for one problem (`runnable_for`)."""
    if problem is not None:
        return bool(runnable_for(np.array([astuple(cfg)]), [problem], spec)[0, 0])
    return bool(_within(shared_memory_bytes(cfg, dtype), accumulator_registers(cfg), spec))


def inductor_num_warps(block_m: int, block_n: int, num_warps: int) -> int:
    """The warps Inductor gives a config: at most one per 16x16 accumulator tile (its
    `_finalize_mm_configs`: min(num_warps, BM*BN // 256)), so 16x16 tiles run on 1 warp."""
    return max(1, min(num_warps, block_m * block_n // 256))


def exhaustive_space(group_m: int = 8) -> list[GemmConfig]:
    """Inductor's EXHAUSTIVE mm space as it emits it: BLOCK_M/N/K in {16..256}, num_stages 1-5,
    num_warps {2,4,8} capped by `inductor_num_warps` and de-duplicated, GROUP_M 8 (1,650 configs; the 25
    16x16 tiles have num_warps 1)."""
    out: dict[GemmConfig, None] = {}
    for bm, bn, bk, s, w in itertools.product(BLOCK_SIZES, BLOCK_SIZES, BLOCK_SIZES, NUM_STAGES, (2, 4, 8)):
        out[GemmConfig(bm, bn, bk, group_m, s, inductor_num_warps(bm, bn, w))] = None
    return list(out)


def pruned_space(dtype: str, spec: DeviceSpec) -> list[GemmConfig]:
    return [c for c in exhaustive_space() if fits(c, dtype, spec)]


def stratified_sample(configs: list[GemmConfig], n: int, seed: int) -> list[GemmConfig]:
    """n configs spread over the (BM, BN, BK) tile shapes, then over stages and warps."""
    if n >= len(configs):
        return list(configs)
    rng = random.Random(seed)
    by_tile: dict[tuple[int, int, int], list[GemmConfig]] = {}
    for c in configs:
        by_tile.setdefault((c.block_m, c.block_n, c.block_k), []).append(c)
    for group in by_tile.values():
        rng.shuffle(group)
    tiles = sorted(by_tile)
    rng.shuffle(tiles)
    out: list[GemmConfig] = []
    # Round-robin over tiles so every tile shape appears before any appears twice.
    while len(out) < n:
        for t in tiles:
            if by_tile[t] and len(out) < n:
                out.append(by_tile[t].pop())
    return sorted(out, key=lambda c: (c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps))


def inductor_default_configs() -> list[GemmConfig]:
    """Inductor's default (non-exhaustive) mm configs for CUDA: CUDAConfigHeuristic().mm_configs of
    torch/_inductor/template_heuristics/triton.py (torch 2.13; `benchmarks/studies/probe_inductor.py` prints the
    installed torch's list), before Inductor scales them to the problem: (BM, BN, BK, stages, warps)."""
    raw = [
        (32, 32, 16, 1, 2), (32, 32, 128, 2, 4), (32, 64, 32, 5, 8), (64, 32, 32, 5, 8),
        (64, 32, 128, 5, 4), (64, 64, 16, 2, 4), (64, 64, 32, 2, 4), (64, 64, 64, 3, 8),
        (64, 64, 128, 5, 4), (64, 128, 32, 3, 4), (64, 128, 32, 4, 8), (64, 128, 64, 3, 4),
        (64, 128, 128, 4, 4), (128, 64, 32, 3, 4), (128, 64, 32, 4, 8), (128, 128, 32, 2, 8),
        (128, 128, 32, 3, 4), (128, 128, 64, 3, 4), (128, 128, 64, 5, 8), (128, 128, 128, 4, 8),
        (128, 256, 64, 4, 8),
    ]
    return [GemmConfig(bm, bn, bk, 8, s, w) for bm, bn, bk, s, w in raw]
