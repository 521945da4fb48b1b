"""What Inductor hands the choices handler, read as the model's problems: the GemmProblem of an mm/addmm/bmm/baddbmm's
MMKernelInputs, a Triton template choice's config, and -- where the compile is dynamic -- the symbolic sizes, the
range of each symbol (the shape environment's value ranges) and the problems a range decision scores.

Inductor's private APIs move between releases: every reading here checks what it uses and falls back (a symbol
whose range cannot be read is taken as Dynamo's default for a dynamic size, [2, inf), with one warning).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from perfmodel.schema import MAX_DIM, GemmConfig, GemmProblem, is_column_major

from .notices import warn_once

# The triton.Config / template kwargs names of a GemmConfig's fields (Inductor's, the tutorial's, lower case)
_KWARG_NAMES = {
    "block_m": ("BLOCK_M", "BLOCK_SIZE_M", "block_m"),
    "block_n": ("BLOCK_N", "BLOCK_SIZE_N", "block_n"),
    "block_k": ("BLOCK_K", "BLOCK_SIZE_K", "block_k"),
    "group_m": ("GROUP_M", "GROUP_SIZE_M", "group_m"),
}
_DEFAULT_GROUP_M = 8  # Inductor's and the tutorial's default when a config leaves GROUP_M out

# A symbol without an upper bound (Dynamo's default range for a dynamic size is [2, inf)) is scored up to this
# value (or its size hint, when larger): powers of two from its lower bound, 2, 4, ..., 4096 -- decode batches
# and prefill token counts of the LLM workloads the project measures (issue 46: 1-64 sequences, 4x512 tokens).
RANGE_CAP = 4096
# At most this many problems per range decision (the product over several symbols is thinned to it).
MAX_BUCKETS = 64
_DIM_NAMES = {"m": "M", "n": "N", "k": "K", "batch": "batch"}
# Dynamo's default range of a dynamic size (0 and 1 are specialised): what a symbol gets when its range cannot be read
DEFAULT_RANGE = (2, None)


def kwargs_to_gemm(kw: dict[str, Any]) -> GemmConfig:
    """A Triton template's (or triton.Config's) kwargs -> GemmConfig. ValueError/TypeError for a config outside the
    canonical GEMM template's space."""
    values: dict[str, Any] = {}
    for name, names in _KWARG_NAMES.items():
        found = [kw[n] for n in names if n in kw]
        if not found:
            if name == "group_m":
                values[name] = _DEFAULT_GROUP_M
                continue
            raise ValueError(f"config: no {names[0]} (or {', '.join(names[1:])}) in {sorted(kw)}")
        values[name] = found[0]
    values["num_stages"] = kw.get("num_stages", 3)
    values["num_warps"] = kw.get("num_warps", 4)
    return GemmConfig(**values)


def fp32_matmul_on_tf32() -> bool:
    """Whether float32 matmuls run on TF32 here: torch's fp32_precision setting of CUDA matmuls ("tf32" after
    torch.set_float32_matmul_precision("high") or torch.backends.cuda.matmul.allow_tf32 = True; what Inductor's
    templates read), else, on a torch without it, the legacy allow_tf32 flag. Read at compile time."""
    import torch

    mm = torch.backends.cuda.matmul
    try:
        return mm.fp32_precision == "tf32"
    except (AttributeError, RuntimeError):
        pass
    try:
        return bool(mm.allow_tf32)
    except RuntimeError:  # torch refuses to read the legacy flag once the new API was used
        return False


def template_allow_tf32(choices: Sequence[Any]) -> bool | None:
    """ALLOW_TF32 of Inductor's template choices (KernelTemplateChoice.extra_kwargs) where one sets it -- Inductor
    turns TF32 on for a float32 template only above a size threshold even where matmuls run on TF32 -- else None."""
    flags = [bool(x["ALLOW_TF32"]) for c in choices
             if isinstance(x := getattr(c, "extra_kwargs", None), dict) and "ALLOW_TF32" in x]
    return any(flags) if flags else None


def _operands(kernel_inputs: Any) -> tuple[int, int]:
    n_nodes = len(kernel_inputs.nodes())
    return getattr(kernel_inputs, "_mat1_idx", -2) % n_nodes, getattr(kernel_inputs, "_mat2_idx", -1) % n_nodes


def problem_from_kernel_inputs(kernel_inputs: Any, allow_tf32: bool | None = None) -> GemmProblem:
    """The GemmProblem of Inductor's MMKernelInputs (mm: nodes (mat1, mat2); addmm: (bias, mat1, mat2); bmm:
    (mat1, mat2) of shapes (b, m, k), (b, k, n): batch b; baddbmm: (bias, mat1, mat2)) at Inductor's size hints;
    each operand's layout from its last two dims; a float32 problem on TF32 as allow_tf32 says (the templates'
    flag, template_allow_tf32), or where it is None as the matmul setting says (fp32_matmul_on_tf32). ValueError
    for what the model does not cover (operands of other ranks or batches, unsupported dtype, unhinted shapes)."""
    i1, i2 = _operands(kernel_inputs)
    shapes, strides = kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted()
    ranks = (len(shapes[i1]), len(shapes[i2]))
    if ranks not in ((2, 2), (3, 3)) or (ranks == (3, 3) and int(shapes[i1][0]) != int(shapes[i2][0])):
        raise ValueError(f"shape: operands {tuple(shapes[i1])} @ {tuple(shapes[i2])} are not an mm or a bmm")
    batch = int(shapes[i1][0]) if ranks == (3, 3) else 1
    m, n, k = (int(x) for x in kernel_inputs.mnk_hinted())
    dtype = kernel_inputs.dtypes()[i1]
    prob = GemmProblem(m=m, n=n, k=k, dtype=dtype, batch=batch,
                       transpose_left=is_column_major(shapes[i1], strides[i1]),
                       transpose_right=is_column_major(shapes[i2], strides[i2]))
    if prob.dtype == "float32" and (fp32_matmul_on_tf32() if allow_tf32 is None else allow_tf32):
        prob = replace(prob, allow_tf32=True)
    return prob


# ------------------------------------------------------------------------------------------ dynamic sizes
def _is_static(x: Any) -> bool:
    return isinstance(x, int) or bool(getattr(x, "is_number", False))


@dataclass(frozen=True)
class SymbolicProblem:
    """A GEMM whose sizes are symbolic: `hint` (the problem at Inductor's size hints), `dims` (the symbolic ones of
    batch, m, n, k: sympy expressions), and per free symbol its size hint and value range (lo, hi; hi None: no
    upper bound)."""

    hint: GemmProblem
    dims: dict[str, Any]
    symbols: tuple[Any, ...]
    hints: dict[Any, int]
    ranges: dict[Any, tuple[int, int | None]]
    dim_range: tuple[int, int | None] | None = None   # one symbolic dimension: its own range (bound_sympy)

    def at(self, values: dict[Any, int]) -> GemmProblem | None:
        """The problem with each symbol at its value (values: symbol -> int); None where a dimension leaves the
        model's domain (below 1, over MAX_DIM) or a bmm's batch becomes 1 (a different op for the model)."""
        dims = {}
        for name, expr in self.dims.items():
            v = expr.subs(values)
            if not _is_static(v):
                return None
            dims[name] = int(v)
        if not all(1 <= v <= MAX_DIM for v in dims.values()):
            return None
        prob = replace(self.hint, **dims)
        return prob if (prob.batch > 1) == (self.hint.batch > 1) else None

    def with_dims(self, value: int) -> GemmProblem | None:
        """The problem with every symbolic dimension at `value` (Inductor's hint_override: multi_kernel_hints)."""
        try:
            prob = replace(self.hint, **{name: int(value) for name in self.dims})
        except ValueError:
            return None
        return prob if (prob.batch > 1) == (self.hint.batch > 1) else None

    def describe(self) -> str:
        """The symbolic dimension and its range ("M = s0 in [2, inf)", "M = 512*s0 in [1024, inf)") where one is
        symbolic, else the symbols and theirs ("s0 in [2, inf), s1 in [2, inf)"), as summary() shows them."""
        if self.dim_range is not None:
            (name, expr), (lo, hi) = next(iter(self.dims.items())), self.dim_range
            return f"{_DIM_NAMES[name]} = {expr} in [{lo}, {'inf)' if hi is None else f'{hi}]'}"
        parts = []
        for s in self.symbols:
            lo, hi = self.ranges[s]
            parts.append(f"{s} in [{lo}, {'inf)' if hi is None else f'{hi}]'}")
        return ", ".join(parts)


def symbolic_problem(kernel_inputs: Any, hint: GemmProblem) -> SymbolicProblem | None:
    """The SymbolicProblem of kernel_inputs (whose problem at the size hints is `hint`), or None where every size
    is static (or this torch's kernel inputs have no shapes_symbolic / mnk_symbolic: then the hint is all there is)."""
    shapes_symbolic = getattr(kernel_inputs, "shapes_symbolic", None)
    mnk_symbolic = getattr(kernel_inputs, "mnk_symbolic", None)
    if shapes_symbolic is None or mnk_symbolic is None:
        return None
    i1, _ = _operands(kernel_inputs)
    m, n, k = mnk_symbolic()
    dims = {"m": m, "n": n, "k": k}
    if hint.batch > 1 or len(shapes_symbolic()[i1]) == 3:
        dims["batch"] = shapes_symbolic()[i1][0]
    dims = {name: e for name, e in dims.items() if not _is_static(e)}
    if not dims:
        return None
    symbols = tuple(sorted({s for e in dims.values() for s in e.free_symbols}, key=str))
    return SymbolicProblem(hint=hint, dims=dims, symbols=symbols, hints={s: symbol_hint(s) for s in symbols},
                           ranges={s: symbol_range(s) for s in symbols},
                           dim_range=symbol_range(next(iter(dims.values()))) if len(dims) == 1 else None)


def _sizevars() -> Any:
    from torch._inductor.virtualized import V

    return V.graph.sizevars


def symbol_hint(symbol: Any) -> int:
    """Inductor's size hint of a symbol (sizevars.optimization_hint on torch 2.13, size_hint before)."""
    sizevars = _sizevars()
    read = getattr(sizevars, "optimization_hint", None) or sizevars.size_hint
    return int(read(symbol))


def symbol_range(symbol: Any) -> tuple[int, int | None]:
    """(lo, hi) of a symbol's (or a size expression's) value range in the compile's shape environment (hi None:
    unbounded), from shape_env.bound_sympy; Dynamo's default [2, inf) with one warning where this torch does not
    say."""
    try:
        vr = _sizevars().shape_env.bound_sympy(symbol)
        lo, hi = vr.lower, vr.upper
        lo = int(lo) if _is_static(lo) and math.isfinite(float(lo)) else DEFAULT_RANGE[0]
        hi = int(hi) if _is_static(hi) and math.isfinite(float(hi)) else None
        return max(lo, 1), hi
    except (AttributeError, TypeError, ValueError, RuntimeError, AssertionError) as exc:
        warn_once("range", f"cannot read the range of {symbol} from Inductor's shape environment ({type(exc).__name__}: "
                           f"{exc}); deciding for Dynamo's default range of a dynamic size, [2, inf)")
        return DEFAULT_RANGE


def bucket_values(lo: int, hi: int | None, hint: int, sizes: Sequence[int] | None) -> tuple[list[int], bool]:
    """The values a symbol of range [lo, hi] is scored at, and whether they are the user's: the sizes within the
    range when any is, else powers of two from lo up to hi (or up to max(RANGE_CAP, hint) when hi is None or larger),
    with lo, that top and the hint itself."""
    if sizes:
        own = sorted({int(v) for v in sizes if v >= lo and (hi is None or v <= hi)})
        if own:
            return own, True
    top = max(RANGE_CAP, hint) if hi is None else min(hi, max(RANGE_CAP, hint))
    vals = {lo, top, hint} | {2 ** i for i in range(0, top.bit_length()) if lo < 2 ** i < top}
    return sorted(v for v in vals if lo <= v <= max(top, hint)), False


def _thin(values: list[int], keep: set[int]) -> list[int]:
    """values with every other interior value dropped (the ends and `keep` stay)."""
    return [v for i, v in enumerate(values) if i in (0, len(values) - 1) or v in keep or i % 2 == 0]


def range_problems(sym: SymbolicProblem, sizes: Sequence[int] | None) -> tuple[list[GemmProblem], str]:
    """The problems a range decision scores (the hint's first), and what they cover, as summary() says it. Where one
    dimension is symbolic (a linear layer's M: the tokens a step, whatever symbols make it), each of its bucket
    values -- the sizes within its range, else powers of two across it: "M = s0 in [2, inf): M = 2, 4, ..., 4096
    (12 sizes)", "M = s0 in [2, inf): the given sizes M = 8, 32, 64". Where several are (attention's bmm), each
    assignment of the symbols' bucket values, at most MAX_BUCKETS: "s0 in [2, inf), s1 in [2, inf): s0 = ...; s1 =
    ..."."""
    if sym.dim_range is not None:
        name, hint_value = next(iter(sym.dims)), getattr(sym.hint, next(iter(sym.dims)))
        vals, own = bucket_values(*sym.dim_range, hint_value, sizes)
        problems = [sym.hint]
        for v in vals:
            p = sym.with_dims(v)
            if p is not None and p not in problems:
                problems.append(p)
        return problems, f"{sym.describe()}: {'the given sizes ' if own else ''}{_shown(_DIM_NAMES[name], vals)}"
    per_symbol, given = [], True
    for s in sym.symbols:
        vals, own = bucket_values(*sym.ranges[s], sym.hints[s], sizes)
        per_symbol.append(vals)
        given = given and own
    while math.prod(len(v) for v in per_symbol) > MAX_BUCKETS:
        longest = max(range(len(per_symbol)), key=lambda i: len(per_symbol[i]))
        thinner = _thin(per_symbol[longest], {sym.hints[sym.symbols[longest]]})
        if len(thinner) == len(per_symbol[longest]):
            break
        per_symbol[longest] = thinner
    problems = [sym.hint]
    for combo in itertools.product(*per_symbol):
        p = sym.at(dict(zip(sym.symbols, combo)))
        if p is not None and p not in problems:
            problems.append(p)
    shown = "; ".join(_shown(s, v) for s, v in zip(sym.symbols, per_symbol))
    return problems, f"{sym.describe()}: {'the given sizes ' if given else ''}{shown}"


def _shown(symbol: Any, values: list[int]) -> str:
    if len(values) <= 6:
        return f"{symbol} = {', '.join(map(str, values))}"
    return f"{symbol} = {values[0]}, {values[1]}, ..., {values[-1]} ({len(values)} sizes)"
