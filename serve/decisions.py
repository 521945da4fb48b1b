"""The serving decisions, once: cuBLAS or Triton, pad or not, and the padded path's time.

The Predictor (Candidates.prefer_cublas, prefers_cublas_many, predict_cublas, pad), the Inductor hook
(perfmodel.serve.inductor: its cublas_margin and its pad_mm replacement), the whole-model set-up
(perfmodel.serve.compile) and the Triton autotuner hook (perfmodel.serve.triton_hook: which ranked configs it
keeps) call these functions; none of them decides on its own.

One cuBLAS time and one call (docs/design.md, "One answer per question"). cuBLAS's predicted time is
`cublas_time` (Predictor.predict_cublas): with the model's call head for the kernel mode (fitted to log(cuBLAS
ms / best Triton ms)) and a problem of the shapes it was fitted on, the cuBLAS head's time where it agrees with
the call -- below the best predicted Triton time of the whole config space exactly where the call is below 0
-- and the time the call implies where it does not (`implied_cublas_ms`: that best time x exp(the call),
floored at the roofline); otherwise the cuBLAS head's time. aten::bmm's is the time its call implies
(perfmodel.serve.bmm). Every rule below weighs that time against the predicted Triton times, so what the CLI
prints, the API answers and the hooks decide agree:

- the call (`cublas_preferred`): is cuBLAS faster than the best Triton config? Its time below the best
  config's (Candidates.prefer_cublas, Predictor.prefers_cublas_many, the `perfmodel rank` verdict). Over the
  whole space that is the call head's call (below 0: cuBLAS), right on more held-out problems than the
  cuBLAS head's time against the best config's (0.948 against 0.925 on models/h100's test problems), with
  the cuBLAS head's more accurate times wherever the two agree (benchmarks/studies/cublas_call_rules.py); against a
  list of configs it is also wherever cuBLAS beats the list's best.
- the hook's trade (`triton_dropped`, install(cublas_margin=...)): is Triton worth compiling and
  benchmarking? cuBLAS's time x (1 + margin) against the best ranked config among those Inductor offers,
  with a margin tuned for compile time against kernel time (benchmarks/studies/cublas_margin.py).
- the whole-model set-up's trade (`triton_expected_gain`, perfmodel.serve.compile): keep Triton beside
  default mode's aten kernel only where the best ranked config is predicted at least `gain` faster than
  cuBLAS; elsewhere the GEMM lowers as default mode lowers it, with no benchmark.
- a bmm the model is sure of (`bmm_sure`, both hooks): where aten::bmm's time is at least `sure_gain` slower
  than the best ranked config's, that config is kept alone -- no aten choice, so Inductor has one choice and
  benchmarks nothing (BMM_SURE_GAIN).

Imports neither Lightning, nor MLflow, nor pandas.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from perfmodel.schema import DTYPE_BYTES, GemmConfig, PadDecision, PadProblem

if TYPE_CHECKING:  # the Predictor calls this module: no import cycle at run time
    from .predictor import Predictor

__all__ = ["BMM_SURE_GAIN", "CUBLAS_MARGIN", "PAD_TRITON_MARGIN", "bmm_sure", "check_bmm_sure_gain",
           "cublas_preferred", "cublas_time", "gain_from_margin", "hook_pad_decision", "implied_cublas_ms",
           "kept_positions", "pad_copy_floor_ms", "pad_decision", "padded_path_ms", "triton_dropped",
           "triton_expected_gain", "unpadded_triton_instead"]

# install()'s default cublas_margin: keep the Triton mm choices only where the model's best config is
# predicted more than 5 % faster than cuBLAS. benchmarks/studies/cublas_margin.py on the 173 held-out problems:
# Triton is kept (and compiled and benchmarked) on 16 % of H100 problems (20 % at margin 0, 26 % at 0.1),
# and the chosen kernel is 1.0058x the best measured (1.0041x at 0, 1.0019x at 0.1; docs/benchmarks.md).
# On the 12 shapes of benchmarks/inductor_bench.py (H200) it cut the GEMM tuning from 8.9 s (margin 0) to
# 2.8 s with every shape's kernel within 1 % of stock's time or faster.
CUBLAS_MARGIN = -0.05

# Both hooks keep a bmm's best ranked Triton config alone (no aten::bmm beside it, nothing benchmarked) where
# the aten::bmm time the model's call implies is at least this fraction slower than that config's predicted
# time. Chosen on the val problems of models/h100's bmm split (benchmarks/studies/bmm_sure_gain.py): the smallest gain
# (of 0, 0.05, ..., 0.5) at which the configs used alone are, against the better of them and aten::bmm as
# measured, a geomean 1.002 or less and nowhere more than 1.15x slower. docs/benchmarks.md has the
# figures of each gain on the val and test problems.
BMM_SURE_GAIN = 0.2

# How much faster than padded cuBLAS the model's best unpadded Triton config must be predicted before the
# hook leaves an mm unpadded. The two paths cannot both be benchmarked (padding rewrites the graph before
# autotuning), and they are not symmetric: a padded mm still autotunes Triton on the padded shape beside
# cuBLAS, an unpadded one leaves cuBLAS on a misaligned shape -- so the unpadded path has to win clearly.
# Set on GPT-2's lm head in NN layout (N = 50257, a row stride the sweep never timed at that width), one of
# inductor_bench's shapes: on the H100 and H200 it was predicted 0.256 ms unpadded Triton vs 0.273 ms
# padded and ran 0.38 ms vs stock's padded cuBLAS 0.17-0.20 ms.
PAD_TRITON_MARGIN = 0.1


# ----------------------------------------------------------------------------------- cuBLAS or Triton
def implied_cublas_ms(best_space_ms: Any, call_score: Any, roofline_ms: Any) -> Any:
    """cuBLAS's (aten::bmm's) predicted time where the model has a call head: the best predicted Triton time
    over the whole config space x exp(the call head's output, log(cuBLAS ms / best Triton ms)), floored at the
    problem's roofline. Below best_space_ms exactly where the call is below 0 (cuBLAS wins), unless the
    floor lifts it: a Triton time at the roofline is not beaten. Floats or arrays (float64)."""
    return np.maximum(np.asarray(best_space_ms, dtype=np.float64) * np.exp(np.asarray(call_score, dtype=np.float64)),
                      roofline_ms)


def cublas_time(head_ms: Any, best_space_ms: Any, call_score: Any, roofline_ms: Any) -> Any:
    """The one cuBLAS time of a problem the call head covers: the cuBLAS head's time (head_ms) where it agrees
    with the call -- below the whole space's best predicted Triton time (best_space_ms) exactly where the call
    is below 0 -- else the call's implied time (implied_cublas_ms). So cuBLAS is below best_space_ms exactly
    where the call says it wins (but at the floor), and its time is the head's wherever the head says so too.
    Floats or arrays (float64)."""
    head = np.asarray(head_ms, dtype=np.float64)
    agree = (head < best_space_ms) == (np.asarray(call_score) < 0.0)
    return np.where(agree, head, implied_cublas_ms(best_space_ms, call_score, roofline_ms))


def cublas_preferred(cublas_ms: Any, best_ms: Any) -> Any:
    """The call: whether cuBLAS is predicted faster than the best Triton config -- its predicted time
    (Predictor.predict_cublas: cublas_time with a call head) below best_ms, the best Triton config's
    predicted time (of the whole space, or of the configs given). bool, or a bool array for arrays."""
    return cublas_ms < best_ms


def triton_dropped(cublas_ms: float, best_triton_ms: float, margin: float | None) -> bool:
    """The hook's cublas_margin, said as a drop: Triton's choices go when cuBLAS's predicted time
    (Predictor.predict_cublas, the one cuBLAS time) x (1 + margin) is below the best ranked (offered) config's;
    never with margin None. The handler applies it as the one rule, triton_expected_gain with
    gain_from_margin(margin)."""
    return margin is not None and cublas_ms * (1.0 + margin) < best_triton_ms


def gain_from_margin(margin: float) -> float:
    """The hook's cublas_margin m as the set-up's triton_gain g: Triton kept where best <= cuBLAS x (1 + m), i.e.
    best x (1 / (1 + m)) <= cuBLAS: g = -m / (1 + m) (m = -0.05: g = 0.0526..., Triton predicted more than 5 %
    faster; m = 0: g = 0, the same rule). The two agree but where the rounding of the product differs in the
    last bit, a tie no predicted time meets in practice."""
    return -margin / (1.0 + margin)


def triton_expected_gain(cublas_ms: float | None, best_triton_ms: float, gain: float) -> bool:
    """The whole-model set-up's rule (perfmodel.serve.compile.Policy.triton_gain): keep Triton where the
    best ranked config's predicted time x (1 + gain) is at most cuBLAS's; never with gain inf, never for an
    unrunnable best (inf). Without a cuBLAS head (cublas_ms None) Triton is kept only for gain <= 0."""
    if math.isinf(gain) or math.isinf(best_triton_ms):
        return False
    if cublas_ms is None:
        return gain <= 0.0
    return best_triton_ms * (1.0 + gain) <= cublas_ms


def bmm_sure(aten_ms: float | None, best_triton_ms: float, sure_gain: float | None) -> bool:
    """Both hooks' rule for a bmm (BMM_SURE_GAIN): keep the best ranked config alone -- no aten choice, no
    benchmark -- where the aten::bmm time the model's call implies is at least (1 + sure_gain) x that
    config's predicted time; never with sure_gain None, no aten time, or an unrunnable best (inf)."""
    if sure_gain is None or aten_ms is None or math.isinf(best_triton_ms):
        return False
    return aten_ms >= best_triton_ms * (1.0 + sure_gain)


def check_bmm_sure_gain(value: Any) -> float | None:
    """value, or ValueError naming bmm_sure_gain unless it is None or a number >= 0 (inf: never)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0.0):
        raise ValueError(f"bmm_sure_gain: expected None or a number >= 0, got {value!r}")
    return value


def kept_positions(order: Sequence[tuple[int, float]]) -> list[int]:
    """The positions a Triton hook keeps of a ranking [(position, predicted ms)], fastest first: the
    configs the device can run (finite ms); all of them only when none can (the autotuner then reports
    the failure itself)."""
    runnable = [i for i, ms in order if math.isfinite(ms)]
    return runnable or [i for i, _ in order]


# ------------------------------------------------------------------------------------- pad or not
def pad_decision(orig_ms: float, padded_ms: float, threshold: float, needs_padding: bool) -> PadDecision:
    """Predictor.pad's rule (Inductor's pad_mm decision): pad when padded_ms * threshold < orig_ms. A
    problem already aligned is never padded (its padded_ms is its orig_ms)."""
    if not needs_padding:
        return PadDecision(should_pad=False, orig_ms=orig_ms, padded_ms=orig_ms)
    return PadDecision(should_pad=padded_ms * threshold < orig_ms, orig_ms=orig_ms, padded_ms=padded_ms)


def pad_copy_floor_ms(pp: PadProblem, dram_bw_gbs: float) -> float:
    """The least time the pad copies of pp can take: each padded operand (not prepadded) read once and
    written once at its padded size, at DRAM bandwidth."""
    mp, kp, np_ = pp.padded_dims()
    elems = 0
    if (mp, kp) != (pp.m, pp.k) and not pp.prepadded_left:
        elems += pp.m * pp.k + mp * kp
    if (kp, np_) != (pp.k, pp.n) and not pp.prepadded_right:
        elems += pp.k * pp.n + kp * np_
    return elems * DTYPE_BYTES[pp.dtype] / (dram_bw_gbs * 1e6)


def padded_path_ms(predictor: "Predictor", pp: PadProblem, decision: PadDecision) -> float:
    """The padded cuBLAS path's predicted time as Inductor runs it: the pad head's padded_ms or, where the
    model has a cuBLAS head, cuBLAS's predicted time on the padded problem (Predictor.predict_cublas) plus the
    pad copies at DRAM bandwidth (pad_copy_floor_ms), whichever is less. The pad head learned from padding timed with eager F.pad;
    Inductor pads each operand with one generated kernel. GPT-2's lm head (1024x768x50257 fp16, NN) on
    the H100: pad head 0.273 ms, cuBLAS head 0.138 + copies 0.046 = 0.184 ms; Inductor's padded path ran
    0.193 ms."""
    if not getattr(predictor, "has_cublas", False):
        return decision.padded_ms
    est = predictor.predict_cublas(pp.gemm(padded=True)) + pad_copy_floor_ms(pp, predictor.spec.dram_bw_gbs)
    return min(decision.padded_ms, est)


def unpadded_triton_instead(predictor: "Predictor", pp: PadProblem, decision: PadDecision,
                            configs: Sequence[GemmConfig] | None = None,
                            margin: float = PAD_TRITON_MARGIN) -> PadDecision:
    """The pad decision when Triton templates compete with cuBLAS: padding helps cuBLAS, which wants
    aligned operands, but the Triton template runs the unaligned shape as it is (masked loads). When the
    model's best Triton config on the unpadded problem beats padded cuBLAS (copies included) by more than
    `margin` (a fraction), padding would only slow the winner down: do not pad, and let autotuning pick
    Triton on the original shape.
    configs: the Triton configs autotuning will offer (None: the whole space). Comparing with configs
    that are not offered kept GPT-2's 50257-wide lm head unpadded under the DEFAULT space on the H100,
    where Inductor's best offered Triton config ran 0.385 ms and stock's padded cuBLAS 0.197 ms."""
    best = predictor.rank(pp.gemm(padded=False), configs, top_k=1)
    if best and best[0][1] * (1.0 + margin) < padded_path_ms(predictor, pp, decision):
        return replace(decision, should_pad=False)
    return decision


def hook_pad_decision(predictor: "Predictor", pp: PadProblem, triton_in_play: bool,
                      configs: Sequence[GemmConfig] | None = None) -> PadDecision:
    """The Inductor pad hook's decision for an mm that needs padding: Predictor.pad, then, when the
    compile autotunes Triton mm templates (configs: those it offers, None the whole space), left unpadded
    where the best unpadded Triton config wins clearly (unpadded_triton_instead)."""
    decision = predictor.pad(pp)
    if decision.should_pad and triton_in_play:
        decision = unpadded_triton_instead(predictor, pp, decision, configs)
    return decision
