"""The speed heads on (problem, Triton config) rows: the gemm head and its student."""
from __future__ import annotations

from typing import Any

from .spec import HeadSpec, figure

# The config network (docs/model.md, "The config network"): a gemm head with one input more, the kernel mode
# (metadata KERNEL_MODE_INPUT: {mode: the input's value}), trained on the dataset's rows (autotune) and the
# static rows (inductor) together. The folder stores it once, as "gemm"; a loaded bundle serves it as two heads
# of the gemm encoder's features, each with the mode held at its value (PerfMLP.with_input): "gemm"
# (kernel="autotune") and INDUCTOR_GEMM (kernel="inductor").
KERNEL_MODE_INPUT = "kernel_mode_input"
KERNEL_MODE_FEATURE = "kernel_mode"
KERNEL_MODE_VALUES = {"autotune": 0.0, "inductor": 1.0}   # the kernel-mode input's values, as trained
INDUCTOR_GEMM = "gemm_inductor"


def inductor_card(meta: dict[str, Any]) -> str:
    """The card's line on kernel="inductor": the config network's figures (or a static head's, in a folder
    written before the config network; a figure its test problems have no rows for, as a small slice's,
    written "-")."""
    m = meta.get("static_metrics")
    if not m and meta.get("inductor_metrics"):  # the inductor head's line says how kernel="inductor" is served
        return ""
    if not m:
        return "- No static head: the model predicts `kernel=\"autotune\"` only.\n"

    def f(mode: str, key: str) -> str:
        return figure(m.get(f"test_static/{mode}/{key}"), 3)

    def top1(mode: str) -> str:
        return " / ".join(f(mode, f"{d}/top1_eff") for d in ("float16", "bfloat16", "fp32_all"))

    if m.get("source") == "config_net":
        return (f"- Config network (the gemm head with a kernel-mode input, trained on the dataset's rows and "
                f"{m['problems/train']} train problems' static rows; `kernel=\"inductor\"`, the kernel as Inductor "
                f"compiles it): on the {m['test_static/problems']} test problems timed statically, the ranking's top-1 "
                f"fp16 / bf16 / fp32 {top1('static_head')} in the inductor mode (the autotune mode "
                f"{top1('without')}), top-5 {f('static_head', 'all/top5_eff')}.\n")
    return (f"- Static head (`kernel=\"inductor\"`, the kernel as Inductor compiles it): on "
            f"the {m['test_static/problems']} test problems timed statically, the ranking's top-1 fp16 / bf16 / fp32 "
            f"{top1('static_head')} (without the head {top1('without')}), top-5 {f('static_head', 'all/top5_eff')}; "
            f"fitted on {m['problems/train']} train problems' static rows.\n")


def student_card(meta: dict[str, Any]) -> str:
    """The card's line on the student head (the screen of rank's fast path, rank(..., screened=True)); predict and
    rank serve the gemm head on every config (docs/design.md, "One answer per question")."""
    m = meta.get("student_metrics")
    if not m:
        return "- No student head: `predict` and `rank` run the gemm head.\n"
    role = ("what screens `rank(..., screened=True)`, the fast path; `predict` and `rank` run the gemm head"
            if meta.get("screen_head") == "student" else "not served: `predict` and `rank` run the gemm head")
    # a gemm head of one member has no spread around its members' mean to compare with: no clause
    spread = m.get("gemm/member_spread_median")
    spread = "" if spread is None else f"; the gemm head's own members, around their mean: {figure(spread, 4)}"
    by = meta.get("student_metrics_by_device") or {}
    per = "" if len(by) < 2 else (" (" + "; ".join(f"{dev}: median {figure(d['student/median_abs_log_diff'], 4)}"
                                                  for dev, d in by.items())
                                  + ", each device's test problems, its own features)")
    return (f"- Student head ({role}): one MLP distilled from the gemm "
            f"head by `perfmodel build --only student`. On the test problems' whole config spaces its log ms are a "
            f"median {figure(m['student/median_abs_log_diff'], 4)} from the gemm head's (90th percentile "
            f"{figure(m['student/p90_abs_log_diff'], 4)}){spread}{per}.\n")


GEMM = HeadSpec(
    name="gemm", encoder="gemm", outputs=("log_ms",), floors=("log_roofline_ms",), required=True,
    targets="log ms of every (problem, Triton config) row of the dataset (with mode_input: and of its static rows), "
            "with a within-problem ranking term",
    step="train", mode_input=KERNEL_MODE_FEATURE, mode_key=KERNEL_MODE_INPUT, card=inductor_card)

STUDENT = HeadSpec(
    name="student", encoder="gemm", outputs=("log_ms",), floors=("log_roofline_ms",),
    targets="the gemm head's log ms on the training problems' whole config spaces and random problems "
            "(distillation); it serves predict and screens rank",
    step="student", card=student_card)
