"""The model's pad decision in place of Inductor's pad_mm benchmark (both entry points: the set-up with pad=True,
the max-autotune hook with install(pad=True)).

Inductor's pad_mm pass (torch._inductor.fx_passes.pad_mm._should_pad) times the original against the padded GEMM in
eager mode while compiling. pad_hook(predictor, original) is a replacement that asks the model for a 2-D mm of
fp16/bf16/fp32 with static shapes (Predictor.pad, then -- where the compile autotunes Triton mm templates -- left
unpadded where the best unpadded Triton config wins clearly: decisions.hook_pad_decision), and, where the compile
autotunes the Triton bmm template and the model has bmm heads, leaves a bmm unpadded where the model keeps Triton
for it (serve.bmm.leave_unpadded); everything else (addmm, the other bmm, dynamic shapes, force_shape_pad) keeps
Inductor's own logic. Installing it is a module attribute: process-wide, not per thread. The decisions made are
logged (pad_decisions(), bmm_pad_decisions(): the most recent PAD_LOG_SIZE).
"""
from __future__ import annotations

import collections
import threading
from typing import Any

from perfmodel.configs import inductor_default_configs
from perfmodel.schema import GemmConfig, GemmProblem, PadProblem

from . import bmm
from .decisions import hook_pad_decision
from .kernel_inputs import fp32_matmul_on_tf32
from .notices import warn_once
from .predictor import Predictor

# pad_decisions() keeps the most recent decisions only: a long-lived process compiles without end.
PAD_LOG_SIZE = 10_000
_lock = threading.Lock()
_log: dict[str, collections.deque] = {}  # "pad", "bmm": guarded by _lock


def _record(kind: str, entry: Any) -> None:
    with _lock:
        _log.setdefault(kind, collections.deque(maxlen=PAD_LOG_SIZE)).append(entry)


def pad_decisions() -> list:
    """(PadProblem, PadDecision) of the pad_mm decisions the model made since the log was cleared, oldest first:
    the most recent PAD_LOG_SIZE of them."""
    with _lock:
        return list(_log.get("pad", []))


def bmm_pad_decisions() -> list:
    """The bmm pad decisions the model made since the log was cleared, oldest first (the most recent
    PAD_LOG_SIZE): (GemmProblem, padded -- always False: where the model keeps Triton the bmm is left
    unpadded; elsewhere Inductor's pad_mm benchmark decides, unlogged --, the best config's predicted ms,
    aten::bmm's as the model's call implies it)."""
    with _lock:
        return list(_log.get("bmm", []))


def clear_log() -> None:
    with _lock:
        _log.clear()


def _match_operands(mat1: Any, mat2: Any, rank: int) -> tuple[str, bool, bool] | None:
    """(dtype, transpose_left, transpose_right) of the operands pad_mm's pass considers, each of `rank` dims and
    row- or column-major in its last two, or None when the model does not cover them (symbolic shapes, other
    dtypes, operands neither row- nor column-major)."""
    import torch

    dtypes = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
    if mat1.dim() != rank or mat2.dim() != rank or mat1.dtype != mat2.dtype or mat1.dtype not in dtypes:
        return None
    dims = (*mat1.shape, *mat2.shape, *mat1.stride(), *mat2.stride())
    if not all(isinstance(d, int) for d in dims):
        return None
    layouts = []
    for t in (mat1, mat2):
        if t.stride(-1) == 1 or t.shape[-1] == 1:
            layouts.append(False)  # row-major
        elif t.stride(-2) == 1 or t.shape[-2] == 1:
            layouts.append(True)   # column-major: a transposed view
        else:
            return None
    return dtypes[mat1.dtype], layouts[0], layouts[1]


def pad_problem_from_match(match: Any, mat1: Any, mat2: Any) -> PadProblem | None:
    """The PadProblem of an mm that Inductor's pad_mm pass considers, or None when the model does not
    cover it (symbolic shapes, other dtypes, operands neither row- nor column-major)."""
    from torch._inductor.fx_passes import pad_mm

    operands = _match_operands(mat1, mat2, 2)
    if operands is None:
        return None
    dtype, left, right = operands
    (m, k), n = mat1.shape, mat2.shape[1]
    return PadProblem(m=m, k=k, n=n, dtype=dtype, transpose_left=left, transpose_right=right,
                      prepadded_left=bool(pad_mm.should_exclude_padding_time(match, "mat1")),
                      prepadded_right=bool(pad_mm.should_exclude_padding_time(match, "mat2")),
                      allow_tf32=dtype == "float32" and fp32_matmul_on_tf32())


def bmm_problem_from_match(mat1: Any, mat2: Any) -> GemmProblem | None:
    """The GemmProblem (batch > 1) of a bmm that Inductor's pad_mm pass considers -- mat1 (b, m, k), mat2
    (b, k, n) -- or None when the model does not cover it (symbolic shapes, other dtypes, matrices neither
    row- nor column-major)."""
    operands = _match_operands(mat1, mat2, 3)
    if operands is None or mat1.shape[0] < 2:
        return None
    dtype, left, right = operands
    b, m, k = mat1.shape
    return GemmProblem(m=m, n=mat2.shape[2], k=k, dtype=dtype, transpose_left=left, transpose_right=right, batch=b,
                       allow_tf32=dtype == "float32" and fp32_matmul_on_tf32())


def _triton_mm_in_play() -> bool:
    """Whether this compile autotunes Triton mm templates (max-autotune with the TRITON backend)."""
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm) and \
        "TRITON" in str(config.max_autotune_gemm_backends).upper()


def _configs_in_play() -> list[GemmConfig] | None:
    """The mm template configs this compile's autotuning offers: Inductor's default list in the DEFAULT
    search space, None (the model's whole space) in EXHAUSTIVE."""
    from torch._inductor import config

    if str(config.max_autotune_gemm_search_space).upper() == "EXHAUSTIVE":
        return None
    return list(inductor_default_configs())


def pad_hook(predictor: Predictor, original: Any) -> Any:
    """A replacement for pad_mm._should_pad that asks the model, falling back to original."""
    def _should_pad(match, mat1, mat2, op, input=None):
        import torch

        try:
            if op is torch.ops.aten.mm and not torch._inductor.config.force_shape_pad:
                pp = pad_problem_from_match(match, mat1, mat2)
                if pp is not None and pp.needs_padding():
                    from torch.utils._mode_utils import no_dispatch

                    with no_dispatch():  # the pass runs under FakeTensorMode: the model needs real tensors
                        in_play = _triton_mm_in_play()
                        decision = hook_pad_decision(predictor, pp, in_play, _configs_in_play() if in_play else None)
                    _record("pad", (pp, decision))
                    return decision.should_pad
            if op is torch.ops.aten.bmm and predictor.has_bmm and _triton_mm_in_play() \
                    and not torch._inductor.config.force_shape_pad:
                prob = bmm_problem_from_match(mat1, mat2)
                if prob is not None:
                    from torch.utils._mode_utils import no_dispatch

                    with no_dispatch():
                        unpadded, triton_ms, aten_ms = bmm.leave_unpadded(predictor, prob, _configs_in_play())
                    if unpadded:  # the Triton bmm template runs the shape as it is: no pad copies
                        _record("bmm", (prob, False, triton_ms, aten_ms))
                        return False
        except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
            warn_once(f"pad:{type(exc).__name__}", f"could not decide padding with the model ({type(exc).__name__}: "
                                                    f"{exc}); using Inductor's pad_mm benchmark")
        return original(match, mat1, mat2, op, input)

    _should_pad.perfmodel = predictor
    return _should_pad
