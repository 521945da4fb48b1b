"""Batched GEMMs (torch.bmm / baddbmm): what the Predictor serves for a GemmProblem with batch > 1.

The model's bmm heads (perfmodel bmm-head, train/bmm_head.py) predict them: `bmm`, the log ms of a config of
Inductor's bmm template (timed as Inductor compiles it, so the one kernel both kernel modes get: a batched
problem is not ranked by the gemm head, its screen or the static head), with the physical floor of the whole
batch (flops and bytes times the batch); and `bmm_call`, the aten-or-Triton call (Candidates.prefer_cublas,
prefers_cublas_many, and the hooks through aten_call_ms): per problem log(aten::bmm ms / the best config's
ms), below 0 aten::bmm wins. aten::bmm's time (predict_cublas, Candidates.cublas_ms) is what the call implies
(aten_ms), or, in folders fitted with `--aten-head`, a `bmm_aten` head's log ms. The rows are
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
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM].encode_cross(bmm_problems_tensor(problems), ct)     # (P * C, F)
    z, log_ms = predictor.runner.score_log_ms(BMM, x)
    shape = (len(problems), len(cfgs))
    z = checked(z.numpy().astype(np.float64), "problems (bmm)").reshape(shape)
    log_ms = log_ms.numpy().astype(np.float64).reshape(shape)
    checked(np.exp(log_ms), "problems (bmm)", positive=True)
    if ok is not None:
        log_ms = np.where(ok, log_ms, np.inf)
    return cfgs, z, log_ms


def predict(predictor: "Predictor", problems: Sequence[GemmProblem], configs: Any) -> np.ndarray:
    """(P, C) predicted ms of the bmm head."""
    return np.exp(scores(predictor, problems, configs)[2])


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
    """Predicted ms of aten::bmm for each problem (1-D): the bmm_aten head's where the folder has one (folders
    fitted with `perfmodel bmm-head --aten-head`), else the time the call head implies -- the best predicted
    time over the model device's config space for the problem x exp(the call's output), aten_call_ms."""
    if BMM_ATEN not in predictor.bundle.heads and BMM_CALL in predictor.bundle.heads:
        # each problem over its own dtype's space (scores takes one dtype a call)
        best = np.array([np.min(scores(predictor, [p], None)[2]) for p in problems])
        return implied_aten_ms(predictor, problems, best)
    require(predictor, BMM_ATEN, problems[0].batch)
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM_ATEN].encode(bmm_problems_tensor(problems))
    return checked(np.exp(predictor.runner(BMM_ATEN, x)), "problems (aten::bmm)", positive=True)


def implied_aten_ms(predictor: "Predictor", problems: Sequence[GemmProblem], best_log_ms: np.ndarray,
                    call: np.ndarray | None = None) -> np.ndarray:
    """aten_ms() without a bmm_aten head, from each problem's best predicted log ms over the model device's
    config space (best_log_ms) and the call head's output (call; None: computed here): exp(best + call),
    floored at the whole batch's roofline."""
    if not np.all(np.isfinite(best_log_ms)):
        raise ValueError("problems (aten::bmm): no config of the model's space runs a problem on this device, so "
                         "the call head implies no aten::bmm time for it")
    call = call_scores(predictor, problems) if call is None else call
    enc = predictor.bundle.encoders[BMM_CALL]  # the bmm_aten features: the whole batch's roofline, the floor
    with torch.inference_mode():
        floor = enc.encode(bmm_problems_tensor(problems))[:, enc.names.index("log_bmm_roofline_ms")]
    return np.exp(np.maximum(best_log_ms + call, floor.double().numpy()))


def call_scores(predictor: "Predictor", problems: Sequence[GemmProblem]) -> np.ndarray | None:
    """The bmm call head's output per problem (log(aten::bmm ms / the best config's ms); below 0 aten::bmm
    wins), or None where the model has no call head."""
    if BMM_CALL not in predictor.bundle.heads:
        return None
    with torch.inference_mode():
        x = predictor.bundle.encoders[BMM_CALL].encode(bmm_problems_tensor(problems))
    return checked(predictor.runner.score(BMM_CALL, x).numpy().astype(np.float64).reshape(-1), "problems (bmm call)")


def aten_call_ms(predictor: "Predictor", prob: GemmProblem, best_ms: float) -> float:
    """The aten::bmm time the hooks weigh against the best ranked config's predicted time best_ms: what the
    call head implies (best_ms x exp(its output): aten wins exactly where the call says so), else (a folder
    with a bmm_aten head and no call head) the bmm_aten head's time. The hooks' rules
    (decisions.triton_expected_gain, triton_dropped) take it as the aten kernel's time."""
    score = call_scores(predictor, [prob])
    return float(best_ms * np.exp(score[0])) if score is not None else float(aten_ms(predictor, [prob])[0])


def leave_unpadded(predictor: "Predictor", prob: GemmProblem,
                   configs: Sequence[Any] | None = None) -> tuple[bool, float, float]:
    """The pad hook's rule for a bmm that Inductor's pad_mm pass would pad, when the compile autotunes the
    Triton bmm template: (leave it unpadded, the best config's predicted ms, aten::bmm's as the call implies
    it). Unpadded where the model keeps Triton for it -- its best config (of `configs`, those autotuning
    offers; None: the whole space) predicted faster than aten::bmm -- since the template runs the unaligned
    shape as it is and padding only adds the copies; elsewhere (aten::bmm predicted faster) Inductor's own
    benchmark decides. On the 1,771 problems of data/h100's bmm rows that pad_mm would pad, timed padded
    (pad, aten::bmm, slice), unpadded and with every Triton config, this rule under the whole-model
    set-up's decisions runs a geomean 1.004x the faster of padded and unpadded, Inductor's rule with an exact
    benchmark 1.025x (benchmarks/studies/bmm_pad_rule.py)."""
    best = predictor.rank(prob, None if configs is None else list(configs), top_k=1)
    if not best or not np.isfinite(best[0][1]):
        return False, float("inf"), float("nan")
    aten = aten_call_ms(predictor, prob, best[0][1])
    return bool(best[0][1] < aten), float(best[0][1]), aten
