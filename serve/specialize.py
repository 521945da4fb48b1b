"""Compile sizes: a dynamic compile's listed batch sizes each get a compile of their own.

`compile(model, dynamic=True, sizes=[...], specialize=True)`: a call whose inputs' leading (batch) dimension is one of
`sizes` goes to a second torch.compile of the model -- the set-up with static decisions, that dimension marked static
(`torch._dynamo.mark_static`), the others as Dynamo's automatic dynamic shapes leave them (static until they vary) --
and every other call to the dynamic compile, whose GEMMs are decided over the range (serve/gemm_decisions.py). Dynamo
keeps one cache entry per listed size that is called (each with its own CUDA graphs) beside the dynamic one: its
cache entries are kept per backend, so the two compiles never pick up each other's graphs. What vLLM calls compile
sizes, dispatched in Python before Dynamo.

Not through Dynamo's own `mark_dynamic(t, 0, specialize_on=[...])` (torch 2.8 and later), which compiles a listed
size's graph lazily from the dynamic trace: on torch 2.11 that lazy compile fails on a graph that calls `.item()` on
a tensor (transformers' Llama rotary embedding reads `attention_scaling` so) with DataDependentOutputException,
under a masking "'NoneType' object has no attribute 'f_code'" (benchmarks/studies/compile_sizes_repro.py: plain
torch.compile fails the same way, CUDA graphs on or off; its log in benchmarks/results/serving_h200_runs/).

The leading dimension is the batch (decode: the sequences of a step). The listed sizes and the dynamic graph count
against Dynamo's recompile limit: it is raised to fit them (`ensure_recompile_limit`).
"""
from __future__ import annotations

from typing import Any, Sequence

# Cache entries beyond the listed sizes: the dynamic graph, a listed size's recompile when another dimension first
# varies (automatic dynamic shapes), and room for the user's own
EXTRA_ENTRIES = 4


def leading_size(args: Sequence[Any], kwargs: dict[str, Any]) -> int | None:
    """The leading dimension of the first tensor (with one) among args and kwargs' values, not nested; None if
    there is none."""
    import torch

    for t in (*args, *kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return None


def mark_static(args: Sequence[Any], kwargs: dict[str, Any], size: int) -> int:
    """Mark the leading dimension static on every tensor among args and kwargs' values (not nested) whose leading
    dimension is `size`; the count marked."""
    import torch

    n = 0
    for t in (*args, *kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == size:
            torch._dynamo.mark_static(t, 0)
            n += 1
    return n


def ensure_recompile_limit(n_sizes: int) -> int:
    """Raise Dynamo's per-frame recompile limit (recompile_limit; cache_size_limit on older torch) to hold the
    listed sizes' entries beside the dynamic one; never lowers it. The limit in force."""
    import torch._dynamo.config as dc

    name = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"
    want = n_sizes + EXTRA_ENTRIES
    if getattr(dc, name) < want:
        setattr(dc, name, want)
    return getattr(dc, name)


class Dispatch:
    """Routes a call to the per-size compile (its leading dimension listed) or the dynamic one."""

    def __init__(self, dynamic: Any, per_size: Any, sizes: Sequence[int]) -> None:
        self.dynamic, self.per_size, self.sizes = dynamic, per_size, frozenset(int(s) for s in sizes)
        self.calls = {"per_size": 0, "dynamic": 0}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = leading_size(args, kwargs)
        if b is not None and b in self.sizes:
            mark_static(args, kwargs, b)
            self.calls["per_size"] += 1
            return self.per_size(*args, **kwargs)
        self.calls["dynamic"] += 1
        return self.dynamic(*args, **kwargs)
