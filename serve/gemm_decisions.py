"""One GEMM's decision with the model -- keep Triton (which configs) or aten -- for a static problem, over the range
of a symbolic one, or per hint of Inductor's multi_kernel_hints. The choices handler (perfmodel.serve.choices) asks
it; the rules themselves (triton_expected_gain, bmm_sure) are perfmodel.serve.decisions'.

Symbolic sizes (a dynamic compile): Inductor compiles ONE kernel for every size the graph serves, and benchmarks its
choices at the size hint only (the first compile's sizes). So a Triton config is kept only where the model predicts
it no slower than aten (the same rule, the same gain) at every size of the range -- the user's sizes within the
symbol's range, else powers of two across it (perfmodel.serve.kernel_inputs.range_problems) -- and the kept ones
are ordered by their geometric-mean time relative to aten over those sizes. Inductor's benchmark at the hint then
picks among them and aten: whichever it picks is, as predicted, no worse than aten anywhere in the range.

With torch's multi_kernel_hints (torch 2.13 has it, under benchmark_epilogue_fusion: the Triton configs come once
per hint, each tagged with its hint_override, and a Triton winner is compiled once per hint and dispatched at run
time by the nearest hint), each hint's configs are decided at that hint (every symbolic dimension at the hint, as
Inductor benchmarks them); Triton is kept only where every hint keeps it (the dispatch needs a Triton kernel for
every hint once Triton wins at the size hint), else aten alone. A torch without it never tags configs: the range
decision above.

The kernel mode of a symbolic problem: the predictor's own (the set-up's and the hook's: "inductor" where the model
has it) unless Policy.range_kernel says otherwise. With M symbolic, Inductor's template takes M as a run-time
argument but keeps N, K and the strides constants -- the constants are what set the two modes' rankings apart on
the shapes where they differ (docs/design.md, "Kernel modes"); M enters through the grid and the row masks alike
in both. Not measured on a GPU.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from perfmodel.configs import inductor_default_configs
from perfmodel.schema import GemmConfig, GemmProblem

from . import bmm
from .decisions import bmm_sure, triton_expected_gain
from .kernel_inputs import SymbolicProblem, range_problems

if TYPE_CHECKING:
    from .choices import Policy
    from .predictor import Predictor


def kept(aten_ms: float | None, best_ms: float, gain: float | None, batched: bool = False) -> bool:
    """The one rule (decisions.triton_expected_gain): Triton kept where best_ms x (1 + gain) <= aten_ms; always
    with gain None (no comparison asked); a bmm without an aten time is not kept (its aten time is the call's)."""
    if gain is None:
        return True
    if batched and aten_ms is None:
        return False
    return triton_expected_gain(aten_ms, best_ms, gain)


def sure(aten_ms: float | None, best_ms: float, sure_gain: float | None) -> bool:
    """decisions.bmm_sure: a bmm's best config kept alone, without aten."""
    return bmm_sure(aten_ms, best_ms, sure_gain)


def rank_positions(predictor: "Predictor", prob: GemmProblem, cfgs: Sequence[GemmConfig],
                   top_k: int) -> list[tuple[int, float]]:
    """Predictor.rank's top_k of cfgs -- the project's one ranking rule (the gemm head on every config, predict's
    times; unrunnable configs last at inf) -- as (position in cfgs, predicted ms), fastest first. A config
    listed twice is two positions."""
    where: dict[GemmConfig, list[int]] = {}
    for i, c in enumerate(cfgs):
        where.setdefault(c, []).append(i)
    return [(where[c].pop(0), ms) for c, ms in predictor.rank(prob, cfgs, top_k=top_k)]


def aten_times(predictor: "Predictor", problems: Sequence[GemmProblem], best_ms: Sequence[float]) -> np.ndarray | None:
    """aten's predicted ms per problem (1-D), or None where the model has none: Predictor.predict_cublas_many, the
    one cuBLAS time the API and the CLI show (perfmodel.serve.decisions.cublas_time) for an mm; for a bmm,
    aten::bmm's (the time the model's call implies against the whole bmm space's best: bmm.aten_call_ms; None where
    the model has no aten time or a problem's best ranked config, best_ms, is unrunnable)."""
    if problems[0].batch > 1:
        if not bmm.has_aten(predictor) or not all(math.isfinite(b) for b in best_ms):
            return None
        return np.array([bmm.aten_call_ms(predictor, p) for p in problems])
    return predictor.predict_cublas_many(list(problems)) if predictor.has_cublas else None


def decide(predictor: "Predictor", prob: GemmProblem, configs: Sequence[GemmConfig] | None,
           policy: "Policy") -> tuple[bool, list[tuple[int, float]], float | None]:
    """(keep Triton, the top k (position in configs, predicted ms), aten's predicted ms) for one static GEMM.
    configs: the Triton configs Inductor offers (None: Inductor's default list). aten's time: aten_times (the
    model's one cuBLAS time, Predictor.predict_cublas; None without a cuBLAS head), for a bmm aten::bmm's."""
    cfgs = list(configs) if configs is not None else list(inductor_default_configs())
    best = rank_positions(predictor, prob, cfgs, policy.k_for(prob)) if cfgs else []
    if not best:
        return False, [], None
    aten = aten_times(predictor, [prob], [best[0][1]])
    aten_ms = None if aten is None else float(aten[0])
    return kept(aten_ms, best[0][1], policy.triton_gain, prob.batch > 1), best, aten_ms


def kept_alone(prob: GemmProblem, keep: bool, best: list[tuple[int, float]], aten_ms: float | None,
               policy: "Policy") -> bool:
    """Whether a decision of decide() (keep, best, aten_ms) keeps a bmm's best config alone, without aten
    (Policy.bmm_sure_gain, decisions.bmm_sure): then nothing is benchmarked."""
    return keep and prob.batch > 1 and sure(aten_ms, best[0][1], policy.bmm_sure_gain)


def decide_range(predictor: "Predictor", problems: Sequence[GemmProblem], configs: Sequence[GemmConfig],
                 policy: "Policy") -> tuple[bool, list[tuple[int, float]], float | None, bool]:
    """(keep Triton, the kept (position in configs, predicted ms at problems[0]), aten's ms at problems[0], a bmm's
    config kept alone) for ONE kernel serving every problem (problems[0]: the size hint's). A config is kept only
    where the rule keeps it at every problem; the kept ones by their geometric-mean time relative to aten (ties in
    the given order), the policy's top k of them (none kept: the top k of the runnable ones, for the record).
    Alone (a bmm) only where the model is sure at every problem."""
    if policy.range_kernel is not None:
        predictor = predictor.with_kernel(policy.range_kernel)
    uniq = list(dict.fromkeys(configs))
    ranked = predictor.rank_many(list(problems), uniq, top_k=len(uniq))
    times = np.array([[dict(r)[c] for c in uniq] for r in ranked])              # (problems, configs) ms
    best = times.min(axis=1)
    aten = aten_times(predictor, problems, best)
    gain, batched = policy.triton_gain, problems[0].batch > 1
    finite = np.isfinite(times).all(axis=0)
    if gain is None:
        ok = finite
    elif aten is None:
        ok = finite & (not batched and triton_expected_gain(None, 1.0, gain))
    else:
        ok = finite & (not math.isinf(gain)) & (times * (1.0 + gain) <= aten[:, None]).all(axis=0)
    with np.errstate(invalid="ignore"):
        rel = np.log(times / (aten[:, None] if aten is not None else 1.0)).mean(axis=0)
    keep = bool(ok.any())
    pool = ok if keep else finite  # not kept: the configs the summary shows (the best over the range)
    order = [c for c in np.argsort(np.where(pool, rel, np.inf), kind="stable") if pool[c]][: policy.k_for(problems[0])]
    where = {c: i for i, c in reversed(list(enumerate(configs)))}
    kept_list = [(where[uniq[c]], float(times[0, c])) for c in order]
    alone = keep and batched and aten is not None and policy.bmm_sure_gain is not None and all(
        bmm_sure(float(a), float(t), policy.bmm_sure_gain) for a, t in zip(aten, times[:, order[0]]))
    return keep, kept_list[:1] if alone else kept_list, None if aten is None else float(aten[0]), alone


def _per_hint(predictor: "Predictor", prob: GemmProblem, sym: SymbolicProblem | None, cfgs: list[GemmConfig],
              hints: list[Any], policy: "Policy") -> tuple[bool, list[tuple[int, float]], float | None, bool, str]:
    """multi_kernel_hints: each hint's configs decided at that hint (the size hint's at prob); Triton only where
    every hint keeps it."""
    groups: dict[Any, list[int]] = {}
    for j, h in enumerate(hints):
        groups.setdefault(h, []).append(j)
    keep_all, best, aten_hint = True, [], None
    for h, idx in groups.items():
        at = prob if h is None or sym is None else sym.with_dims(int(h))
        if at is None:
            raise ValueError(f"hint_override: {h} is outside the model's domain for {prob}")
        keep, top, aten = decide(predictor, at, [cfgs[j] for j in idx], policy)
        keep_all = keep_all and keep
        best += [(idx[j], ms) for j, ms in top]
        aten_hint = aten if h is None else aten_hint
    shown = ", ".join(str(h) for h in groups if h is not None)
    covers = f"{sym.describe() if sym is not None else 'static'}: one kernel per hint {shown} (multi_kernel_hints)"
    return keep_all, best if keep_all else [], aten_hint, False, covers


def decide_call(predictor: "Predictor", prob: GemmProblem, sym: SymbolicProblem | None, cfgs: list[GemmConfig],
                hints: list[Any], policy: "Policy", sizes: Sequence[int] | None
                ) -> tuple[bool, list[tuple[int, float]], float | None, bool, str | None]:
    """The decision for one call's Triton configs cfgs (each with its hint_override, None without
    multi_kernel_hints): (keep Triton, the kept (position in cfgs -- in Inductor's default list where cfgs is
    empty --, predicted ms), aten's ms, a bmm's config kept alone, the range covered or None for a static
    problem). ValueError for a problem the model does not cover."""
    if len(set(hints)) > 1:
        return _per_hint(predictor, prob, sym, cfgs, hints, policy)
    if sym is None:
        keep, best, aten = decide(predictor, prob, cfgs or None, policy)
        alone = kept_alone(prob, keep, best, aten, policy)
        return keep, best[:1] if alone else best, aten, alone, None
    problems, covers = range_problems(sym, sizes)
    keep, best, aten, alone = decide_range(predictor, problems, cfgs or list(inductor_default_configs()), policy)
    return keep, best, aten, alone, covers
