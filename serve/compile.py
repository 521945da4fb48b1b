"""Whole-model torch.compile with perfmodel: default mode's lowering, GEMM autotuning only where the model
expects a gain.

    import perfmodel.serve.compile as pc
    compiled = pc.compile(model)              # like torch.compile(model, mode="reduce-overhead"), plus the model
    compiled(x)                               # the first call compiles
    print(pc.summary())                       # what the model decided, GEMM by GEMM

Stock max-autotune benchmarks every Triton config of every GEMM, bmm and convolution, and coordinate-descent
tunes every pointwise and reduction kernel at its first run; on whole models most of that buys nothing over
default mode (docs/benchmarks.md, "Whole models"). The set-up here compiles as default mode does
(CUDA graphs, no coordinate descent, no pointwise/reduction autotuning) with Inductor's GEMM templates
enabled (`max_autotune_gemm`), and an InductorChoices handler that decides, per mm/addmm -- and per
bmm/baddbmm where the model has bmm heads (Inductor's bmm template against aten::bmm / aten::baddbmm):

- the model's best Triton config (its kernel as Inductor compiles it) predicted faster than cuBLAS by
  `triton_gain` or more: keep the model's top_k Triton configs, beside aten's choice when keep_aten (Inductor
  then benchmarks those few) -- or alone (no benchmark at all);
- otherwise: aten's own choice alone, as default mode lowers it (no benchmark);
- a bmm/baddbmm whose aten time (as the model's call implies it) is predicted at least `bmm_sure_gain`
  slower than the best ranked config: that config alone, no aten choice (no benchmark).

Convolutions keep default mode's lowering whole: under `max_autotune_gemm` Inductor would lower a
channels-last 1x1 convolution as an mm (kernel/conv.py, convert_1x1_conv_to_mm); the set-up lowers it as a
convolution, as default mode does, unless Policy(conv_1x1_as_mm=True). With pad=True the pad_mm pass's
padding benchmark is the model's pad decision too. A grouped GEMM (MoE experts, torch._grouped_mm) keeps the
model's top 2 of Inductor's triton_grouped_mm configs beside aten where the model has a grouped head, else
aten's _grouped_mm alone (serve/grouped.py). Every other templated op (convolution, mm_plus_mm, ...;
bmm and baddbmm with a model without bmm heads) keeps aten's choice alone, as default mode has it.

Private Inductor APIs move between releases: the handler checks them (serve.inductor.check_torch_api) and a
failure inside it falls back to Inductor's choices with one warning.
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

from perfmodel.configs import inductor_default_configs
from perfmodel.schema import GemmConfig, GemmProblem

from . import bmm, grouped
from .decisions import BMM_SURE_GAIN, bmm_sure, check_bmm_sure_gain, triton_expected_gain
from .predictor import Predictor, _check_top_k
from .triton_hook import kwargs_to_gemm, rank_positions

RANKED_OPS = ("mm", "addmm", "bmm", "baddbmm")
TRITON_MM = "triton::mm"
# The Triton template the handler ranks for each op: Inductor's mm template, and its bmm template (whose configs
# come from the same heuristics and map to the same GemmConfig)
TRITON_TEMPLATE = {"mm": TRITON_MM, "addmm": TRITON_MM, "bmm": "triton::bmm", "baddbmm": "triton::bmm"}
BMM_OPS = ("bmm", "baddbmm")
# The aten choice that gives default mode's kernel, in order of preference. Under max_autotune_gemm Inductor
# hands aten::addmm the bias expanded to [M, N]: ATen then copies the bias into the output and runs the GEMM
# with beta=1 (on the H100, GPT-2's 48 addmm bias copies cost 0.61 ms of a 3.3 ms step), where default mode
# passes the 1-D bias and cuBLASLt adds it in the GEMM's epilogue -- which is aten::bias_addmm.
DEFAULT_ATEN = {"mm": ("aten::mm",), "addmm": ("aten::bias_addmm", "aten::addmm"), "bmm": ("aten::bmm",),
                "baddbmm": ("aten::baddbmm",)}

# Inductor options of the set-up: default mode (reduce-overhead's CUDA graphs) plus the GEMM templates.
OPTIONS = {
    "triton.cudagraphs": True,
    "max_autotune": False,
    "max_autotune_pointwise": False,
    "coordinate_descent_tuning": False,
    "max_autotune_gemm": True,
    "max_autotune_gemm_backends": "ATEN,TRITON",
    # convolutions keep aten's kernel, as in default mode (their Triton template would be benchmarked)
    "max_autotune_conv_backends": "ATEN",
}

# Keep Triton only where the model predicts its best config at least this much faster than cuBLAS
# (a fraction): 0 keeps it wherever it is predicted faster at all.
TRITON_GAIN = 0.0
# Triton configs kept beside aten where Triton is kept. Three, not one: on the GPT-2 training step the lm head's
# weight gradient ran 1.97 ms with the model's top-1 config and 1.05 ms with its third (stock's best); on the
# H100 the set-up's step with three was 0.892 of default mode's against 0.972 with one (the training step
# counts as tuned on for this rule). Only the GEMMs where Triton is kept pay for it: a few more kernels
# compiled and benchmarked.
TOP_K = 3
# Triton bmm configs kept per bmm/baddbmm (Policy.bmm_top_k), each compiled and benchmarked beside aten::bmm.
# Chosen on BERT-large, T5-base and Swin-T (H100, benchmarks/model_bench.py, runs s13/s13b, both orders):
# one config against three cost BERT 1 % of step time (1.051 vs 1.063 of default mode's) and saved 3.1 and
# 1.1 s of its compile (1.26/1.71x default mode's against 1.80/2.00x); T5 and Swin-T step alike.
BMM_TOP_K = 1


@dataclass(frozen=True)
class Policy:
    """How the handler decides. triton_gain: keep Triton where predicted >= this fraction faster than cuBLAS
    (inf: never). top_k: Triton configs kept (default TOP_K = 3; 1 without keep_aten). keep_aten: keep aten's
    choice beside them (Inductor benchmarks the few kept) or not (no benchmark: the model's top-1 is used as it
    is). conv_1x1_as_mm: let Inductor lower
    channels-last 1x1 convolutions as mm (then ranked like any mm), as max_autotune_gemm does; off, they stay
    convolutions, as in default mode. bmm_top_k: Triton configs kept for a bmm/baddbmm (default BMM_TOP_K, 1;
    None: top_k); each kept one is compiled and benchmarked. bmm_sure_gain: a bmm/baddbmm whose aten::bmm time
    (as the model's call implies it) is predicted at least this fraction slower than the best ranked config
    keeps that config alone, without aten (no benchmark; default BMM_SURE_GAIN, 0.2; None: never)."""

    triton_gain: float = TRITON_GAIN
    top_k: int | None = None           # None: TOP_K with keep_aten, else 1
    keep_aten: bool = True
    conv_1x1_as_mm: bool = False
    bmm_top_k: int | None = BMM_TOP_K  # Triton configs kept for a bmm/baddbmm; None: top_k
    bmm_sure_gain: float | None = BMM_SURE_GAIN  # a bmm's best config alone (no aten, no benchmark) from this gain

    def __post_init__(self) -> None:
        if self.top_k is None:
            object.__setattr__(self, "top_k", TOP_K if self.keep_aten is True else 1)
        _check_top_k(self.top_k)
        if self.bmm_top_k is not None:
            _check_top_k(self.bmm_top_k, "bmm_top_k")
            if not self.keep_aten and self.bmm_top_k != 1:
                raise ValueError("bmm_top_k: without keep_aten only the model's top-1 config can be used")
        check_bmm_sure_gain(self.bmm_sure_gain)
        if isinstance(self.triton_gain, bool) or not isinstance(self.triton_gain, (int, float)) \
                or not self.triton_gain > -1.0:
            raise ValueError(f"triton_gain: expected a number > -1 (or inf), got {self.triton_gain!r}")
        for name in ("keep_aten", "conv_1x1_as_mm"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got {type(getattr(self, name)).__name__}")
        if not self.keep_aten and self.top_k != 1:
            raise ValueError("top_k: without keep_aten only the model's top-1 config can be used (top_k=1)")


@dataclass
class GemmDecision:
    """One mm/addmm/bmm/baddbmm the handler saw: the problem (with its batch for a bmm), the model's times
    (cublas_ms: for a bmm, the aten::bmm time the model's call implies), what it kept."""

    op: str
    problem: dict[str, Any]
    cublas_ms: float | None
    triton_ms: float | None
    triton: bool                       # Triton configs kept
    configs: list[str] = field(default_factory=list)   # the kept configs, fastest predicted first
    choices_in: int = 0                # choices Inductor offered (all of this op's calls)
    choices_kept: int = 0
    sure: bool = False                 # a bmm's best config kept alone (Policy.bmm_sure_gain): not benchmarked


def decide(predictor: Predictor, prob: GemmProblem, configs: Sequence[GemmConfig] | None,
           policy: Policy) -> tuple[bool, list[tuple[int, float]], float | None]:
    """(keep Triton, the top_k (position in configs, predicted ms), cuBLAS predicted ms) for one GEMM.
    configs: the Triton configs Inductor offers (None: Inductor's default list). For a bmm (batch > 1) the
    aten time is aten::bmm's as the model's call implies it (serve.bmm.aten_call_ms)."""
    cfgs = list(configs) if configs is not None else list(inductor_default_configs())
    top_k = policy.bmm_top_k if prob.batch > 1 and policy.bmm_top_k is not None else policy.top_k
    best = rank_positions(predictor, prob, cfgs, top_k) if cfgs else []
    if not best:
        return False, [], None
    if prob.batch > 1:  # a bmm: the aten::bmm time the model's call implies (perfmodel.serve.bmm.aten_call_ms)
        cublas = bmm.aten_call_ms(predictor, prob, best[0][1]) if math.isfinite(best[0][1]) else None
        return triton_expected_gain(cublas, best[0][1], policy.triton_gain) and cublas is not None, best, cublas
    cublas = predictor.predict_cublas(prob) if predictor.has_cublas else None
    return triton_expected_gain(cublas, best[0][1], policy.triton_gain), best, cublas


def kept_alone(prob: GemmProblem, keep: bool, best: list[tuple[int, float]], aten_ms: float | None,
               policy: Policy) -> bool:
    """Whether a decision of decide() (keep, best, aten_ms) keeps a bmm's best config alone, without aten
    (Policy.bmm_sure_gain, decisions.bmm_sure): then nothing is benchmarked."""
    return keep and prob.batch > 1 and bmm_sure(aten_ms, best[0][1], policy.bmm_sure_gain)


def _uid(choice: Any) -> str:
    return str(getattr(getattr(choice, "template", None), "uid", None) or "")


def filter_choices(choices: list, op_name: str, keep_triton: bool, positions: Sequence[int], policy: Policy,
                   alone: bool = False) -> list:
    """The KernelTemplateChoices of one _finalize_template_configs call that the set-up keeps: the op's Triton
    template's choices (TRITON_TEMPLATE: triton::mm, triton::bmm) at `positions` (among this call's choices of
    that template) when keep_triton and the op is ranked;
    default mode's aten choice (DEFAULT_ATEN: aten::bias_addmm over aten::addmm), unless this call keeps Triton
    without keep_aten or `alone` (a bmm the model is sure of); nothing else (decompose-k, TMA/persistent and
    contiguous-subgraph templates, the other aten variants, other ops' Triton templates).
    Never returns an empty list from a non-empty one: then Inductor's choices are left as they are."""
    uids = [_uid(c) for c in choices]
    preferred = DEFAULT_ATEN.get(op_name)
    aten_pick = next((u for u in preferred if u in uids), None) if preferred else None
    template = TRITON_TEMPLATE.get(op_name, TRITON_MM)
    tri = [c for c, u in zip(choices, uids) if u == template] if op_name in RANKED_OPS and keep_triton else []
    kept_tri = [c for j, c in enumerate(tri) if j in set(positions)]
    out = []
    for c, uid in zip(choices, uids):
        if uid == template:
            if any(c is k for k in kept_tri):
                out.append(c)
        elif uid.startswith("aten::") and (aten_pick is None or uid == aten_pick):
            if (policy.keep_aten and not alone) or not kept_tri:
                out.append(c)
    return out if out else choices


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decisions: dict[tuple[str, GemmProblem], GemmDecision] = {}
        self.other_ops: dict[str, int] = {}
        self.errors: list[str] = []


_state = _State()


@functools.cache
def _handler_class() -> type:
    from torch._inductor.choices import InductorChoices

    from .inductor import problem_from_kernel_inputs, template_allow_tf32

    class RecommendedChoices(InductorChoices):
        """InductorChoices of perfmodel.serve.compile: see the module docstring."""

        def __init__(self, predictor: Predictor, policy: Policy) -> None:
            super().__init__()
            self.perfmodel = predictor
            self.policy = policy

        def _decide(self, op_name: str, kernel_inputs: Any, cfgs: list[GemmConfig],
                    tf32: bool | None = None) -> tuple[GemmDecision, list[int]]:
            """The decision for this call's Triton configs cfgs (recorded for summary()), and the kept configs'
            positions in cfgs; a float32 problem on TF32 as tf32 says (the configs' ALLOW_TF32; None: the matmul
            setting). A call without Triton choices (addmm's aten call) records the model's view on Inductor's
            default list unless the op's Triton call was seen already."""
            prob = problem_from_kernel_inputs(kernel_inputs, tf32)
            key = (op_name, prob)
            keep, best, cublas = decide(self.perfmodel, prob, cfgs or None, self.policy)
            sure = kept_alone(prob, keep, best, cublas, self.policy)
            best = best[:1] if sure else best
            listed = cfgs or list(inductor_default_configs())
            d = GemmDecision(op=op_name, problem=asdict(prob), cublas_ms=cublas,
                             triton_ms=best[0][1] if best else None, triton=keep and bool(cfgs),
                             configs=[str(listed[i]) for i, _ in best] if keep and cfgs else [],
                             sure=sure and bool(cfgs))
            with _state.lock:
                old = _state.decisions.get(key)
                if old is None or cfgs:
                    if old is not None:
                        d.choices_in, d.choices_kept = old.choices_in, old.choices_kept
                    _state.decisions[key] = d
                else:
                    d = old
            return d, ([i for i, _ in best] if keep and cfgs else [])

        def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                       kwarg_overrides=None):
            choices = super()._finalize_template_configs(template_choices, kernel_inputs, templates, op_name,
                                                         kwarg_overrides)
            try:
                if op_name not in RANKED_OPS or (op_name in BMM_OPS and not self.perfmodel.has_bmm):
                    with _state.lock:
                        _state.other_ops[op_name] = _state.other_ops.get(op_name, 0) + 1
                    return filter_choices(choices, op_name, False, [], self.policy)
                tri = [c for c in choices if _uid(c) == TRITON_TEMPLATE[op_name]]
                cfgs: list[GemmConfig] = []
                for c in tri:
                    try:
                        cfgs.append(kwargs_to_gemm(c.params.to_kwargs()))
                    except (ValueError, TypeError):
                        # outside the model's space: this call is left as default mode would have it
                        return filter_choices(choices, op_name, False, [], self.policy)
                try:
                    d, positions = self._decide(op_name, kernel_inputs, cfgs, template_allow_tf32(tri))
                except ValueError:  # a problem the model does not cover: default mode's choice
                    return filter_choices(choices, op_name, False, [], self.policy)
                out = filter_choices(choices, op_name, bool(positions), positions, self.policy, d.sure)
                with _state.lock:
                    d.choices_in += len(choices)
                    d.choices_kept += len(out)
                return out
            except (AttributeError, TypeError, KeyError, IndexError, ValueError, AssertionError,
                    RuntimeError) as exc:
                with _state.lock:
                    _state.errors.append(f"{op_name}: {type(exc).__name__}: {exc}")
                from .inductor import _warn_once

                _warn_once(f"compile:{type(exc).__name__}", f"could not decide {op_name} with the model "
                                                            f"({type(exc).__name__}: {exc}); Inductor's choices kept")
                return choices

    return RecommendedChoices


@contextlib.contextmanager
def _default_conv_lowering() -> Iterator[None]:
    """For the block (process-wide), Inductor's convolution lowering runs with max_autotune_gemm off: a 1x1
    convolution stays a convolution (cuDNN), as in default mode, instead of becoming an mm."""
    import torch
    from torch._inductor import config, lowering

    conv = lowering.lowerings.get(torch.ops.aten.convolution.default)
    if conv is None or getattr(conv, "perfmodel_default_conv", False):  # none, or this block's already in place
        yield
        return

    def convolution(*args: Any, **kwargs: Any) -> Any:
        with config.patch(max_autotune_gemm=False):
            return conv(*args, **kwargs)

    convolution.perfmodel_default_conv = True  # type: ignore[attr-defined]

    keys = [k for k, v in lowering.lowerings.items() if v is conv]
    for k in keys:
        lowering.lowerings[k] = convolution
    try:
        yield
    finally:
        for k in keys:
            if lowering.lowerings.get(k) is convolution:
                lowering.lowerings[k] = conv


def _resolve(predictor: Predictor | None, policy: Policy | None, pad: bool, model: Any = None,
             backend: str | None = None) -> tuple[Predictor, Policy]:
    from . import inductor

    problem = inductor.check_torch_api()
    if problem is not None:
        raise RuntimeError(f"perfmodel.serve.compile: {problem}")
    policy = policy or Policy()
    if predictor is None:
        predictor = Predictor.load(model, backend=backend)
    elif not isinstance(predictor, Predictor):
        raise TypeError(f"predictor: expected a serve.Predictor, got {type(predictor).__name__}")
    if predictor.has_static:
        predictor = predictor.with_kernel("inductor")
    if pad and not predictor.has_pad:
        raise ValueError(f"pad: the model {predictor.source} has no pad head")
    return predictor, policy


@contextlib.contextmanager
def _installed(predictor: Predictor, policy: Policy, pad: bool) -> Iterator[None]:
    """The choices handler (this thread), default mode's convolution lowering and, with pad, the model's
    pad_mm decision (both process-wide) for the block."""
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.virtualized import V

    from . import inductor

    prior = V.choices
    V.set_choices_handler(_handler_class()(predictor, policy))
    pad_prior = pad_mm._should_pad
    if pad:
        pad_mm._should_pad = inductor._pad_hook(predictor, pad_prior)
    try:
        with contextlib.nullcontext() if policy.conv_1x1_as_mm else _default_conv_lowering(), \
                grouped.installed(predictor):
            yield
    finally:
        V.set_choices_handler(prior)
        pad_mm._should_pad = pad_prior


@contextlib.contextmanager
def recommended(predictor: Predictor | None = None, *, policy: Policy | None = None, pad: bool = True,
                model: Any = None, backend: str | None = None) -> Iterator[Predictor]:
    """Install the set-up's choices handler (this thread), default mode's convolution lowering and, with pad,
    the model's pad_mm decision (process-wide) for the block; Inductor's options are torch.compile's (see
    compile(), OPTIONS). A backward graph compiled after the block (a training step's first backward, which
    autograd may run on another thread) does not see it: compile() covers both."""
    predictor, policy = _resolve(predictor, policy, pad, model, backend)
    with _installed(predictor, policy, pad):
        yield predictor


def _backend(options: dict[str, Any], predictor: Predictor, policy: Policy, pad: bool) -> Any:
    """torch.compile's Inductor backend with the set-up installed around every graph compile: the forward's
    (with the pad decision, taken in the joint graph) and the backward's, which AOTAutograd compiles at the
    first backward call, on autograd's thread."""
    import torch
    from torch._inductor import compile_fx as cfx

    class PerfmodelBackend(torch._TorchCompileInductorWrapper):  # type: ignore[name-defined]
        def __call__(self, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
            inner_compile = cfx.compile_fx_inner

            def inner(*args: Any, **kw: Any) -> Any:
                with _installed(predictor, policy, pad=False):
                    return inner_compile(*args, **kw)

            patches = {**self.config, **(kwargs.get("config_patches") or {})}
            with _installed(predictor, policy, pad):
                return cfx.compile_fx(model_, inputs_, inner_compile=inner, config_patches=patches)

    return PerfmodelBackend(None, options, None)


def compile(model: Any, *, predictor: Predictor | None = None, policy: Policy | None = None, pad: bool = True,
            options: dict[str, Any] | None = None, **compile_kwargs: Any) -> Any:
    """torch.compile(model) with the set-up: OPTIONS (plus `options`), and the choices handler, the
    convolution lowering and the pad decision installed around every graph compile (forward and backward,
    the first call's and any recompile's)."""
    import torch

    if "mode" in compile_kwargs or "backend" in compile_kwargs:
        name = "mode" if "mode" in compile_kwargs else "backend"
        raise ValueError(f"{name}: perfmodel.serve.compile sets Inductor's options itself (pass options=...)")
    opts = {**OPTIONS, **(options or {})}
    known = torch._inductor.config.get_config_copy()
    unknown = [k for k in opts if k not in known]
    if unknown:
        raise ValueError(f"options: this torch's Inductor has no {unknown}")
    pred, pol = _resolve(predictor, policy, pad)
    compiled = torch.compile(model, backend=_backend(opts, pred, pol, pad), **compile_kwargs)
    return CompiledModel(compiled, pred, pol, pad)


class CompiledModel:
    """What compile() returns: the torch.compile'd model (its backend installs the set-up), which passes any
    other attribute to it (eval(), parameters(), _orig_mod, ...)."""

    def __init__(self, compiled: Any, predictor: Predictor, policy: Policy, pad: bool) -> None:
        self.__dict__.update(_compiled=compiled, _predictor=predictor, _policy=policy, _pad=pad)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_compiled"], name)


def decisions() -> list[GemmDecision]:
    """The mm/addmm/bmm/baddbmm decisions made since the last reset(), in the order first seen."""
    with _state.lock:
        return list(_state.decisions.values())


def reset() -> None:
    with _state.lock:
        _state.decisions.clear()
        _state.other_ops.clear()
        _state.errors.clear()
    grouped.reset()


def summary() -> str:
    """What the set-up decided: one line per GEMM shape, and the ops left to aten."""
    ds = decisions()
    with _state.lock:
        other, errors = dict(_state.other_ops), list(_state.errors)
    lines = [f"perfmodel: {len(ds)} GEMM shapes; Triton kept on {sum(d.triton for d in ds)}, "
             f"aten (cuBLAS) alone on {sum(not d.triton for d in ds)}"]
    for d in ds:
        p = d.problem
        lay = ("T" if p["transpose_left"] else "N") + ("T" if p["transpose_right"] else "N")
        times = (f"{'aten::bmm' if d.op in BMM_OPS else 'cuBLAS'} {d.cublas_ms:.4f} ms, best Triton {d.triton_ms:.4f} ms" if d.cublas_ms is not None
                 and d.triton_ms is not None else "no prediction")
        what = f"Triton {', '.join(d.configs)}" + (" + aten" if d.choices_kept > len(d.configs) else "") \
            + (" (sure: not benchmarked)" if d.sure else "") if d.triton else "aten"
        batch = f"{p['batch']}x" if p.get("batch", 1) > 1 else ""
        lines.append(f"  {d.op} {batch}{p['m']}x{p['k']}x{p['n']} {p['dtype']} {lay}: {times} -> {what}")
    for g in grouped.decisions():
        what = (f"Triton {', '.join('x'.join(map(str, c[:3])) + f' s{c[3]} w{c[4]}' for c in g.kept)} + aten "
                f"(of {g.offered} configs)" if g.kept else f"aten _grouped_mm alone (of {g.offered} configs)")
        lines.append(f"  grouped_mm {g.g} experts, {g.m} rows x{g.k}x{g.n} {g.dtype}: {what}")
    if other:
        lines.append("  aten alone (not ranked): " + ", ".join(f"{k} x{v}" for k, v in sorted(other.items())))
    if errors:
        lines.append(f"  {len(errors)} fallbacks: {errors[0]}")
    return "\n".join(lines)
