"""Inductor hook: under max-autotune, compile and benchmark only the model's top-k Triton mm and bmm configs.

    from perfmodel.serve import inductor
    inductor.install(top_k=5)          # or: with inductor.installed(top_k=5): ...
    torch.compile(f, mode="max-autotune-no-cudagraphs")(a, b)
    inductor.uninstall()

It installs, through torch._inductor.virtualized.V.set_choices_handler, a subclass of
torch._inductor.choices.InductorChoices whose _finalize_template_configs -- called with every
template's KernelTemplateChoice generator before any is turned into a (costly) ChoiceCaller -- keeps,
for mm/addmm, only the top_k choices of the canonical Triton mm template ("triton::mm") by predicted
time, and for bmm/baddbmm the top_k of Inductor's Triton bmm template ("triton::bmm"; its configs are the
mm heuristics' and map to the same GemmConfig) by the model's bmm head (a model without one leaves them
to Inductor). aten (cuBLAS), decompose-k, TMA/persistent and other templates pass through unchanged --
but for aten::addmm where aten::bias_addmm is offered too (prefer_bias_addmm), and for a bmm/baddbmm the
model is sure of (the aten::bmm time its call implies at least bmm_sure_gain slower than its best
config's), whose best config is kept alone, without aten: one choice, no benchmark.

Private APIs move between torch releases: install() checks what it relies on and, when something is
missing, warns once and leaves Inductor's default behaviour (returns False). A failure inside the hook
at compile time also falls back to the unfiltered choices, with one warning.

With pad=True, install() also replaces the benchmark inside Inductor's pad_mm pass
(torch._inductor.fx_passes.pad_mm._should_pad, which times orig vs padded GEMMs in eager mode while
compiling) by the model's pad decision (Predictor.pad) for 2-D mm of fp16/bf16/fp32 with static
shapes, and, where the compile autotunes the Triton bmm template and the model has bmm heads, leaves a bmm
unpadded where the model keeps Triton for it (serve.bmm.leave_unpadded); everything else (addmm, the other
bmm, dynamic shapes, force_shape_pad) keeps Inductor's own logic.
That patch is process-wide (a module attribute), not per thread.

The choices handler is thread-local in Inductor: install in the thread that calls torch.compile.
A graph already in the FX graph cache is not recompiled, so the hook only affects fresh compiles.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import threading
import warnings
from dataclasses import replace
from typing import Any, Iterator, Sequence

from perfmodel.configs import inductor_default_configs
from perfmodel.schema import GemmConfig, GemmProblem, PadProblem, is_column_major

# The decisions are perfmodel.serve.decisions'; their names stay importable from here.
from .decisions import (BMM_SURE_GAIN, CUBLAS_MARGIN, PAD_TRITON_MARGIN, bmm_sure,  # noqa: F401
                        check_bmm_sure_gain, hook_pad_decision, pad_copy_floor_ms, padded_path_ms,
                        triton_dropped, unpadded_triton_instead)
from . import bmm, grouped
from .predictor import Predictor, _check_top_k
from .triton_hook import kwargs_to_gemm, rank_positions

MM_OPS = ("mm", "addmm")
TRITON_MM_TEMPLATES = ("triton::mm",)
# Batched GEMMs: Inductor's bmm template serves torch.bmm and torch.baddbmm (torch/_inductor/kernel/bmm.py)
BMM_OPS = ("bmm", "baddbmm")
TRITON_BMM_TEMPLATES = ("triton::bmm",)
# What install() ranks by default: the ops and the Triton templates of both
RANKED_OPS = MM_OPS + BMM_OPS
RANKED_TEMPLATES = TRITON_MM_TEMPLATES + TRITON_BMM_TEMPLATES
# The Triton templates that lower each op: an mm's choices are never ranked as a bmm's, nor the other way
_OP_TEMPLATES = {**{op: TRITON_MM_TEMPLATES for op in MM_OPS}, **{op: TRITON_BMM_TEMPLATES for op in BMM_OPS}}
# Triton bmm configs kept per bmm/baddbmm (install's bmm_top_k). One: each kept bmm config is compiled and
# benchmarked at compile time. On the H100 under max-autotune (call s8), BERT-large's bmm autotuning took 6.8 s
# with the top 5 and 0.7 s with the top 1, T5-base's 8.2 s and 1.2 s (stock: 47.5 s and 93.5 s); with the
# shipped heads and top_k=5, bmm_top_k=1 (call s10), BERT-large, T5-base and Swin-T took 0.4, 1.7 and 1.0 s
# and each ran faster than stock max-autotune (docs/benchmarks.md, "Whole models").
BMM_TOP_K = 1
# The parameters of InductorChoices._finalize_template_configs that this hook was written against.
_EXPECTED_PARAMS = ("self", "template_choices", "kernel_inputs", "templates", "op_name", "kwarg_overrides")

_lock = threading.Lock()
_installed: dict[str, Any] = {}  # "handler", "prior": guarded by _lock
# pad_decisions() keeps the most recent decisions only: a long-lived process compiles without end.
PAD_LOG_SIZE = 10_000
_warned: set[str] = set()  # messages warned once: guarded by _lock


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"perfmodel.serve.inductor: {message}", RuntimeWarning, stacklevel=3)


def check_torch_api() -> str | None:
    """None when the installed torch has what the hook needs, else why not."""
    try:
        from torch._inductor.choices import InductorChoices
        from torch._inductor.virtualized import V
    except ImportError as exc:
        return f"cannot import Inductor's choices API ({exc})"
    fn = getattr(InductorChoices, "_finalize_template_configs", None)
    if fn is None:
        return "torch._inductor.choices.InductorChoices has no _finalize_template_configs"
    params = tuple(inspect.signature(fn).parameters)
    if params[: len(_EXPECTED_PARAMS)] != _EXPECTED_PARAMS:
        return f"InductorChoices._finalize_template_configs{params} differs from the expected {_EXPECTED_PARAMS}"
    if not callable(getattr(V, "set_choices_handler", None)):
        return "torch._inductor.virtualized.V has no set_choices_handler"
    return None


def fp32_matmul_on_tf32() -> bool:
    """Whether float32 matmuls run on TF32 here: torch's fp32_precision setting of CUDA matmuls ("tf32" after
    torch.set_float32_matmul_precision("high") or torch.backends.cuda.matmul.allow_tf32 = True; what Inductor's
    templates read), else, on a torch without it, the legacy allow_tf32 flag. Read at compile time."""
    import torch

    mm = torch.backends.cuda.matmul
    try:
        return mm.fp32_precision == "tf32"
    except (AttributeError, RuntimeError):
        pass
    try:
        return bool(mm.allow_tf32)
    except RuntimeError:  # torch refuses to read the legacy flag once the new API was used
        return False


def template_allow_tf32(choices: Sequence[Any]) -> bool | None:
    """ALLOW_TF32 of Inductor's template choices (KernelTemplateChoice.extra_kwargs) where one sets it -- Inductor
    turns TF32 on for a float32 template only above a size threshold even where matmuls run on TF32 -- else None."""
    flags = [bool(x["ALLOW_TF32"]) for c in choices
             if isinstance(x := getattr(c, "extra_kwargs", None), dict) and "ALLOW_TF32" in x]
    return any(flags) if flags else None


def problem_from_kernel_inputs(kernel_inputs: Any, allow_tf32: bool | None = None) -> GemmProblem:
    """The GemmProblem of Inductor's MMKernelInputs (mm: nodes (mat1, mat2); addmm: (bias, mat1, mat2); bmm:
    (mat1, mat2) of shapes (b, m, k), (b, k, n): batch b; baddbmm: (bias, mat1, mat2)); each operand's layout
    from its last two dims; a float32 problem on TF32 as allow_tf32 says (the templates' flag,
    template_allow_tf32), or where it is None as the matmul setting says (fp32_matmul_on_tf32). ValueError for
    what the model does not cover (operands of other ranks or batches, unsupported dtype, unhinted shapes)."""
    n_nodes = len(kernel_inputs.nodes())
    i1 = getattr(kernel_inputs, "_mat1_idx", -2) % n_nodes
    i2 = getattr(kernel_inputs, "_mat2_idx", -1) % n_nodes
    shapes, strides = kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted()
    ranks = (len(shapes[i1]), len(shapes[i2]))
    if ranks not in ((2, 2), (3, 3)) or (ranks == (3, 3) and int(shapes[i1][0]) != int(shapes[i2][0])):
        raise ValueError(f"shape: operands {tuple(shapes[i1])} @ {tuple(shapes[i2])} are not an mm or a bmm")
    batch = int(shapes[i1][0]) if ranks == (3, 3) else 1
    m, n, k = (int(x) for x in kernel_inputs.mnk_hinted())
    dtype = kernel_inputs.dtypes()[i1]
    prob = GemmProblem(m=m, n=n, k=k, dtype=dtype, batch=batch,
                       transpose_left=is_column_major(shapes[i1], strides[i1]),
                       transpose_right=is_column_major(shapes[i2], strides[i2]))
    if prob.dtype == "float32" and (fp32_matmul_on_tf32() if allow_tf32 is None else allow_tf32):
        prob = replace(prob, allow_tf32=True)
    return prob


def _uid(ktc: Any) -> str | None:
    return getattr(getattr(ktc, "template", None), "uid", None)


def filter_template_choices(choices: list, kernel_inputs: Any, op_name: str, predictor: Predictor, top_k: int,
                            *, ops: Sequence[str] = RANKED_OPS, templates: Sequence[str] = RANKED_TEMPLATES,
                            cublas_margin: float | None = None, bmm_sure_gain: float | None = None) -> list:
    """Keeps the top_k KernelTemplateChoices of the ranked templates by predicted time, every other
    choice unchanged and in Inductor's order. With cublas_margin set, drops the ranked templates
    altogether when cuBLAS's (aten::bmm's, for a bmm) predicted time x (1 + cublas_margin) is below the best
    of them (perfmodel.serve.decisions.triton_dropped; an aten choice must be present to fall back on).
    With bmm_sure_gain set, a bmm/baddbmm whose aten::bmm time (as the model's call implies it) is at least
    that fraction slower than the best ranked config keeps that config alone, without the aten choices
    (perfmodel.serve.decisions.bmm_sure): Inductor then benchmarks nothing where no other choice remains.
    A bmm/baddbmm is left as Inductor has it where the model has no bmm heads.
    An addmm offered both aten kernels loses aten::addmm to aten::bias_addmm (prefer_bias_addmm)."""
    if op_name not in ops:
        return choices
    choices = prefer_bias_addmm(choices, op_name)
    templates = [t for t in templates if t in _OP_TEMPLATES.get(op_name, templates)]
    idx: list[int] = []
    cfgs: list[GemmConfig] = []
    for i, ktc in enumerate(choices):
        if _uid(ktc) not in templates:
            continue
        try:
            cfg = kwargs_to_gemm(ktc.params.to_kwargs())
        except (ValueError, TypeError):
            continue  # outside the model's space: benchmarked as Inductor would
        idx.append(i)
        cfgs.append(cfg)
    has_aten = any((_uid(c) or "").startswith("aten::") for c in choices)
    sure_rule = op_name in BMM_OPS and bmm_sure_gain is not None
    if not idx or (len(idx) <= top_k and not ((cublas_margin is not None or sure_rule) and has_aten)):
        return choices
    try:  # float32: TF32 as the ranked configs have it
        prob = problem_from_kernel_inputs(kernel_inputs, template_allow_tf32([choices[i] for i in idx]))
    except ValueError:
        return choices  # a problem the model does not cover (int8, 4-D, ...): Inductor's default
    if prob.batch > 1 and not predictor.has_bmm:
        return choices  # no bmm heads: Inductor's own autotuning
    best = rank_positions(predictor, prob, cfgs, top_k)
    keep, ranked = {idx[j] for j, _ in best}, set(idx)
    if (cublas_margin is not None or sure_rule) and has_aten and predictor.has_cublas:
        # a bmm: the aten::bmm time the model's call implies (perfmodel.serve.bmm.aten_call_ms)
        aten = bmm.aten_call_ms(predictor, prob, best[0][1]) if prob.batch > 1 else predictor.predict_cublas(prob)
        if triton_dropped(aten, best[0][1], cublas_margin):
            keep = set()
        elif sure_rule and bmm_sure(aten, best[0][1], bmm_sure_gain):
            alone = idx[best[0][0]]
            return [c for i, c in enumerate(choices)
                    if i == alone or not (i in ranked or (_uid(c) or "").startswith("aten::"))]
    return [c for i, c in enumerate(choices) if i not in ranked or i in keep]


def prefer_bias_addmm(choices: list, op_name: str) -> list:
    """An addmm's choices without aten::addmm where aten::bias_addmm is offered too. Under max-autotune Inductor
    hands aten::addmm the bias expanded to [M, N]: ATen copies it into the output and runs the GEMM with
    beta=1, where aten::bias_addmm passes the 1-D bias to cuBLASLt's epilogue, default mode's kernel (the
    whole-model set-up keeps it alone for the same reason: serve.compile.DEFAULT_ATEN). Inductor's benchmark
    of the two favours aten::addmm (on BERT-large's 6144x1024x1024 projections 0.043-0.056 ms against
    0.053-0.075 ms), which then ran its copies in the step: under this hook BERT-large stepped 3.058 / 3.096 ms
    against stock max-autotune's 2.975 / 2.961 and the set-up's 2.923 / 2.909 (docs/benchmarks.md)."""
    if op_name != "addmm":
        return choices
    uids = [_uid(c) for c in choices]
    if "aten::bias_addmm" not in uids or "aten::addmm" not in uids:
        return choices
    return [c for c, u in zip(choices, uids) if u != "aten::addmm"]


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


def _pad_hook(predictor: Predictor, original: Any) -> Any:
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
                    with _lock:
                        _installed.setdefault("pad_decisions", collections.deque(maxlen=PAD_LOG_SIZE)).append(
                            (pp, decision))
                    return decision.should_pad
            if op is torch.ops.aten.bmm and predictor.has_bmm and _triton_mm_in_play() \
                    and not torch._inductor.config.force_shape_pad:
                prob = bmm_problem_from_match(mat1, mat2)
                if prob is not None:
                    from torch.utils._mode_utils import no_dispatch

                    with no_dispatch():
                        unpadded, triton_ms, aten_ms = bmm.leave_unpadded(predictor, prob, _configs_in_play())
                    if unpadded:  # the Triton bmm template runs the shape as it is: no pad copies
                        with _lock:
                            _installed.setdefault("bmm_pad_decisions", collections.deque(maxlen=PAD_LOG_SIZE)).append(
                                (prob, False, triton_ms, aten_ms))
                        return False
        except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
            _warn_once(f"pad:{type(exc).__name__}", f"could not decide padding with the model ({type(exc).__name__}: "
                                                    f"{exc}); using Inductor's pad_mm benchmark")
        return original(match, mat1, mat2, op, input)

    _should_pad.perfmodel = predictor
    return _should_pad


def _handler_class() -> type:
    from torch._inductor.choices import InductorChoices

    class PerfModelChoices(InductorChoices):
        """InductorChoices that prunes Triton mm configs with the perfmodel Predictor."""

        def __init__(self, predictor: Predictor, top_k: int, ops: Sequence[str], templates: Sequence[str],
                     cublas_margin: float | None, bmm_top_k: int | None = None,
                     bmm_sure_gain: float | None = None) -> None:
            super().__init__()
            self.perfmodel = predictor
            self.perfmodel_top_k = top_k
            self.perfmodel_bmm_top_k = top_k if bmm_top_k is None else bmm_top_k
            self.perfmodel_ops = tuple(ops)
            self.perfmodel_templates = tuple(templates)
            self.perfmodel_cublas_margin = cublas_margin
            self.perfmodel_bmm_sure_gain = bmm_sure_gain

        def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                       kwarg_overrides=None):
            choices = super()._finalize_template_configs(template_choices, kernel_inputs, templates, op_name,
                                                         kwarg_overrides)
            try:
                top_k = self.perfmodel_bmm_top_k if op_name in BMM_OPS else self.perfmodel_top_k
                return filter_template_choices(choices, kernel_inputs, op_name, self.perfmodel,
                                               top_k, ops=self.perfmodel_ops,
                                               templates=self.perfmodel_templates,
                                               cublas_margin=self.perfmodel_cublas_margin,
                                               bmm_sure_gain=self.perfmodel_bmm_sure_gain)
            # Inductor's private structures change between releases; a mismatch here must not break
            # the user's compile, so fall back to the unfiltered choices and say so once.
            except (AttributeError, TypeError, KeyError, IndexError, ValueError, AssertionError,
                    RuntimeError) as exc:
                _warn_once(f"filter:{type(exc).__name__}",
                           f"could not rank Inductor's {op_name} choices ({type(exc).__name__}: {exc}); "
                           "using Inductor's default choices")
                return choices

    return PerfModelChoices


def _check_device(predictor: Predictor) -> None:
    """A model ranks configs for the GPUs it was trained on; say so once if this one differs."""
    from .loading import live_device_spec, model_devices

    live = live_device_spec()
    if live is not None and live not in model_devices(predictor.bundle):
        _warn_once("device", f"the model was trained for {', '.join(model_devices(predictor.bundle))}, "
                             f"this GPU is {live!r}: its rankings may not transfer")
    elif live is not None and live != predictor.device:
        _warn_once("device", f"the predictor was loaded for {predictor.device}, this GPU is {live!r}, which the "
                             f"model also knows: load it with device=None (or {live!r}) to predict for this GPU")


def install(top_k: int = 5, predictor: Predictor | None = None, *, model: Any = None, backend: str | None = None,
            ops: Sequence[str] = RANKED_OPS, templates: Sequence[str] = RANKED_TEMPLATES,
            cublas_margin: float | None = CUBLAS_MARGIN, pad: bool = False, kernel: str | None = None,
            bmm_top_k: int | None = BMM_TOP_K, bmm_sure_gain: float | None = BMM_SURE_GAIN) -> bool:
    """Install the hook in this thread. ops / templates: what it ranks (default: mm, addmm, bmm, baddbmm and
    their Triton templates; a bmm is ranked only by a model with bmm heads). top_k: the Triton mm configs kept
    per mm/addmm; bmm_top_k: the Triton bmm configs kept per bmm/baddbmm (default BMM_TOP_K, 1; None: top_k).
    bmm_sure_gain: a bmm/baddbmm whose aten::bmm time (as the model's call implies it) is predicted at least
    this fraction slower than the best ranked config keeps that config alone, without aten, so nothing is
    benchmarked (default BMM_SURE_GAIN, 0.2; None: never).
    predictor: a loaded Predictor (default: Predictor.load(model, backend=backend), loaded now so that a
    missing model fails here, not inside a compile).
    kernel: the kernel mode to rank for (Predictor.with_kernel); None: "inductor" -- the mm template as
    Inductor compiles it, for static shapes -- when the model has a config network or a static head, else the
    predictor's own.
    cublas_margin: drop the Triton mm choices when cuBLAS's predicted time (the cuBLAS head's) x
    (1 + cublas_margin) is below the best ranked config's among those Inductor offers
    (perfmodel.serve.decisions.triton_dropped): predicted times only, never the call head behind
    Candidates.prefer_cublas -- 0 drops Triton wherever cuBLAS is predicted faster, a positive margin
    keeps Triton unless cuBLAS is predicted that much faster, a negative one (> -1) drops it unless Triton
    is predicted that much faster. None always keeps the top_k Triton configs. Default CUBLAS_MARGIN
    (-0.05); docs/benchmarks.md measures the trade.
    pad: also decide Inductor's pad_mm padding with the model (process-wide; needs a pad head).
    Returns False (after one warning) when this torch lacks the private API the hook needs."""
    top_k = _check_top_k(top_k)
    if bmm_top_k is not None:
        bmm_top_k = _check_top_k(bmm_top_k, "bmm_top_k")
    if cublas_margin is not None and not (isinstance(cublas_margin, (int, float)) and not isinstance(cublas_margin, bool)
                                          and -1.0 < cublas_margin < float("inf")):
        raise ValueError(f"cublas_margin: expected None or a number > -1, got {cublas_margin!r}")
    check_bmm_sure_gain(bmm_sure_gain)
    problem = check_torch_api()
    if problem is not None:
        _warn_once("api", f"{problem}; Inductor's default autotuning is left in place")
        return False
    loaded = predictor is None
    if loaded:
        predictor = Predictor.load(model, backend=backend)
    elif not isinstance(predictor, Predictor):
        raise TypeError(f"predictor: expected a serve.Predictor, got {type(predictor).__name__}")
    if kernel is None:
        kernel = "inductor" if predictor.has_static else predictor.kernel
    if loaded and backend is None and kernel != predictor.kernel:
        predictor = Predictor.load(model, kernel=kernel)  # the backend that serves the mode (Predictor.load)
    predictor = predictor.with_kernel(kernel)
    if not isinstance(pad, bool):
        raise TypeError(f"pad: expected a bool, got {type(pad).__name__}")
    if pad and not predictor.has_pad:
        raise ValueError(f"pad: the model {predictor.source} has no pad head")
    _check_device(predictor)
    from torch._inductor.virtualized import V

    handler = _handler_class()(predictor, top_k, ops, templates, cublas_margin, bmm_top_k, bmm_sure_gain)
    with _lock:
        if pad:
            from torch._inductor.fx_passes import pad_mm

            current = pad_mm._should_pad
            if "pad_original" not in _installed:
                _installed["pad_original"] = current
            pad_mm._should_pad = _pad_hook(predictor, _installed["pad_original"])
        elif "pad_original" in _installed:  # re-install without pad: Inductor's own decision again
            from torch._inductor.fx_passes import pad_mm

            pad_mm._should_pad = _installed.pop("pad_original")
        if "handler" in _installed:
            prior = _installed["prior"]  # re-install: keep the handler from before the first install
        else:
            prior = V.choices  # this thread's handler (Inductor creates its default on first access)
            if type(prior).__name__ != "InductorChoices" and not getattr(prior, "perfmodel", None):
                _warn_once("custom", f"replacing a custom Inductor choices handler ({type(prior).__name__})")
        V.set_choices_handler(handler)
        _installed.update(handler=handler, prior=prior)
        if "grouped" in _installed:  # re-install: the grouped GEMMs' wrap of the earlier predictor goes first
            _installed.pop("grouped").__exit__(None, None, None)
        _installed["grouped"] = grouped.installed(predictor, top_k=top_k)  # MoE grouped GEMMs (serve/grouped.py)
        _installed["grouped"].__enter__()
    return True


def uninstall() -> bool:
    """Restore the choices handler from before install(); False when nothing was installed."""
    with _lock:
        if "handler" not in _installed:
            return False
        from torch._inductor.virtualized import V

        V.set_choices_handler(_installed["prior"])
        if "grouped" in _installed:
            _installed["grouped"].__exit__(None, None, None)
        if "pad_original" in _installed:
            from torch._inductor.fx_passes import pad_mm

            pad_mm._should_pad = _installed["pad_original"]
        _installed.clear()
    return True


def is_installed() -> bool:
    with _lock:
        return "handler" in _installed


def bmm_pad_decisions() -> list:
    """The bmm pad decisions the model made since install(pad=True), oldest first (the most recent
    PAD_LOG_SIZE): (GemmProblem, padded -- always False: where the model keeps Triton the bmm is left
    unpadded; elsewhere Inductor's pad_mm benchmark decides, unlogged --, the best config's predicted ms,
    aten::bmm's as the model's call implies it)."""
    with _lock:
        return list(_installed.get("bmm_pad_decisions", []))


def pad_decisions() -> list:
    """(PadProblem, PadDecision) of the pad_mm decisions the model made since install(pad=True), oldest
    first: the most recent PAD_LOG_SIZE of them."""
    with _lock:
        return list(_installed.get("pad_decisions", []))


def current_handler() -> Any:
    """The installed PerfModelChoices instance, or None."""
    with _lock:
        return _installed.get("handler")


@contextlib.contextmanager
def installed(top_k: int = 5, predictor: Predictor | None = None, **kwargs: Any) -> Iterator[bool]:
    """`with installed(top_k=5): torch.compile(...)(...)` -- install for the block, then restore.
    Yields whether the hook is active."""
    ok = install(top_k, predictor, **kwargs)
    try:
        yield ok
    finally:
        if ok:
            uninstall()
