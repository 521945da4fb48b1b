"""The Predictor's cuBLAS-or-Triton and pad answers: predict_cublas(_many), candidates, prefers_cublas_many,
space_best_ms (the whole space's best time, what cuBLAS's time is implied from, cached per problem) and pad. A
base class of perfmodel.serve.predictor.Predictor, whose rank, rank_many, config sets and floors it calls;
the rules themselves are perfmodel.serve.decisions', a bmm's heads perfmodel.serve.bmm's. Does not import
perfmodel.serve.predictor (no circle).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from perfmodel.artifact import CALL, CALL_STATIC, PROBLEM, ModelBundle, problem_columns, problem_output
from perfmodel.domain import roofline_ms
from perfmodel.features import pad_tensor, problems_tensor
from perfmodel.schema import GemmConfig, GemmProblem, PadDecision, PadProblem

# module objects (what a test patches there is what runs), named absolutely: `from . import` reads as an import
# of the package perfmodel.serve, whose __init__ imports the Predictor (a circle to an import checker)
import perfmodel.serve.bmm as bmm
import perfmodel.serve.decisions as decisions
from .arguments import Candidates, _check_problem, _check_problems, _check_top_k

# Problems whose best predicted time over the whole config space is kept (what cuBLAS's time is implied from:
# a whole-model compile asks about one shape for each of its layers).
_SPACE_CACHE_SIZE = 4096
# Problems scored over the whole space in one batch (64 x 1,206 configs: ~15 MB of features)
_SPACE_CHUNK = 64


class CublasAndPad:
    """The cuBLAS-or-Triton and pad half of the Predictor (perfmodel.serve.predictor.Predictor: its state, its
    __init__: _space_cache, _space_lock, _static)."""

    def space_best_ms(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """Per problem, the best predicted time over the model device's config space for its dtype -- rank(p,
        top_k=1)'s time (a bmm's: the bmm head's) -- kept per problem (_SPACE_CACHE_SIZE): what cuBLAS's time
        is implied from."""
        out = np.empty(len(problems))
        todo: dict[str, list[int]] = {}
        with self._space_lock:
            for i, p in enumerate(problems):
                hit = self._space_cache.get(p)
                if hit is None:
                    todo.setdefault(p.dtype, []).append(i)
                else:
                    self._space_cache.move_to_end(p)
                    out[i] = hit
        for dtype, where in todo.items():
            for s in range(0, len(where), _SPACE_CHUNK):  # a bounded batch: (chunk x ~1,200 configs) rows
                idx = where[s:s + _SPACE_CHUNK]
                probs = [problems[i] for i in idx]
                if probs[0].batch > 1:
                    best = np.exp(np.min(bmm.scores(self, probs, None)[2], axis=1))
                else:
                    _, ct, part, ok = self._config_rows(None, dtype, probs)
                    best = np.array([r[0][1] for r in self.rank_many(probs, None, 1)]) if ok is not None \
                        else np.array([r[0] for r in self._best(probs, ct, part, 1)[1]])
                out[idx] = best
                self._remember(probs, best)
        return out

    def _remember(self, problems: Sequence[GemmProblem], best_ms: Sequence[float]) -> None:
        with self._space_lock:
            for p, b in zip(problems, best_ms):
                self._space_cache[p] = float(b)
                self._space_cache.move_to_end(p)
            while len(self._space_cache) > _SPACE_CACHE_SIZE:
                self._space_cache.popitem(last=False)

    def predict_cublas(self, prob: GemmProblem) -> float:
        """Predicted ms of torch.mm (cuBLAS) on prob -- of aten::bmm for a batched one (batch > 1). With the
        model's call head for the kernel mode and a problem of the shapes and layouts it was fitted on
        (perfmodel.domain): the cuBLAS head's time where it agrees with the call, else the time the call
        implies against the best config of the whole space (rank(prob, top_k=1)'s time x exp(the call),
        floored at the roofline) -- so it is below that best time exactly where the call says cuBLAS wins
        (decisions.cublas_time); otherwise the cuBLAS head's time. The one cuBLAS time of the CLI, Candidates,
        the hooks and the whole-model set-up. RuntimeError if the model has no cuBLAS head."""
        return float(self.predict_cublas_many([_check_problem(prob)])[0])

    def predict_cublas_many(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """Predicted ms of torch.mm for each problem (1-D, predict_cublas's); of aten::bmm for batched problems."""
        problems = _check_problems(problems)
        if bmm.batched(problems):
            return bmm.aten_ms(self, problems)
        if not self.has_cublas:
            raise RuntimeError(f"{self.source}: this model has no cuBLAS head")
        return self._cublas_shown(problems)

    def _cublas_shown(self, problems: Sequence[GemmProblem], best_ms: np.ndarray | None = None) -> np.ndarray:
        """predict_cublas_many of plain GEMMs (decisions.cublas_time); best_ms: their best times over the whole
        space, when known."""
        head = self.floored(problems, self._cublas_ms(self._cublas_x(self.as_trained(problems, "cublas"))))
        call = self._call_head
        # the call head was fitted on the GEMM problems: where a problem is outside their shapes and layouts
        # (perfmodel.domain's "gemm"), the cuBLAS head's time alone
        covered = np.array([self.domain is None or not self.domain.outside("gemm", p) for p in problems])
        if call is None or not covered.any():
            return head
        out = head.copy()
        sel = [p for p, c in zip(problems, covered) if c]
        best = self.space_best_ms(sel) if best_ms is None else np.asarray(best_ms, dtype=np.float64)[covered]
        score = self._call_scores(call, self._cublas_x(sel))
        out[covered] = decisions.cublas_time(head[covered], best, score, self.roofline_ms(sel))
        return out

    def _cublas_ms(self, x: torch.Tensor) -> np.ndarray:
        """Predicted torch.mm ms on the problems' cuBLAS features x: the problem network's cuBLAS output
        (perfmodel.artifact.PROBLEM)."""
        head, col = _output_source(self.bundle, "cublas")
        log_ms = self._run(head, x)  # (N,) for a network of one output (its cuBLAS output alone)
        return self._checked(np.exp(log_ms if log_ms.ndim == 1 else log_ms[:, col]), "problems (cuBLAS)", positive=True)

    def _cublas_x(self, problems: Sequence[GemmProblem]) -> torch.Tensor:
        """The problems' features for the problem network (its cuBLAS and call outputs)."""
        with torch.inference_mode():
            return self.bundle.encoders["cublas"].encode(problems_tensor(problems))

    def candidates(self, prob: GemmProblem, configs: Sequence[GemmConfig] | None = None, top_k: int = 5,
                   margin: float = 0.05, max_k: int | None = None) -> Candidates:
        """The top_k configs, widened by every further config predicted within `margin` (relative) of
        the top_k-th one -- configs the model cannot tell apart -- up to max_k (default 2 * top_k);
        with the predicted cuBLAS time (predict_cublas) and whether it beats the best of them."""
        top_k = _check_top_k(top_k)
        max_k = 2 * top_k if max_k is None else _check_top_k(max_k, "max_k")
        if max_k < top_k:
            raise ValueError(f"max_k: must be >= top_k ({top_k}), got {max_k}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)):
            raise TypeError(f"margin: expected a number, got {type(margin).__name__} ({margin!r})")
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin: must be finite and >= 0, got {margin}")
        prob = _check_problem(prob)
        if prob.batch > 1:
            return self._bmm_candidates(prob, configs, top_k, margin, max_k)
        cfgs, ct, part, ok = self._config_rows(configs, prob.dtype, [prob])
        if ok is not None and ok[0].any():  # a config the device cannot run is never a candidate
            return self.candidates(prob, [c for c, o in zip(cfgs, ok[0]) if o], top_k, margin, max_k)
        idx, ms = self._best([prob], ct, part, max_k)
        idx, ms = idx[0], ms[0]
        if configs is None and ok is None:  # the whole space's best: what cuBLAS's time is implied from
            self._remember([prob], [ms[0]])
        k = min(top_k, len(idx))
        bound = ms[k - 1] * (1.0 + margin)
        while k < min(max_k, len(idx)) and ms[k] <= bound:
            k += 1
        cublas_ms, prefer = None, False
        if self.has_cublas:
            cublas_ms = float(self._cublas_shown([prob])[0])
            prefer = bool(decisions.cublas_preferred(cublas_ms, float(ms[0])))
        return Candidates(configs=tuple(cfgs[i] for i in idx[:k]), predicted_ms=tuple(float(t) for t in ms[:k]),
                          cublas_ms=cublas_ms, prefer_cublas=prefer)

    def _bmm_candidates(self, prob: GemmProblem, configs: Any, top_k: int, margin: float, max_k: int) -> Candidates:
        """candidates() of a bmm: the bmm head's ranking (configs the device can run), widened alike, with
        aten::bmm's predicted time (predict_cublas: the bmm call head's implied time, or a bmm_aten head's)
        as cublas_ms and the same rule: aten's time below the best config shown."""
        scored = bmm.scores(self, [prob], configs)
        ranked = bmm.rank_scored(*scored, 10**9)[0]                   # every config, the runnable ones first
        ranked = ([r for r in ranked if math.isfinite(r[1])] or ranked)[:max_k]
        k = min(top_k, len(ranked))
        bound = ranked[k - 1][1] * (1.0 + margin)
        while k < len(ranked) and ranked[k][1] <= bound:
            k += 1
        if configs is None and math.isfinite(ranked[0][1]):  # the space just scored: its best, for aten's time
            self._remember([prob], [ranked[0][1]])
        aten = float(bmm.aten_ms(self, [prob])[0]) if bmm.has_aten(self) else None
        prefer = aten is not None and bool(decisions.cublas_preferred(aten, ranked[0][1]))
        return Candidates(configs=tuple(c for c, _ in ranked[:k]), predicted_ms=tuple(t for _, t in ranked[:k]),
                          cublas_ms=aten, prefer_cublas=prefer)

    @property
    def _call_head(self) -> str | None:
        """The problem network's call output for this kernel mode (call, call_static), or None. A model with an
        inductor mode but no call_static output (an inductor head beside a problem network fitted without static
        rows) takes the call output in both modes: the cuBLAS-or-Triton call it makes without the inductor mode,
        which then only ranks the Triton configs."""
        for name in ((CALL_STATIC, CALL) if self._static else (CALL,)):
            if _output_source(self.bundle, name) is not None:
                return name
        return None

    def prefers_cublas_many(self, problems: Sequence[GemmProblem]) -> np.ndarray:
        """For each problem, whether cuBLAS (aten::bmm for a bmm) is predicted faster than the best Triton config
        of the model's config space (1-D bool): predict_cublas_many below rank(p, top_k=1)'s time -- with a
        call head, its call. RuntimeError if the model has no cuBLAS head."""
        problems = _check_problems(problems)
        if bmm.batched(problems):
            if not bmm.has_aten(self):
                bmm.require(self, bmm.BMM_CALL, problems[0].batch)
            return decisions.cublas_preferred(bmm.aten_ms(self, problems), self.space_best_ms(problems))
        if not self.has_cublas:
            raise RuntimeError(f"{self.source}: this model has no cuBLAS head")
        best = self.space_best_ms(problems)
        return decisions.cublas_preferred(self._cublas_shown(problems, best), best)

    def _call_scores(self, name: str, x: torch.Tensor) -> np.ndarray:
        """The problem network's call output `name` on the problems' cuBLAS features x (below 0: cuBLAS wins)."""
        with torch.inference_mode():
            return problem_output(self.bundle, name).score(x).double().numpy().reshape(-1)

    def pad(self, pp: PadProblem) -> PadDecision:
        """Whether padding pp's operands to the dtype alignment pays off (Inductor's pad_mm decision):
        should_pad = padded_ms * pad_threshold < orig_ms. A problem already aligned is never padded
        (padded_ms == orig_ms). Both times floored at their problem's roofline (the padded one's at the
        padded problem's). RuntimeError if the model has no pad head."""
        if not isinstance(pp, PadProblem):
            raise TypeError(f"pp: expected a PadProblem, got {type(pp).__name__}")
        if not self.has_pad:
            raise RuntimeError(f"{self.source}: this model has no pad head")
        seen = self.as_trained([pp], "pad")[0]
        with torch.inference_mode():
            x = self.bundle.encoders["pad"].encode_pad(pad_tensor([seen]))
        ms = self._ms("pad", x, f"pp {pp}").reshape(-1, 2)[0]  # (orig, padded)
        # the rooflines of the problem as it is and padded (whose dims may pass MAX_DIM: no GemmProblem of them)
        (m, k, n), (pm, pk, pn) = (pp.m, pp.k, pp.n), pp.padded_dims()
        orig, padded = roofline_ms(self.spec, [m, pm], [n, pn], [k, pk], pp.dtype, pp.allow_tf32)
        return decisions.pad_decision(max(float(ms[0]), float(orig)), max(float(ms[1]), float(padded)),
                                      self.pad_threshold, pp.needs_padding())


def _output_source(bundle: ModelBundle, name: str) -> tuple[str, int] | None:
    """(head, column) that gives the output `name` (cublas, call, call_static): the problem network's column;
    None where the model has none."""
    col = problem_columns(bundle).get(name)
    return None if col is None else (PROBLEM, col)
