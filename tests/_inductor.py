"""Stand-ins for the parts of Inductor's KernelTemplateChoice and MMKernelInputs that the hooks read (SYNTHETIC:
no GPU, no compile), shared by the hook tests."""
from __future__ import annotations

from types import SimpleNamespace

import torch


def choice(uid: str, cfg=None, tf32: bool = False, **hint):
    """A KernelTemplateChoice: template.uid, params.to_kwargs() as Inductor's mm heuristics give them for a Triton
    config (cfg: a GemmConfig; hint_override=h as multi_kernel_hints tags them), and extra_kwargs' ALLOW_TF32."""
    kw = {} if cfg is None else {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                                 "GROUP_M": cfg.group_m, "num_stages": cfg.num_stages, "num_warps": cfg.num_warps,
                                 "EVEN_K": True, "ACC_TYPE": "tl.float32", **hint}
    return SimpleNamespace(template=SimpleNamespace(uid=uid), params=SimpleNamespace(to_kwargs=lambda: dict(kw)),
                           extra_kwargs={"ALLOW_TF32": tf32})


class MMInputs:
    """MMKernelInputs of an mm: nodes (mat1 [m, k] row-major, mat2 [k, n], column-major where b_col_major)."""

    def __init__(self, m: int, n: int, k: int, dtype=torch.float16, b_col_major: bool = False) -> None:
        self.m, self.n, self.k, self.dtype_ = m, n, k, dtype
        self.b_col_major = b_col_major
        self._mat1_idx, self._mat2_idx = 0, 1

    def nodes(self) -> list:
        return [object(), object()]

    def shapes_hinted(self):
        return ((self.m, self.k), (self.k, self.n))

    def strides_hinted(self):
        return ((self.k, 1), (1, self.k) if self.b_col_major else (self.n, 1))

    def mnk_hinted(self):
        return self.m, self.n, self.k

    def dtypes(self):
        return (self.dtype_, self.dtype_)


class SymbolicMMInputs(MMInputs):
    """MMKernelInputs of a dynamic compile's mm: m a sympy expression (say sympy.Symbol("s0")), n and k ints, the
    shapes hinted at `hints` ({symbol: int}, Inductor's size hints), as Inductor's kernel inputs give them
    (shapes_symbolic, mnk_symbolic next to the hinted ones). Use under shape_env(...), which answers the ranges."""

    def __init__(self, m, n: int, k: int, hints: dict, dtype=torch.float16, b_col_major: bool = False) -> None:
        self.m_expr, self.hints = m, dict(hints)
        super().__init__(int(m.subs(hints)), n, k, dtype, b_col_major)

    def shapes_symbolic(self):
        return ((self.m_expr, self.k), (self.k, self.n))

    def mnk_symbolic(self):
        return self.m_expr, self.n, self.k


class _SizeVars:
    def __init__(self, ranges: dict, hints: dict) -> None:
        from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy
        from torch.utils._sympy.numbers import int_oo

        self.hints = hints
        vr = {s: ValueRanges(lo, int_oo if hi is None else hi) for s, (lo, hi) in ranges.items()}
        self.shape_env = SimpleNamespace(bound_sympy=lambda expr: bound_sympy(expr, {s: vr.get(s) for s in
                                                                                      expr.free_symbols}))

    def optimization_hint(self, expr) -> int:
        return int(expr.subs(self.hints))


def shape_env(ranges: dict, hints: dict):
    """A context in which Inductor's V.graph answers what the handler asks of a dynamic compile: each symbol's value
    range (ranges: {symbol: (lo, hi or None)}, through the real bound_sympy) and size hint (SYNTHETIC graph)."""
    from torch._inductor.virtualized import V

    return V.set_graph_handler(SimpleNamespace(sizevars=_SizeVars(ranges, hints)))
