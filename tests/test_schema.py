"""The schema of the public contract: every bad input raises ValueError/TypeError naming the field."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from perfmodel import GemmConfig, GemmProblem, PadProblem
from perfmodel.schema import check_config, check_problem

GOOD_PROBLEM = dict(m=64, n=64, k=64, dtype="float16")
GOOD_CONFIG = dict(block_m=64, block_n=64, block_k=32, group_m=8, num_stages=3, num_warps=4)
GOOD_PAD = dict(m=63, k=65, n=64, dtype="bfloat16")

# (field, bad value, expected exception type)
BAD_DIMS = [
    (0, ValueError),
    (-4, ValueError),
    (2.5, TypeError),
    ("64", TypeError),
    (float("nan"), ValueError),
    (True, TypeError),
    (None, TypeError),
    (64.0, TypeError),  # an integral float is still not an int: nothing is silently converted
    (2**31, ValueError),  # beyond MAX_DIM
]


def _raises_naming(cls, kwargs, field, exc):
    with pytest.raises(exc) as info:
        cls(**kwargs)
    assert field in str(info.value), f"message {str(info.value)!r} does not name {field!r}"


@pytest.mark.parametrize("field", ["m", "n", "k", "batch"])
@pytest.mark.parametrize("value,exc", BAD_DIMS)
def test_gemm_problem_bad_dim(field, value, exc):
    _raises_naming(GemmProblem, {**GOOD_PROBLEM, field: value}, field, exc)


@pytest.mark.parametrize("field", ["m", "n", "k"])
@pytest.mark.parametrize("value,exc", BAD_DIMS)
def test_pad_problem_bad_dim(field, value, exc):
    _raises_naming(PadProblem, {**GOOD_PAD, field: value}, field, exc)


@pytest.mark.parametrize("cls,good", [(GemmProblem, GOOD_PROBLEM), (PadProblem, GOOD_PAD)])
@pytest.mark.parametrize("value,exc", [("int8", ValueError), ("float64", ValueError), (torch.int8, ValueError),
                                       ("torch.int32", ValueError), (16, TypeError), (None, TypeError)])
def test_bad_dtype(cls, good, value, exc):
    _raises_naming(cls, {**good, "dtype": value}, "dtype", exc)


@pytest.mark.parametrize("cls,good,field", [
    (GemmProblem, GOOD_PROBLEM, "allow_tf32"), (GemmProblem, GOOD_PROBLEM, "transpose_left"),
    (GemmProblem, GOOD_PROBLEM, "transpose_right"), (PadProblem, GOOD_PAD, "prepadded_left"),
    (PadProblem, GOOD_PAD, "prepadded_right"), (PadProblem, GOOD_PAD, "transpose_left"),
    (PadProblem, GOOD_PAD, "allow_tf32"),
])
@pytest.mark.parametrize("value", ["False", 1, None])
def test_flags_must_be_bool(cls, good, field, value):
    # A string-typed boolean ("False" is truthy) is the classic bug: refuse it.
    _raises_naming(cls, {**good, field: value}, field, TypeError)


@pytest.mark.parametrize("value,expected", [
    (torch.float16, "float16"), (torch.bfloat16, "bfloat16"), (torch.float32, "float32"),
    ("torch.bfloat16", "bfloat16"), ("torch.float16", "float16"), ("float32", "float32"),
])
@pytest.mark.parametrize("cls,good", [(GemmProblem, GOOD_PROBLEM), (PadProblem, GOOD_PAD)])
def test_dtype_normalised(cls, good, value, expected):
    p = cls(**{**good, "dtype": value})
    assert p.dtype == expected
    assert isinstance(p.dtype, str)
    # Normalised values compare and hash like the canonical spelling.
    assert p == cls(**{**good, "dtype": expected})
    assert hash(p) == hash(cls(**{**good, "dtype": expected}))


@pytest.mark.parametrize("field", ["block_m", "block_n", "block_k"])
@pytest.mark.parametrize("value,exc", [
    (48, ValueError), (24, ValueError), (100, ValueError),  # not powers of two
    (8, ValueError), (512, ValueError), (4, ValueError),     # powers of two outside [16, 256]
    (0, ValueError), (-16, ValueError), (16.0, TypeError), ("64", TypeError), (True, TypeError),
    (float("nan"), ValueError),
])
def test_config_bad_block(field, value, exc):
    _raises_naming(GemmConfig, {**GOOD_CONFIG, field: value}, field, exc)


@pytest.mark.parametrize("field,value,exc", [
    ("num_warps", 3, ValueError), ("num_warps", 16, ValueError),
    ("num_warps", 0, ValueError), ("num_warps", 4.0, TypeError),
    ("num_stages", 0, ValueError), ("num_stages", 6, ValueError), ("num_stages", -1, ValueError),
    ("num_stages", "3", TypeError),
    ("group_m", 0, ValueError), ("group_m", 3, ValueError), ("group_m", 32, ValueError),
    ("group_m", None, TypeError), ("group_m", False, TypeError),
])
def test_config_bad_choice(field, value, exc):
    _raises_naming(GemmConfig, {**GOOD_CONFIG, field: value}, field, exc)


def test_config_space_bounds_accepted():
    for b in (16, 32, 64, 128, 256):
        c = GemmConfig(block_m=b, block_n=b, block_k=b, group_m=1, num_stages=1, num_warps=2)
        assert (c.block_m, c.block_n, c.block_k) == (b, b, b)
    c = GemmConfig(16, 256, 32, 16, 5, 8)
    assert c.as_dict() == dict(block_m=16, block_n=256, block_k=32, group_m=16, num_stages=5, num_warps=8)


def test_config_triton_kwargs_roundtrip():
    c = GemmConfig(**GOOD_CONFIG)
    kw = c.triton_kwargs()
    assert kw == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_stages": 3, "num_warps": 4}
    assert GemmConfig.from_triton_kwargs(kw) == c
    assert GemmConfig.from_triton_kwargs(c.as_dict()) == c
    with pytest.raises(ValueError, match="BLOCK_M"):
        GemmConfig.from_triton_kwargs({"BLOCK_N": 64, "BLOCK_K": 32})
    with pytest.raises(ValueError, match="block_m"):
        GemmConfig.from_triton_kwargs({**kw, "BLOCK_M": 48})


@pytest.mark.parametrize("obj,field,value", [
    (GemmProblem(**GOOD_PROBLEM), "m", 128),
    (GemmProblem(**GOOD_PROBLEM), "dtype", "float32"),
    (GemmConfig(**GOOD_CONFIG), "block_m", 128),
    (PadProblem(**GOOD_PAD), "k", 64),
])
def test_frozen(obj, field, value):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, value)
    assert getattr(obj, field) != value


def test_check_config_rejects_dict():
    with pytest.raises(TypeError, match="config"):
        check_config(dict(GOOD_CONFIG))
    with pytest.raises(TypeError, match="config"):
        check_config(None)
    c = GemmConfig(**GOOD_CONFIG)
    assert check_config(c) is c


def test_check_problem_rejects_dict():
    with pytest.raises(TypeError, match="problem"):
        check_problem(dict(GOOD_PROBLEM))
    with pytest.raises(TypeError, match="problem"):
        check_problem(PadProblem(**GOOD_PAD))
    p = GemmProblem(**GOOD_PROBLEM)
    assert check_problem(p) is p


def test_huge_valid_problem():
    p = GemmProblem(m=2**20, n=2**20, k=2**20, dtype="float32", allow_tf32=True)
    assert (p.m, p.n, p.k) == (2**20, 2**20, 2**20)
    assert p.flops == 2.0 * 2**60
    assert p.min_bytes == 3.0 * 2**40 * 4
    pp = PadProblem(m=2**20, k=2**20, n=2**20)
    assert not pp.needs_padding()
    big = GemmProblem(m=2**31 - 1, n=1, k=1)  # MAX_DIM itself is accepted
    assert big.m == 2**31 - 1


def test_gemm_problem_properties():
    p = GemmProblem(m=3, n=5, k=7, dtype="bfloat16")
    assert p.dtype_bytes == 2
    assert p.flops == 2 * 3 * 5 * 7
    assert p.min_bytes == (3 * 7 + 7 * 5 + 3 * 5) * 2
    assert p.as_dict() == dict(m=3, n=5, k=7, dtype="bfloat16", allow_tf32=False, transpose_left=False,
                               transpose_right=False)
    assert GemmProblem(m=3, n=5, k=7, dtype="float32").dtype_bytes == 4


def test_gemm_problem_batch():
    # a plain GEMM is batch 1, and its dict is what it was before the batch field
    p = GemmProblem(m=3, n=5, k=7)
    assert p.batch == 1 and "batch" not in p.as_dict() and p == GemmProblem(m=3, n=5, k=7, batch=1)
    b = GemmProblem(m=3, n=5, k=7, dtype="bfloat16", transpose_right=True, batch=np.int64(12))
    assert type(b.batch) is int and b.batch == 12 and b != p.__class__(**{**b.as_dict(), "batch": 1})
    assert b.as_dict()["batch"] == 12 and GemmProblem(**b.as_dict()) == b
    assert b.flops == 12 * 2 * 3 * 5 * 7
    assert b.min_bytes == 12 * (3 * 7 + 7 * 5 + 3 * 5) * 2
    assert b.packed == GemmProblem(m=3, n=5, k=7, dtype="bfloat16", transpose_right=True).packed  # encoder columns


@pytest.mark.parametrize("dtype,dims,expected", [
    # fp16/bf16: alignment 8
    ("float16", (4095, 4097, 1000), (4096, 4104, 1000)),
    ("bfloat16", (9, 15, 17), (16, 16, 24)),
    ("bfloat16", (8, 16, 24), (8, 16, 24)),
    # fp32: alignment 4
    ("float32", (4095, 4097, 1000), (4096, 4100, 1000)),
    ("float32", (5, 6, 7), (8, 8, 8)),
    ("float32", (2, 3, 4), (4, 4, 4)),
    # a dim of size 1 is never padded (any dtype)
    ("float16", (1, 33, 1), (1, 40, 1)),
    ("float32", (1, 1, 3), (1, 1, 4)),
    ("bfloat16", (1, 1, 1), (1, 1, 1)),
])
def test_padded_dims(dtype, dims, expected):
    m, k, n = dims
    pp = PadProblem(m=m, k=k, n=n, dtype=dtype)
    assert pp.padded_dims() == expected
    assert pp.needs_padding() == (expected != dims)
    assert pp.alignment == (4 if dtype == "float32" else 8)


def test_pad_problem_gemm():
    pp = PadProblem(m=4095, k=4097, n=1000, dtype="bfloat16", transpose_left=True, transpose_right=False,
                    prepadded_left=True)
    orig = pp.gemm()
    assert (orig.m, orig.k, orig.n, orig.dtype) == (4095, 4097, 1000, "bfloat16")
    assert orig.transpose_left and not orig.transpose_right
    padded = pp.gemm(padded=True)
    assert (padded.m, padded.k, padded.n) == (4096, 4104, 1000)
    # the padded operands are fresh row-major tensors
    assert not padded.transpose_left and not padded.transpose_right
    tf = PadProblem(m=5, k=5, n=5, dtype="float32", allow_tf32=True).gemm()
    assert tf.allow_tf32


def test_pad_problem_field_order_and_defaults():
    # PadProblem's fields are in (m, k, n) order, as AutoHeuristic's pad_mm data has them.
    pp = PadProblem(m=10, k=20, n=30)
    assert (pp.m, pp.k, pp.n) == (10, 20, 30)
    assert pp.as_dict() == dict(m=10, k=20, n=30, dtype="float16", transpose_left=False, transpose_right=False,
                                prepadded_left=False, prepadded_right=False, allow_tf32=False)


@pytest.mark.parametrize("cls,args", [
    (GemmProblem, (4096, 4096, 4096)),
    (GemmProblem, (4096, 4096, 4096, "float16")),
    (PadProblem, (4095, 4097, 1000)),
])
def test_problems_are_keyword_only(cls, args):
    """GemmProblem is (m, n, k) and PadProblem (m, k, n): positional sizes would be a trap."""
    with pytest.raises(TypeError, match="positional"):
        cls(*args)


def test_config_stays_positional():
    assert GemmConfig(128, 64, 32, 8, 3, 4) == GemmConfig(block_m=128, block_n=64, block_k=32, group_m=8,
                                                          num_stages=3, num_warps=4)


def test_numpy_integers_accepted_and_stored_as_int():
    import numpy as np

    p = GemmProblem(m=np.int64(4096), n=np.int32(1000), k=np.uint16(7), dtype="float16")
    assert (p.m, p.n, p.k) == (4096, 1000, 7) and all(type(v) is int for v in (p.m, p.n, p.k))
    c = GemmConfig(np.int64(16), np.int64(16), np.int32(64), np.int8(8), np.int64(2), np.int64(1))
    assert c == GemmConfig(16, 16, 64, 8, 2, 1) and all(type(v) is int for v in c.as_dict().values())
    pp = PadProblem(m=np.int64(4095), k=np.int64(4097), n=np.int64(1000))
    assert pp.padded_dims() == (4096, 4104, 1000)
    with pytest.raises(TypeError, match="m"):
        GemmProblem(m=np.bool_(True), n=1, k=1)
    with pytest.raises(TypeError, match="block_m"):
        GemmConfig(np.float64(16), 16, 16)
