"""The problem network: one MLP on a GEMM problem's features (the "cublas" encoder) with torch.mm's time and
the cuBLAS-or-Triton calls as its outputs."""
from __future__ import annotations

from typing import Any

from .spec import HeadSpec, figure

# Its outputs, in column order (metadata PROBLEM_OUTPUTS_KEY names those a folder stores: a model without the
# inductor mode has no call_static): torch.mm's log ms (floored), then per kernel mode log(cuBLAS ms / the
# best Triton config's ms) -- below 0, cuBLAS wins (Candidates.prefer_cublas); only their score is served.
OUTPUTS = ("cublas", "call", "call_static")
PROBLEM_OUTPUTS_KEY = "problem_outputs"


def _has_before(m: dict[str, Any]) -> bool:
    return any(k.startswith("before/") for k in m) or any(
        any(k.startswith("before/") for k in d) for d in (m.get("by_device") or {}).values())


def cublas_card(meta: dict[str, Any]) -> str:
    """The card's line on torch.mm's time: the rows it was fitted on and its test errors per kind."""
    m = meta.get("cublas_head_metrics")
    if not m:
        return ""

    def errors(d: dict[str, Any]) -> str:
        def one(k: str) -> str:  # a head fitted in a build has no previous head to compare with
            was = d.get(f"before/{k}/test/mean_abs_log_err")
            return (f"{figure(was, 3)} -> " if was is not None else "") + figure(d[k + '/test/mean_abs_log_err'], 3)

        return "; ".join(f"{what} {one(k)}" for k, what in (("gemm", "GEMM problems"), ("cublas_only", "cuBLAS-only problems"),
                                                            ("pad_orig", "pad rows' unpadded problems"))
                         if f"{k}/test/mean_abs_log_err" in d)

    by = m.get("by_device") or {}
    n = sum(sum(d.get("rows", {}).values()) for d in by.values()) if by else sum(m.get("rows", {}).values())
    per = " ".join(f"{dev}: {errors(d)}." for dev, d in by.items()) if by else errors(m) + "."
    head = ("problem network's cuBLAS output (`perfmodel build --only problem`)" if PROBLEM_OUTPUTS_KEY in meta
            else "cuBLAS head (older layout: `perfmodel migrate`)")
    return (f"- {head}: fitted on {n} torch.mm times{f' of {len(by)} devices' if by else ''} "
            f"(GEMM problems, problems of every alignment class and layout timed for cuBLAS alone, pad rows' unpadded "
            f"times); mean |log error| on each kind's test rows{' (the head before it -> this one)' if _has_before(m) else ''}: "
            f"{per}\n")


def call_card(meta: dict[str, Any]) -> str:
    """The card's line on the cuBLAS-or-Triton calls."""
    m = meta.get("call_metrics")
    if not m:
        return ""

    def right(d: dict[str, Any]) -> str:
        parts = []
        for name, what in (("call", "`kernel=\"autotune\"`, against the dataset's times"),
                           ("call_static", "`kernel=\"inductor\"`, against the static times")):
            if f"{name}/test/choice_accuracy" in d:
                parts.append(f"{figure(d[name + '/test/choice_accuracy'], 3)} ({what}; the cuBLAS output against the "
                             f"gemm head's best: {figure(d[name + '/test/choice_accuracy_times'], 3)})")
        return f"{' and '.join(parts)} of the {d.get('call/test/problems', '-')} test problems"

    by = m.get("by_device") or {}
    where = "; ".join(f"{dev}: {right(d)}" for dev, d in by.items()) if by else right(m)
    head = ("problem network's call outputs (`perfmodel build --only problem`" if PROBLEM_OUTPUTS_KEY in meta
            else "cuBLAS call heads (older layout: `perfmodel migrate`")
    return (f"- {head}; `prefer_cublas`): the call whether cuBLAS beats the best Triton config is right on {where}.\n")


PROBLEM = HeadSpec(
    name="problem", encoder="cublas", outputs=OUTPUTS, floors=("log_roofline_ms", "", ""),
    outputs_key=PROBLEM_OUTPUTS_KEY,
    targets="torch.mm's log ms on every torch.mm time of the dataset (GEMM, cublas_only and pad rows' unpadded "
            "times); per kernel mode log(cuBLAS ms / the best Triton config's ms) of each GEMM problem",
    step="problem", card=lambda meta: cublas_card(meta) + call_card(meta))
