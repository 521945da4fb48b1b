"""The config space and its per-device pruning, against hand-computed cases."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from perfmodel import GemmConfig
from perfmodel.configs import (accumulator_registers, exhaustive_space, fits, inductor_default_configs,
                               pruned_space, shared_memory_bytes, stratified_sample)
from perfmodel.devices import get_spec

H100 = get_spec("h100-sxm")
A100 = get_spec("a100-sxm")


def tile(c: GemmConfig) -> tuple[int, int, int]:
    return c.block_m, c.block_n, c.block_k


# (BM, BN, BK, stages, warps, dtype, hand-computed shared memory bytes, hand-computed registers, fits on H100)
CASES = [
    (256, 128, 128, 3, 8, "float16", (256 * 128 + 128 * 128) * 2 * 3, 256 * 128 / 256, False),  # 294912 smem
    (128, 128, 64, 3, 4, "float16", 98304, 128.0, True),
    (128, 128, 64, 3, 4, "bfloat16", 98304, 128.0, True),
    (128, 128, 64, 3, 4, "float32", 196608, 128.0, True),      # fp32 doubles the bytes, still fits
    (128, 128, 64, 4, 4, "float16", 131072, 128.0, True),
    (128, 128, 64, 4, 4, "float32", 262144, 128.0, False),     # ... and here it no longer fits
    (256, 256, 16, 1, 8, "float16", 16384, 256.0, False),      # 256 accumulator registers > 255
    (256, 256, 32, 2, 8, "float16", 65536, 256.0, False),
    (128, 256, 32, 3, 4, "float16", 73728, 256.0, False),      # 32768 / 128 threads = 256
    (128, 256, 32, 3, 8, "float16", 73728, 128.0, True),
    (256, 128, 64, 2, 4, "float16", 98304, 256.0, False),
    (128, 128, 16, 1, 2, "float16", 8192, 256.0, False),       # 16384 / 64 threads
    (64, 128, 16, 1, 2, "float16", 6144, 128.0, True),
    (16, 16, 256, 5, 1, "float32", 163840, 8.0, True),        # 16x16 tiles: 1 warp (Inductor's cap)
    (256, 64, 128, 5, 8, "float16", 409600, 64.0, False),
    (64, 64, 256, 4, 4, "float32", 524288, 32.0, False),
    (128, 64, 128, 3, 4, "float16", 147456, 64.0, True),
    (128, 64, 128, 3, 4, "float32", 294912, 64.0, False),
]


@pytest.mark.parametrize("bm,bn,bk,stages,warps,dtype,smem,regs,ok", CASES)
def test_pruning_hand_computed(bm, bn, bk, stages, warps, dtype, smem, regs, ok):
    cfg = GemmConfig(bm, bn, bk, 8, stages, warps)
    assert shared_memory_bytes(cfg, dtype) == smem
    assert accumulator_registers(cfg) == regs
    assert fits(cfg, dtype, H100) is ok
    assert (cfg in pruned_space(dtype, H100)) is ok


def test_pruning_boundaries_inclusive():
    cfg = GemmConfig(128, 128, 64, 8, 3, 4)  # 98304 bytes of fp16 shared memory
    at_limit = dataclasses.replace(H100, shared_memory_per_block_optin=98304)
    below = dataclasses.replace(H100, shared_memory_per_block_optin=98303)
    assert fits(cfg, "float16", at_limit)
    assert not fits(cfg, "float16", below)
    # 128 registers exactly at the limit fits, one over does not
    assert fits(cfg, "float16", dataclasses.replace(H100, registers_per_thread_max=128))
    assert not fits(cfg, "float16", dataclasses.replace(H100, registers_per_thread_max=127))


def test_a100_prunes_more():
    cfg = GemmConfig(128, 128, 128, 8, 3, 4)  # 196608 fp16 bytes: fits 232448 (H100), not 166912 (A100)
    assert fits(cfg, "float16", H100)
    assert not fits(cfg, "float16", A100)
    a100 = set(pruned_space("float16", A100))
    h100 = set(pruned_space("float16", H100))
    assert a100 < h100


def test_exhaustive_space():
    # Inductor's EXHAUSTIVE space as it emits it: 5^3 tiles x 5 stages x warps {2, 4, 8}, each capped at
    # one warp per 16x16 accumulator tile and de-duplicated (16x16: 1 warp; 16x32: 2; 32x32/16x64: 2, 4).
    space = exhaustive_space()
    assert len(space) == len(set(space)) == 1875 - 2 * 25 - 2 * 50 - 3 * 25 == 1650
    assert all(c.num_warps <= max(1, c.block_m * c.block_n // 256) for c in space)
    assert sum(c.num_warps == 1 for c in space) == 25
    assert {(c.block_m, c.block_n) for c in space if c.num_warps == 1} == {(16, 16)}
    assert {c.group_m for c in space} == {8}
    assert {c.block_m for c in space} == {c.block_n for c in space} == {c.block_k for c in space} \
        == {16, 32, 64, 128, 256}
    assert {c.num_stages for c in space} == {1, 2, 3, 4, 5}
    assert {c.num_warps for c in space} == {1, 2, 4, 8}
    assert {c.group_m for c in exhaustive_space(group_m=4)} == {4}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pruned_space_is_the_fitting_subset(dtype):
    space = exhaustive_space()
    pruned = pruned_space(dtype, H100)
    assert set(pruned) <= set(space)
    assert 0 < len(pruned) < len(space)
    # exactly the configs that satisfy both hand-written limits
    expected = [c for c in space
                if (c.block_m * c.block_k + c.block_n * c.block_k) * (4 if dtype == "float32" else 2)
                * c.num_stages <= 232448 and c.block_m * c.block_n <= 255 * c.num_warps * 32]
    assert pruned == expected
    # no 256x256 tile can hold its accumulator in 255 registers, even with 8 warps
    assert not any(tile(c)[:2] == (256, 256) for c in pruned)


def test_pruned_space_fp32_smaller():
    assert set(pruned_space("float32", H100)) < set(pruned_space("float16", H100))
    assert pruned_space("float16", H100) == pruned_space("bfloat16", H100)


def test_stratified_sample_deterministic_and_subset():
    space = pruned_space("float16", H100)
    for n in (1, 10, 64, 128, 300):
        a = stratified_sample(space, n, seed=7)
        b = stratified_sample(space, n, seed=7)
        assert a == b
        assert len(a) == n
        assert len(set(a)) == n
        assert set(a) <= set(space)
    assert stratified_sample(space, 128, seed=1) != stratified_sample(space, 128, seed=2)


def test_stratified_sample_does_not_mutate_input():
    space = pruned_space("float16", H100)
    copy = list(space)
    stratified_sample(space, 50, seed=3)
    assert space == copy


def test_stratified_sample_covers_tiles_before_repeating():
    space = pruned_space("float16", H100)
    tiles = {tile(c) for c in space}
    n_tiles = len(tiles)
    assert n_tiles > 20
    # fewer than the tile shapes: all distinct
    small = stratified_sample(space, n_tiles - 5, seed=0)
    assert len({tile(c) for c in small}) == n_tiles - 5
    # exactly the tile shapes: each once
    exact = stratified_sample(space, n_tiles, seed=0)
    assert {tile(c) for c in exact} == tiles
    # more: every tile present, and none three times before every tile with >= 2 configs has two
    more = stratified_sample(space, n_tiles + 10, seed=0)
    counts = Counter(tile(c) for c in more)
    assert set(counts) == tiles
    assert max(counts.values()) == 2
    assert sum(v == 2 for v in counts.values()) == 10


def test_stratified_sample_round_robin_respects_small_tiles():
    # a tile with a single config is exhausted first; the others keep filling round-robin
    space = [GemmConfig(16, 16, 16, 8, 1, 2)] + [GemmConfig(32, 32, 32, 8, s, w) for s in (1, 2, 3) for w in (2, 4)]
    out = stratified_sample(space, 5, seed=0)
    assert GemmConfig(16, 16, 16, 8, 1, 2) in out
    assert len(out) == 5 and len(set(out)) == 5


def test_stratified_sample_n_at_least_len():
    space = pruned_space("float32", H100)
    assert stratified_sample(space, len(space), seed=0) == space
    assert stratified_sample(space, len(space) + 100, seed=0) == space


def test_inductor_default_configs_are_torchs():
    """Our copy of Inductor's default mm list is the installed torch's own (the CUDA heuristic's
    mm_configs, importable on the CPU), config for config and in order."""
    try:
        from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic
        theirs = CUDAConfigHeuristic().mm_configs
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"torch's private CUDAConfigHeuristic().mm_configs is not importable here: {exc}")
    ours = [(c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps, c.group_m) for c in inductor_default_configs()]
    assert ours == [(c.block_m, c.block_n, c.block_k, c.num_stages, c.num_warps, c.group_m) for c in theirs]


def test_inductor_default_configs_fit_h100():
    cfgs = inductor_default_configs()
    assert len(set(cfgs)) == len(cfgs)
    assert all(c in set(exhaustive_space()) for c in cfgs)
    # (128, 128, 128) with 4 fp16 stages needs 256 KiB of shared memory: the only default that cannot run.
    assert [c for c in cfgs if not fits(c, "float16", H100)] == [GemmConfig(128, 128, 128, 8, 4, 8)]


def test_config_sample_keeps_inductor_defaults_and_caps_ieee_compiles():
    from perfmodel.data_gen.gemm_sweep import IEEE_MAX_FMA_PER_THREAD, config_sample, fma_per_thread

    defaults = set(inductor_default_configs())
    for dtype, tf32 in (("float16", False), ("float32", True), ("float32", False)):
        fitting = defaults & set(pruned_space(dtype, H100))
        for n in (40, 128):
            cfgs = config_sample(dtype, tf32, (False, True), H100, n)
            assert len(cfgs) == len(set(cfgs)) == n
            assert fitting <= set(cfgs)
            if dtype == "float32" and not tf32:
                assert all(fma_per_thread(c) <= IEEE_MAX_FMA_PER_THREAD for c in cfgs if c not in defaults)
    assert config_sample("float16", False, (False, True), H100, 64) == config_sample("float16", False, (False, True), H100, 64)


def test_runnable_is_fits_for_many():
    from perfmodel.configs import runnable
    from perfmodel.features import configs_tensor

    space = exhaustive_space()
    ct = configs_tensor(space).numpy()
    both = runnable(ct, np.array([[2.0], [4.0]]), H100)
    assert both.shape == (2, len(space))
    for row, dtype in zip(both, ("float16", "float32")):
        assert row.tolist() == [fits(c, dtype, H100) for c in space]
    assert 0 < both[1].sum() < both[0].sum() < len(space)  # fp32 tiles need twice the shared memory
