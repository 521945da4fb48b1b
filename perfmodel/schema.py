"""The problem/config schema of the public contract (docs/design.md).

Every value is validated on construction; errors name the field. Nothing is clamped.
"""
from __future__ import annotations

import math
import numbers
import struct
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

SCHEMA_VERSION = 1

# Canonical dtype names and their element sizes in bytes.
DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPES = tuple(DTYPE_BYTES)
# Inductor's pad_mm alignment, in elements (get_alignment_size_dtype).
PAD_ALIGNMENT: dict[str, int] = {"float16": 8, "bfloat16": 8, "float32": 4}

BLOCK_SIZES = (16, 32, 64, 128, 256)
NUM_WARPS = (1, 2, 4, 8)  # 1: Inductor's 16x16 tiles (it caps warps at BM*BN/256)
NUM_STAGES = (1, 2, 3, 4, 5)
GROUP_M = (1, 2, 4, 8, 16)


def is_column_major(shape: Any, stride: Any) -> bool:
    """Whether a matrix operand (.., rows, cols) with these strides is stored column-major (transposed):
    unit stride along rows, not along cols. A single column leaves it row-major. The one rule that sets
    GemmProblem.transpose_left/right from a tensor, for every hook (Triton launches, Inductor choices)."""
    shape, stride = tuple(shape), tuple(stride)
    return len(shape) >= 2 and stride[-1] != 1 and stride[-2] == 1 and shape[-1] > 1


def _norm_dtype(value: Any, field: str = "dtype") -> str:
    if isinstance(value, str):
        name = value.removeprefix("torch.")
        if name in DTYPE_BYTES:
            return name
        raise ValueError(f"{field}: unsupported dtype {value!r}; expected one of {', '.join(DTYPES)}")
    # torch.dtype, without importing torch here: its str() is "torch.float16".
    text = str(value)
    if type(value).__name__ == "dtype" and text.startswith("torch."):
        name = text.removeprefix("torch.")
        if name in DTYPE_BYTES:
            return name
        raise ValueError(f"{field}: unsupported dtype {text}; expected one of {', '.join(DTYPES)}")
    raise TypeError(f"{field}: expected a dtype name or torch.dtype, got {type(value).__name__}")


def _check_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    # Any integer a user holds (Python or numpy: numbers.Integral); bool (and numpy.bool_) is a flag,
    # never a dimension.
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{name}: NaN is not a valid value")
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {value}")
    return int(value)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__} ({value!r})")
    return value


def _check_choice(name: str, value: Any, choices: tuple[int, ...], what: str) -> int:
    value = _check_int(name, value)
    if value not in choices:
        raise ValueError(f"{name}: {value} is not {what} (allowed: {', '.join(map(str, choices))})")
    return value


# Largest dimension accepted: far beyond any GPU memory, but it keeps features finite.
MAX_DIM = 2**31 - 1


def _ignore_tf32_off_float32(problem: Any) -> None:
    """allow_tf32 set to False on a float16 / bfloat16 problem: TF32 is a mode of float32 matmuls only
    (torch.backends.cuda.matmul.allow_tf32 and Triton's tl.dot leave half-precision inputs as they are), so the
    flag means nothing there and is ignored -- the problem equals, and predicts as, the one without it. The
    hooks read it the same way (a half-precision launch never carries it)."""
    if problem.allow_tf32 and problem.dtype != "float32":
        object.__setattr__(problem, "allow_tf32", False)


# Problems are keyword-only: GemmProblem's sizes are (m, n, k) and PadProblem's (m, k, n) (as
# AutoHeuristic's pad_mm data), so a positional call could silently swap n and k.
@dataclass(frozen=True, kw_only=True)
class GemmProblem:
    """C[m, n] = A[m, k] @ B[k, n]; transpose_left/right: A/B stored column-major. Keyword-only.
    allow_tf32: float32 inputs on TF32 tensor cores; ignored (read back False) for float16 / bfloat16.

    batch > 1 is a bmm, C[b, m, n] = A[b, m, k] @ B[b, k, n] (Inductor's bmm template and aten::bmm),
    each of the b matrices in the layout the transpose flags give."""

    m: int
    n: int
    k: int
    dtype: str = "float16"
    allow_tf32: bool = False
    transpose_left: bool = False
    transpose_right: bool = False
    batch: int = 1

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name), maximum=MAX_DIM))
        object.__setattr__(self, "dtype", _norm_dtype(self.dtype))
        for name in ("allow_tf32", "transpose_left", "transpose_right"):
            _check_bool(name, getattr(self, name))
        _ignore_tf32_off_float32(self)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def min_bytes(self) -> float:
        """Each operand read once and the output written once (every matrix of a batch)."""
        return float(self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)) * self.dtype_bytes

    def as_dict(self) -> dict[str, Any]:
        """The fields by name; `batch` only where it is not 1, so that a plain GEMM's dict (dataset rows,
        the serving CLI's JSON) is the one it has always been. GemmProblem(**p.as_dict()) == p."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "batch" or self.batch != 1}

    @cached_property
    def packed(self) -> bytes:
        """The encoder's problem columns (features.PROBLEM_COLUMNS) as float64 bytes, computed once per
        object: an autotuner asks about one problem many times."""
        return struct.pack("8d", self.m, self.n, self.k, DTYPE_BYTES[self.dtype], self.dtype == "bfloat16",
                           self.allow_tf32, self.transpose_left, self.transpose_right)


@dataclass(frozen=True)
class GemmConfig:
    """One config of the canonical Triton GEMM template."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = _check_int(name, getattr(self, name))
            if value & (value - 1):
                raise ValueError(f"{name}: must be a power of two, got {value}")
            if not 16 <= value <= 256:
                raise ValueError(f"{name}: must be in [16, 256], got {value}")
            object.__setattr__(self, name, value)  # a plain int, whatever integer type came in
        for name, choices, what in (("group_m", GROUP_M, "a supported GROUP_M"),
                                    ("num_stages", NUM_STAGES, "a supported pipeline depth"),
                                    ("num_warps", NUM_WARPS, "a supported warp count")):
            object.__setattr__(self, name, _check_choice(name, getattr(self, name), choices, what))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @cached_property
    def packed(self) -> bytes:
        """The six fields as float64 bytes, in field order, computed once per object: the encoder
        joins these to build a config tensor without converting Python ints on every call.
        (cached_property writes the instance __dict__ directly, so it works on a frozen dataclass.)"""
        return struct.pack("6d", self.block_m, self.block_n, self.block_k, self.group_m, self.num_stages,
                           self.num_warps)

    def triton_kwargs(self) -> dict[str, int]:
        """The names of the Triton template (and Inductor's Config.all_kwargs())."""
        return {
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "BLOCK_K": self.block_k,
            "GROUP_M": self.group_m,
            "num_stages": self.num_stages,
            "num_warps": self.num_warps,
        }

    @classmethod
    def from_triton_kwargs(cls, kw: dict[str, Any]) -> "GemmConfig":
        def get(*names: str, default: Any = None) -> Any:
            for name in names:
                if name in kw:
                    return kw[name]
            if default is None:
                raise ValueError(f"config: missing {names[0]}")
            return default

        return cls(
            block_m=get("BLOCK_M", "block_m"),
            block_n=get("BLOCK_N", "block_n"),
            block_k=get("BLOCK_K", "block_k"),
            group_m=get("GROUP_M", "group_m", default=8),
            num_stages=get("num_stages", default=3),
            num_warps=get("num_warps", default=4),
        )


def check_config(value: Any, name: str = "config") -> GemmConfig:
    if not isinstance(value, GemmConfig):
        raise TypeError(f"{name}: expected a GemmConfig, got {type(value).__name__}")
    return value


def check_problem(value: Any, name: str = "problem") -> GemmProblem:
    if not isinstance(value, GemmProblem):
        raise TypeError(f"{name}: expected a GemmProblem, got {type(value).__name__}")
    return value


@dataclass(frozen=True, kw_only=True)
class PadProblem:
    """A GEMM whose operands Inductor's pad_mm pass may pad to the dtype's alignment. Keyword-only.
    allow_tf32: as GemmProblem's (ignored for float16 / bfloat16)."""

    m: int
    k: int
    n: int
    dtype: str = "float16"
    transpose_left: bool = False
    transpose_right: bool = False
    prepadded_left: bool = False
    prepadded_right: bool = False
    allow_tf32: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "k", "n"):
            object.__setattr__(self, name, _check_int(name, getattr(self, name), maximum=MAX_DIM))
        object.__setattr__(self, "dtype", _norm_dtype(self.dtype))
        for name in ("transpose_left", "transpose_right", "prepadded_left", "prepadded_right", "allow_tf32"):
            _check_bool(name, getattr(self, name))
        _ignore_tf32_off_float32(self)

    @property
    def alignment(self) -> int:
        return PAD_ALIGNMENT[self.dtype]

    def padded_dims(self) -> tuple[int, int, int]:
        """(m, k, n) rounded up to the alignment; a dim of size 1 is not padded."""
        a = self.alignment

        def up(d: int) -> int:
            return d if d == 1 else -(-d // a) * a

        return up(self.m), up(self.k), up(self.n)

    def needs_padding(self) -> bool:
        return self.padded_dims() != (self.m, self.k, self.n)

    def gemm(self, padded: bool = False) -> GemmProblem:
        m, k, n = self.padded_dims() if padded else (self.m, self.k, self.n)
        return GemmProblem(m=m, n=n, k=k, dtype=self.dtype, allow_tf32=self.allow_tf32,
                           transpose_left=False if padded else self.transpose_left,
                           transpose_right=False if padded else self.transpose_right)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PadDecision:
    should_pad: bool
    orig_ms: float
    padded_ms: float
