"""Inductor hook: under max-autotune, compile and benchmark only the model's top-k Triton mm and bmm configs.

    from perfmodel.serve import inductor
    inductor.install(top_k=5)          # or: with inductor.installed(top_k=5): ...
    torch.compile(f, mode="max-autotune-no-cudagraphs")(a, b)
    inductor.uninstall()

The hook is the whole-model set-up's choices handler (perfmodel.serve.choices: one handler, one rule) under
max-autotune's policy (choices.MAX_AUTOTUNE, or hook_policy(...) of install()'s arguments), installed through
torch._inductor.virtualized.V.set_choices_handler in this thread. Per mm/addmm it keeps the top_k choices of the
Triton mm template ("triton::mm") by predicted time, per bmm/baddbmm the top bmm_top_k of Inductor's Triton bmm
template ("triton::bmm", by the model's bmm heads; a model without them leaves bmm to Inductor) -- none where
cuBLAS (aten::bmm) is predicted faster than the best of them by cublas_margin, and a bmm's best config alone
(no aten, no benchmark) where the model is sure of it. Every other choice (aten, decompose-k, TMA/persistent and
other templates, other ops) is max-autotune's, but for aten::addmm where aten::bias_addmm is offered too
(prefer_bias_addmm). For a dynamic compile, a GEMM of symbolic size is decided over the range it serves
(install(sizes=...); perfmodel.serve.gemm_decisions).

Private APIs move between torch releases: install() checks what it relies on and, when something is
missing, warns once and leaves Inductor's default behaviour (returns False). A failure inside the handler
at compile time also falls back to the unfiltered choices, with one warning.

With pad=True, install() also replaces the benchmark inside Inductor's pad_mm pass by the model's pad
decision (perfmodel.serve.pad_hook): process-wide (a module attribute), not per thread.

The choices handler is thread-local in Inductor: install in the thread that calls torch.compile.
A graph already in the FX graph cache is not recompiled, so the hook only affects fresh compiles.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Sequence

# The hook is the one choices handler (perfmodel.serve.choices) under max-autotune's policy; the names it had stay
# importable from here, as do the decisions' and the pad hook's.
from .choices import (BMM_OPS, BMM_TOP_K, HOOK_TOP_K, MAX_AUTOTUNE, MM_OPS, RANKED_OPS,  # noqa: F401
                      RANKED_TEMPLATES, TRITON_BMM_TEMPLATES, TRITON_MM_TEMPLATES, Policy, _uid, check_sizes,
                      handler_class, check_torch_api, prefer_bias_addmm, rank_positions, select)
from .decisions import (BMM_SURE_GAIN, CUBLAS_MARGIN, PAD_TRITON_MARGIN, bmm_sure,  # noqa: F401
                        check_bmm_sure_gain, gain_from_margin, hook_pad_decision, pad_copy_floor_ms, padded_path_ms,
                        triton_dropped, unpadded_triton_instead)
from .kernel_inputs import (fp32_matmul_on_tf32, kwargs_to_gemm, problem_from_kernel_inputs,  # noqa: F401
                            template_allow_tf32)
from .pad_hook import (PAD_LOG_SIZE, _configs_in_play, _match_operands, _triton_mm_in_play,  # noqa: F401
                       bmm_pad_decisions, bmm_problem_from_match, pad_decisions, pad_hook, pad_problem_from_match)
from . import grouped
from . import pad_hook as _pad
from .notices import warn_once
from .predictor import Predictor, _check_top_k

_lock = threading.Lock()
_installed: dict[str, Any] = {}  # "handler", "prior", "pad_original": guarded by _lock


def _warn_once(key: str, message: str) -> None:
    """An install-time message, once a process (serve/notices.py)."""
    warn_once(f"inductor:{key}", message, source="perfmodel.serve.inductor")


def hook_policy(top_k: int = HOOK_TOP_K, ops: Sequence[str] = RANKED_OPS, templates: Sequence[str] = RANKED_TEMPLATES,
                cublas_margin: float | None = CUBLAS_MARGIN, bmm_top_k: int | None = BMM_TOP_K,
                bmm_sure_gain: float | None = BMM_SURE_GAIN) -> Policy:
    """The max-autotune hook's Policy for install()'s arguments: MAX_AUTOTUNE with them (its defaults: MAX_AUTOTUNE
    itself). cublas_margin m keeps Triton where best <= cuBLAS x (1 + m): the one rule's gain -m / (1 + m)
    (decisions.gain_from_margin); None: always."""
    return Policy(triton_gain=None if cublas_margin is None else gain_from_margin(cublas_margin), top_k=top_k,
                  bmm_top_k=top_k if bmm_top_k is None else bmm_top_k, bmm_sure_gain=bmm_sure_gain,
                  lowering=MAX_AUTOTUNE.lowering, ops=tuple(ops), templates=tuple(templates))


def filter_template_choices(choices: list, kernel_inputs: Any, op_name: str, predictor: Predictor, top_k: int,
                            *, ops: Sequence[str] = RANKED_OPS, templates: Sequence[str] = RANKED_TEMPLATES,
                            cublas_margin: float | None = None, bmm_sure_gain: float | None = None) -> list:
    """What the hook keeps of one call's KernelTemplateChoices (choices.select under hook_policy(...)): the top_k
    of the ranked Triton templates by predicted time, every other choice unchanged and in Inductor's order. With
    cublas_margin set, the ranked templates go where cuBLAS's (aten::bmm's, for a bmm) predicted time x
    (1 + cublas_margin) is below the best of them (an aten choice must be present to fall back on). With
    bmm_sure_gain set, a bmm/baddbmm whose aten::bmm time (as the model's call implies it) is at least that
    fraction slower than the best ranked config keeps that config alone, without the aten choices. A bmm/baddbmm
    is left as Inductor has it where the model has no bmm heads. An addmm offered both aten kernels loses
    aten::addmm to aten::bias_addmm (prefer_bias_addmm)."""
    policy = hook_policy(top_k, ops, templates, cublas_margin, top_k, bmm_sure_gain)
    return select(choices, kernel_inputs, op_name, predictor, policy)


def _handler_class() -> Any:
    """The hook's handler with install()'s arguments: (predictor, top_k, ops, templates, cublas_margin, bmm_top_k,
    bmm_sure_gain) -> the one handler (choices.handler_class) under hook_policy(...)."""
    cls = handler_class()

    def make(predictor: Predictor, top_k: int, ops: Sequence[str], templates: Sequence[str],
             cublas_margin: float | None, bmm_top_k: int | None = None, bmm_sure_gain: float | None = None,
             sizes: Sequence[int] | None = None) -> Any:
        return cls(predictor, hook_policy(top_k, ops, templates, cublas_margin, bmm_top_k, bmm_sure_gain), sizes)

    return make


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


def install(top_k: int = HOOK_TOP_K, predictor: Predictor | None = None, *, model: Any = None,
            backend: str | None = None, ops: Sequence[str] = RANKED_OPS, templates: Sequence[str] = RANKED_TEMPLATES,
            cublas_margin: float | None = CUBLAS_MARGIN, pad: bool = False, kernel: str | None = None,
            bmm_top_k: int | None = BMM_TOP_K, bmm_sure_gain: float | None = BMM_SURE_GAIN,
            sizes: Sequence[int] | None = None) -> bool:
    """Install the hook in this thread: the one choices handler (perfmodel.serve.choices) under the max-autotune
    policy these arguments make (hook_policy; the defaults: MAX_AUTOTUNE). ops / templates: what it ranks
    (default: mm, addmm, bmm, baddbmm and their Triton templates; a bmm is ranked only by a model with bmm heads).
    top_k: the Triton mm configs kept per mm/addmm; bmm_top_k: the Triton bmm configs kept per bmm/baddbmm
    (default BMM_TOP_K, 1; None: top_k).
    bmm_sure_gain: a bmm/baddbmm whose aten::bmm time (as the model's call implies it) is predicted at least
    this fraction slower than the best ranked config keeps that config alone, without aten, so nothing is
    benchmarked (default BMM_SURE_GAIN, 0.2; None: never).
    predictor: a loaded Predictor (default: Predictor.load(model, backend=backend), loaded now so that a
    missing model fails here, not inside a compile).
    kernel: the kernel mode to rank for (Predictor.with_kernel); None: "inductor" -- the mm template as
    Inductor compiles it -- when the model has a config network or a static head, else the predictor's own.
    cublas_margin: drop the Triton mm choices when cuBLAS's predicted time (Predictor.predict_cublas, the one
    Candidates and the CLI show) x (1 + cublas_margin) is below the best ranked config's among those Inductor
    offers -- 0 drops Triton wherever cuBLAS is predicted faster, a
    positive margin keeps Triton unless cuBLAS is predicted that much faster, a negative one (> -1) drops it
    unless Triton is predicted that much faster. None always keeps the top_k Triton configs. Default
    CUBLAS_MARGIN (-0.05); docs/benchmarks.md measures the trade.
    pad: also decide Inductor's pad_mm padding with the model (process-wide; needs a pad head).
    sizes: for a dynamic compile, the sizes its dynamic dimension takes (positive ints; None: powers of two across
    the symbol's range): the GEMMs of symbolic size are decided over them (perfmodel.serve.gemm_decisions).
    Returns False (after one warning) when this torch lacks the private API the hook needs."""
    policy = _checked_policy(top_k, ops, templates, cublas_margin, bmm_top_k, bmm_sure_gain)
    sizes = check_sizes(sizes)
    if not isinstance(pad, bool):
        raise TypeError(f"pad: expected a bool, got {type(pad).__name__}")
    problem = check_torch_api()
    if problem is not None:
        _warn_once("api", f"{problem}; Inductor's default autotuning is left in place")
        return False
    predictor = _hook_predictor(predictor, model, backend, kernel)
    if pad and not predictor.has_pad:
        raise ValueError(f"pad: the model {predictor.source} has no pad head")
    _check_device(predictor)
    from torch._inductor.virtualized import V

    handler = handler_class()(predictor, policy, sizes)
    with _lock:
        _set_pad(predictor if pad else None)
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


def _checked_policy(top_k: Any, ops: Sequence[str], templates: Sequence[str], cublas_margin: Any, bmm_top_k: Any,
                    bmm_sure_gain: Any) -> Policy:
    """hook_policy(...) of install()'s arguments, each checked (errors name the argument)."""
    top_k = _check_top_k(top_k)
    if bmm_top_k is not None:
        bmm_top_k = _check_top_k(bmm_top_k, "bmm_top_k")
    if cublas_margin is not None and not (isinstance(cublas_margin, (int, float)) and not isinstance(cublas_margin, bool)
                                          and -1.0 < cublas_margin < float("inf")):
        raise ValueError(f"cublas_margin: expected None or a number > -1, got {cublas_margin!r}")
    check_bmm_sure_gain(bmm_sure_gain)
    return hook_policy(top_k, ops, templates, cublas_margin, bmm_top_k, bmm_sure_gain)


def _hook_predictor(predictor: Predictor | None, model: Any, backend: str | None, kernel: str | None) -> Predictor:
    """The predictor the hook ranks with: the given one or Predictor.load(model, backend=backend), for `kernel`."""
    loaded = predictor is None
    if loaded:
        predictor = Predictor.load(model, backend=backend)
    elif not isinstance(predictor, Predictor):
        raise TypeError(f"predictor: expected a serve.Predictor, got {type(predictor).__name__}")
    if kernel is None:
        kernel = "inductor" if predictor.has_static else predictor.kernel
    if loaded and backend is None and kernel != predictor.kernel:
        predictor = Predictor.load(model, kernel=kernel)  # the backend that serves the mode (Predictor.load)
    return predictor.with_kernel(kernel)


def _set_pad(predictor: Predictor | None) -> None:
    """pad_mm's decision: the model's (predictor) or, None, Inductor's own again (caller holds _lock)."""
    from torch._inductor.fx_passes import pad_mm

    if predictor is not None:
        _installed.setdefault("pad_original", pad_mm._should_pad)
        pad_mm._should_pad = pad_hook(predictor, _installed["pad_original"])
    elif "pad_original" in _installed:  # re-install without pad: Inductor's own decision again
        pad_mm._should_pad = _installed.pop("pad_original")


def uninstall() -> bool:
    """Restore the choices handler from before install() (and pad_mm's own decision); clears the pad log. False
    when nothing was installed."""
    with _lock:
        if "handler" not in _installed:
            return False
        from torch._inductor.virtualized import V

        V.set_choices_handler(_installed["prior"])
        if "grouped" in _installed:
            _installed["grouped"].__exit__(None, None, None)
        _set_pad(None)
        _installed.clear()
    _pad.clear_log()
    return True


def is_installed() -> bool:
    with _lock:
        return "handler" in _installed


def current_handler() -> Any:
    """The installed handler (perfmodel.serve.choices.handler_class()), or None."""
    with _lock:
        return _installed.get("handler")


@contextlib.contextmanager
def installed(top_k: int = HOOK_TOP_K, predictor: Predictor | None = None, **kwargs: Any) -> Iterator[bool]:
    """`with installed(top_k=5): torch.compile(...)(...)` -- install for the block, then restore.
    Yields whether the hook is active."""
    ok = install(top_k, predictor, **kwargs)
    try:
        yield ok
    finally:
        if ok:
            uninstall()
