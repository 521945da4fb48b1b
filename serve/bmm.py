"""Batched GEMMs (torch.bmm / baddbmm): what the Predictor serves for a GemmProblem with batch > 1.

The model's bmm heads (perfmodel bmm-head, train/bmm_head.py) predict them: `bmm`, the log ms of a config of
Inductor's bmm template (timed as Inductor compiles it, so the one kernel both kernel modes get: a batched
problem is not ranked by the gemm head, its screen or the static head), with the physical floor of the whole
batch (flops and bytes times the batch); and `bmm_call`, the aten-or-Triton call: per problem log(aten::bmm ms /
the best config's ms), below 0 aten::bmm wins. aten::bmm's time (aten_ms: predict_cublas, Candidates.cublas_ms,
and what both hooks weigh) is the one the call implies against the best config of the whole space
(perfmodel.serve.decisions.implied_cublas_ms), or, in folders fitted with `--aten-head`, a `bmm_aten` head's log
ms; aten is preferred where that time is below the best Triton config's, as for a plain GEMM. The rows are
encoded here (the "bmm" / "bmm_aten" encoders) and scored by the Predictor's runner, so the torch and onnx
backends serve them alike (model.onnx has each head's graph, bmm_x -> bmm_log_ms / bmm_score). Configs sort
by the bmm head's score (its output before the floors, which never reorder a problem's configs), ties in
the given order; a config the device cannot run predicts inf and ranks last, as for a plain GEMM.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from perfmodel.artifact import BMM, BMM_ATEN, BMM_CALL
from perfmodel.features import bmm_problems_tensor
from perfmodel.schema import GemmProblem

from .runners import checked

if TYPE_CHECKING:
    from .predictor import Predictor


def batched(problems: Sequence[GemmProblem]) -> bool:
    """Whether the problems are bmm problems (batch > 1): True for all, False for none; ValueError naming
    batch for a mix (a plain GEMM and a bmm are predicted by different heads: pass them separately)."""
    flags = {p.batch > 1 for p in problems}
    if len(flags) > 1:
        raise ValueError("batch: the problems mix batch=1 (mm) and batch>1 (bmm), which different heads predict; "
                         "pass them in separate calls")
    return flags.pop()


def require(predictor: "Predictor", head: str, batch: int) -> None:
    """ValueError naming batch and the missing head where the model has no bmm head to serve a batched problem."""
    if head not in predictor.bundle.heads:
        raise ValueError(f"batch: {predictor.source} has no {head!r} head, so it cannot predict a bmm (batch={batch}); "
                         "add one with `perfmodel bmm-head --model <folder> --data <folder with bmm shards>`, "
                         "or pass batch=1")


def scores(predictor: "Predictor", problems: Sequence[GemmProblem], configs: Any) -> tuple[list, np.ndarray, np.ndarray]:
    """(configs, score (P, C), log ms (P, C)) of the bmm head on every problem with every config (configs None:
    the model device's pruned space for the problems' dtype); log ms inf where the device cannot run a config."""
    require(predictor, BMM, problems[0].batch)
    cfgs, ct, ok = predictor.config_set(configs, problems)
    seen = predictor.as_trained(problems, "bmm")  # the trained shapes (perfmodel.domain)
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM].encode_cross(bmm_problems_tensor(seen), ct)         # (P * C, F)
    z, log_ms = predictor.runner.score_log_ms(BMM, x)
    shape = (len(problems), len(cfgs))
    z = checked(z.numpy().astype(np.float64), "problems (bmm)").reshape(shape)
    ms = checked(np.exp(log_ms.numpy().astype(np.float64)), "problems (bmm)", positive=True).reshape(shape)
    log_ms = np.log(predictor.floored(problems, ms))  # the whole batch's roofline, in float64
    if ok is not None:
        log_ms = np.where(ok, log_ms, np.inf)
    return cfgs, z, log_ms


def predict(predictor: "Predictor", problems: Sequence[GemmProblem], configs: Any) -> np.ndarray:
    """(P, C) predicted ms of the bmm head."""
    return np.exp(scores(predictor, problems, configs)[2])


def has_aten(predictor: "Predictor") -> bool:
    """Whether the model predicts aten::bmm's time (a bmm_call or a bmm_aten head)."""
    return BMM_ATEN in predictor.bundle.heads or BMM_CALL in predictor.bundle.heads


def rank(predictor: "Predictor", problems: Sequence[GemmProblem], configs: Any,
         top_k: int) -> list[list[tuple[Any, float]]]:
    """Per problem, the top_k configs by the bmm head, fastest first: runnable ones by score (ties in the
    given order), then the others (inf ms)."""
    return rank_scored(*scores(predictor, problems, configs), top_k)


def rank_scored(cfgs: list, z: np.ndarray, log_ms: np.ndarray, top_k: int) -> list[list[tuple[Any, float]]]:
    """rank() of scores() already computed."""
    out = []
    for zi, li in zip(z, log_ms):
        key = np.where(np.isfinite(li), zi, np.inf)
        order = np.argsort(key, kind="stable")[:top_k]
        out.append([(cfgs[i], float(np.exp(li[i]))) for i in order])
    return out


def aten_ms(predictor: "Predictor", problems: Sequence[GemmProblem]) -> np.ndarray:
    """Predicted ms of aten::bmm for each problem (1-D; Predictor.predict_cublas of a bmm): the bmm_aten head's
    where the folder has one (folders fitted with `--aten-head`), else the time the call head implies -- the
    best predicted time over the model device's config space for the problem x exp(the call's output), floored
    at the whole batch's roofline (implied_aten_ms)."""
    if BMM_ATEN not in predictor.bundle.heads and BMM_CALL in predictor.bundle.heads:
        return implied_aten_ms(predictor, problems, np.log(predictor.space_best_ms(problems)))
    require(predictor, BMM_ATEN, problems[0].batch)
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM_ATEN].encode(bmm_problems_tensor(predictor.as_trained(problems, "bmm")))
    return predictor.floored(problems, checked(np.exp(predictor.runner(BMM_ATEN, x)), "problems (aten::bmm)",
                                               positive=True))


def implied_aten_ms(predictor: "Predictor", problems: Sequence[GemmProblem], best_log_ms: np.ndarray,
                    call: np.ndarray | None = None) -> np.ndarray:
    """aten_ms() without a bmm_aten head, from each problem's best predicted log ms over the model device's
    config space (best_log_ms) and the call head's output (call; None: computed here): exp(best + call),
    floored at the whole batch's roofline (perfmodel.serve.decisions.implied_cublas_ms)."""
    from .decisions import implied_cublas_ms

    if not np.all(np.isfinite(best_log_ms)):
        raise ValueError("problems (aten::bmm): no config of the model's space runs a problem on this device, so "
                         "the call head implies no aten::bmm time for it")
    call = call_scores(predictor, problems) if call is None else call
    return implied_cublas_ms(np.exp(best_log_ms), call, predictor.roofline_ms(problems))


def call_scores(predictor: "Predictor", problems: Sequence[GemmProblem]) -> np.ndarray | None:
    """The bmm call head's output per problem (log(aten::bmm ms / the best config's ms); below 0 aten::bmm
    wins), or None where the model has no call head."""
    if BMM_CALL not in predictor.bundle.heads:
        return None
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM_CALL].encode(bmm_problems_tensor(predictor.as_trained(problems, "bmm")))
    return checked(predictor.runner.score(BMM_CALL, x).numpy().astype(np.float64).reshape(-1), "problems (bmm call)")


def aten_call_ms(predictor: "Predictor", prob: GemmProblem, best_ms: float | None = None) -> float:
    """The aten::bmm time the hooks weigh against the best ranked (offered) config's predicted time: the one
    time the model gives aten::bmm (aten_ms, Predictor.predict_cublas), whatever configs are offered (best_ms
    is not used: the hooks once implied aten's time from the offered configs' best, which made it differ from
    the one the API and the CLI show). The hooks' rules (decisions.triton_expected_gain, triton_dropped,
    bmm_sure) take it as the aten kernel's time."""
    return float(aten_ms(predictor, [prob])[0])


def leave_unpadded(predictor: "Predictor", prob: GemmProblem,
                   configs: Sequence[Any] | None = None) -> tuple[bool, float, float]:
    """The pad hook's rule for a bmm that Inductor's pad_mm pass would pad, when the compile autotunes the
    Triton bmm template: (leave it unpadded, the best config's predicted ms, aten::bmm's predicted ms,
    aten_ms). Unpadded where the model keeps Triton for it -- its best config (of `configs`, those autotuning
    offers; None: the whole space) predicted faster than aten::bmm -- since the template runs the unaligned
    shape as it is and padding only adds the copies; elsewhere (aten::bmm predicted faster) Inductor's own
    benchmark decides. On the 1,771 problems of data/h100's bmm rows that pad_mm would pad, timed padded
    (pad, aten::bmm, slice), unpadded and with every Triton config, this rule under the whole-model
    set-up's decisions runs a geomean 1.004x the faster of padded and unpadded, Inductor's rule with an exact
    benchmark 1.025x (benchmarks/studies/bmm_pad_rule.py)."""
    best = predictor.rank(prob, None if configs is None else list(configs), top_k=1)
    if not best or not np.isfinite(best[0][1]):
        return False, float("inf"), float("nan")
    aten = aten_call_ms(predictor, prob)
    return bool(best[0][1] < aten), float(best[0][1]), aten
