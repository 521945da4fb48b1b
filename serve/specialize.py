"""Compile sizes: a dynamic compile's listed batch sizes each get a compile of their own.

`compile(model, dynamic=True, sizes=[...])` decides the GEMMs of symbolic size over the range (serve/gemm_decisions.py);
one kernel for every size still runs the non-GEMM kernels (and the GEMMs) compiled for a symbolic size. With
`specialize=True` (opt-in) every call marks its tensor inputs' leading dimension dynamic with one predicate per
listed size (`torch._dynamo.mark_dynamic(t, 0, specialize_on=[...])`, torch 2.8 and later): Dynamo traces once and,
the first time a call's leading dimension equals a listed size, Inductor compiles the graph for that size as a static
one (the set-up's static decisions, its kernels specialised), dispatched to at run time -- what vLLM calls compile
sizes. Other sizes run the dynamic graph. A torch without `specialize_on` gets the dynamic graph alone.

The leading dimension is the batch (decode: the tokens a step). A size-1 leading dimension is never marked: Dynamo
specialises size 1 itself.

Opt-in, because of what was measured: on the CPU (torch 2.13) the listed sizes compile and dispatch as intended
(tests/test_compile_sizes.py); in the one whole-model run on an H200 (torch 2.11, Llama-3-8B and Qwen2-7B widths,
benchmarks/results/serving_h200_runs/i46c_mb0.log) the first call at a listed size failed inside Dynamo's
specialised dispatch ("'NoneType' object has no attribute 'f_code'": its handler of a backend error reads the
finished trace's frame, so the backend's own error is not shown). Until that error is seen and fixed, the
dynamic set-up's default is the range decision alone.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

MARK = "_perfmodel_compile_sizes"  # set on a tensor once marked (a tensor is marked once)


def supported() -> bool:
    """Whether this torch's mark_dynamic takes specialize_on."""
    import torch

    try:
        return "specialize_on" in inspect.signature(torch._dynamo.mark_dynamic).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def _equals(size: int) -> Callable[[int], bool]:
    return lambda x: x == size  # Dynamo reads a predicate's source (inspect.getsource) for its guard


def predicates(sizes: Sequence[int]) -> list[Callable[[int], bool]]:
    return [_equals(int(s)) for s in sizes]


def mark(args: Sequence[Any], kwargs: dict[str, Any], sizes: Sequence[int]) -> int:
    """Mark the leading dimension of every tensor among args and kwargs' values (not nested) dynamic with one
    specialisation per size; tensors with a leading dimension of 0 or 1, or marked before, are left. The count
    marked."""
    import torch

    n = 0
    for t in (*args, *kwargs.values()):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] <= 1 or getattr(t, MARK, None):
            continue
        torch._dynamo.mark_dynamic(t, 0, specialize_on=predicates(sizes))
        setattr(t, MARK, tuple(sizes))
        n += 1
    return n
