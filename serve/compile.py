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
  slower than the best ranked config: that config alone, no aten choice (no benchmark);
- a GEMM of symbolic size (compile(model, dynamic=True, sizes=[...])): the same rule at every size of the range
  the compile serves -- the given sizes within it, else powers of two across it -- for one kernel that serves
  them all (perfmodel.serve.gemm_decisions); summary() says which range each decision covers.

The handler is perfmodel.serve.choices' (the max-autotune hook's too: one handler, one rule; the set-up's
Policy preset is choices.SETUP). Convolutions keep default mode's lowering whole: under `max_autotune_gemm`
Inductor would lower a channels-last 1x1 convolution as an mm (kernel/conv.py, convert_1x1_conv_to_mm); the
set-up lowers it as a convolution, as default mode does, unless Policy(conv_1x1_as_mm=True). With pad=True the
pad_mm pass's padding benchmark is the model's pad decision too (perfmodel.serve.pad_hook). A grouped GEMM (MoE
experts, torch._grouped_mm) is decided without a benchmark: the model's top-1 of Inductor's triton_grouped_mm
configs alone where the model has a grouped head (aten's _grouped_mm above grouped.ATEN_ABOVE rows per expert),
else aten's _grouped_mm alone (serve/grouped.py). Every other templated op
(convolution, mm_plus_mm, ...; bmm and baddbmm with a model without bmm heads) keeps aten's choice alone, as
default mode has it.

Private Inductor APIs move between releases: the handler checks them (serve.choices.check_torch_api) and a
failure inside it falls back to Inductor's choices with one warning.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

# The set-up is the one choices handler (perfmodel.serve.choices) under its SETUP policy; the names it had stay
# importable from here.
from .choices import (BMM_OPS, BMM_TOP_K, DEFAULT_ATEN, DETERMINISTIC, LOG, RANKED_OPS, SETUP, TOP_K,  # noqa: F401
                      TRITON_GAIN,
                      TRITON_MM, TRITON_TEMPLATE, GemmDecision, Policy, _uid, check_sizes, check_torch_api, decide,
                      filter_choices, handler_class, kept_alone)
from . import grouped
from . import specialize as specialize_mod
from .decisions import BMM_SURE_GAIN  # noqa: F401
from .pad_hook import pad_hook
from .predictor import Predictor

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


def _handler_class() -> type:
    """The one handler class (choices.handler_class): (predictor, policy, sizes=None)."""
    return handler_class()


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
    problem = check_torch_api()
    if problem is not None:
        raise RuntimeError(f"perfmodel.serve.compile: {problem}")
    policy = policy or SETUP
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a serve.compile.Policy, got {type(policy).__name__}")
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
def _installed(predictor: Predictor, policy: Policy, pad: bool, sizes: Sequence[int] | None = None
               ) -> Iterator[None]:
    """The choices handler (this thread), default mode's convolution lowering and, with pad, the model's
    pad_mm decision (both process-wide) for the block."""
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.virtualized import V

    prior = V.choices
    V.set_choices_handler(handler_class()(predictor, policy, sizes))
    pad_prior = pad_mm._should_pad
    if pad:
        pad_mm._should_pad = pad_hook(predictor, pad_prior)
    try:
        with contextlib.nullcontext() if policy.conv_1x1_as_mm else _default_conv_lowering(), \
                grouped.installed(predictor, alone=True):
            yield
    finally:
        V.set_choices_handler(prior)
        pad_mm._should_pad = pad_prior


@contextlib.contextmanager
def recommended(predictor: Predictor | None = None, *, policy: Policy | None = None, pad: bool = True,
                model: Any = None, backend: str | None = None, sizes: Sequence[int] | None = None
                ) -> Iterator[Predictor]:
    """Install the set-up's choices handler (this thread), default mode's convolution lowering and, with pad,
    the model's pad_mm decision (process-wide) for the block; Inductor's options are torch.compile's (see
    compile(), OPTIONS; sizes as there). A backward graph compiled after the block (a training step's first
    backward, which autograd may run on another thread) does not see it: compile() covers both."""
    sizes = check_sizes(sizes)
    predictor, policy = _resolve(predictor, policy, pad, model, backend)
    with _installed(predictor, policy, pad, sizes):
        yield predictor


def _backend(options: dict[str, Any], predictor: Predictor, policy: Policy, pad: bool,
             sizes: Sequence[int] | None = None) -> Any:
    """torch.compile's Inductor backend with the set-up installed around every graph compile: the forward's
    (with the pad decision, taken in the joint graph) and the backward's, which AOTAutograd compiles at the
    first backward call, on autograd's thread."""
    import torch
    from torch._inductor import compile_fx as cfx

    class PerfmodelBackend(torch._TorchCompileInductorWrapper):  # type: ignore[name-defined]
        def __call__(self, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
            inner_compile = cfx.compile_fx_inner

            def inner(*args: Any, **kw: Any) -> Any:
                with _installed(predictor, policy, False, sizes):
                    return inner_compile(*args, **kw)

            patches = {**self.config, **(kwargs.get("config_patches") or {})}
            with _installed(predictor, policy, pad, sizes):
                return cfx.compile_fx(model_, inputs_, inner_compile=inner, config_patches=patches)

    return PerfmodelBackend(None, options, None)


def compile(model: Any, *, predictor: Predictor | None = None, policy: Policy | None = None, pad: bool = True,
            options: dict[str, Any] | None = None, sizes: Sequence[int] | None = None, specialize: bool = False,
            deterministic: bool = False, **compile_kwargs: Any) -> Any:
    """torch.compile(model) with the set-up: OPTIONS (plus `options`), and the choices handler, the
    convolution lowering and the pad decision installed around every graph compile (forward and backward,
    the first call's and any recompile's). sizes: for a dynamic compile (dynamic=True, or sizes Dynamo made
    dynamic), the sizes the dynamic dimension takes -- positive ints: a linear layer's M, the tokens a step
    (batch x sequence); where several of a GEMM's dimensions are symbolic, the values of each symbol --; the
    GEMMs of symbolic size are decided over those within the range (None: powers of two across it; summary()
    says which). specialize=True (with sizes, for a dynamic compile): a call whose inputs' leading (batch) dimension
    equals one of sizes runs a compile of its own for that size (static decisions, that dimension static), made at
    its first such call; other sizes run the dynamic compile, decided over its range (serve/specialize.py). deterministic=True:
    the DETERMINISTIC policy (no benchmark: one choice per GEMM, the model's top-1 config or aten's kernel; the same
    kernels every compile); not with another policy."""
    import torch

    policy = _deterministic_policy(policy, deterministic)

    if "mode" in compile_kwargs or "backend" in compile_kwargs:
        name = "mode" if "mode" in compile_kwargs else "backend"
        raise ValueError(f"{name}: perfmodel.serve.compile sets Inductor's options itself (pass options=...)")
    sizes = check_sizes(sizes)
    opts = {**OPTIONS, **(options or {})}
    known = torch._inductor.config.get_config_copy()
    unknown = [k for k in opts if k not in known]
    if unknown:
        raise ValueError(f"options: this torch's Inductor has no {unknown}")
    if not isinstance(specialize, bool):
        raise TypeError(f"specialize: expected a bool, got {type(specialize).__name__}")
    if specialize and not sizes:
        raise ValueError("specialize: True needs sizes=[...], the batch sizes to compile on their own")
    pred, pol = _resolve(predictor, policy, pad)
    spec = sizes if specialize and compile_kwargs.get("dynamic") is not False else None
    # with compile sizes the dynamic graph serves the other sizes: its GEMMs are decided over its whole range
    compiled = torch.compile(model, backend=_backend(opts, pred, pol, pad, None if spec else sizes), **compile_kwargs)
    if spec:
        per_size_kwargs = {k: v for k, v in compile_kwargs.items() if k != "dynamic"}
        per_size = torch.compile(model, backend=_backend(opts, pred, pol, pad, None), dynamic=None, **per_size_kwargs)
        specialize_mod.ensure_recompile_limit(len(spec))
        compiled = specialize_mod.Dispatch(compiled, per_size, spec)
    return CompiledModel(compiled, pred, pol, pad, spec)


def _deterministic_policy(policy: Policy | None, deterministic: bool) -> Policy | None:
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected a bool, got {type(deterministic).__name__}")
    if not deterministic:
        return policy
    if policy is not None and policy != DETERMINISTIC:
        raise ValueError("deterministic: True sets policy=DETERMINISTIC; pass one or the other")
    return DETERMINISTIC


class CompiledModel:
    """What compile() returns: the torch.compile'd model (its backend installs the set-up), which passes any
    other attribute to it (eval(), parameters(), _orig_mod, ...)."""

    def __init__(self, compiled: Any, predictor: Predictor, policy: Policy, pad: bool,
                 sizes: Sequence[int] | None = None) -> None:
        self.__dict__.update(_compiled=compiled, _predictor=predictor, _policy=policy, _pad=pad, _sizes=sizes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)   # with compile sizes: specialize.Dispatch

    def __getattr__(self, name: str) -> Any:
        compiled = self.__dict__["_compiled"]
        if isinstance(compiled, specialize_mod.Dispatch):
            compiled = compiled.dynamic
        return getattr(compiled, name)


def decisions() -> list[GemmDecision]:
    """The mm/addmm/bmm/baddbmm decisions made since the last reset() (by the set-up and the hook), in the order
    first seen."""
    with LOG.lock:
        return list(LOG.decisions.values())


def lookup_table() -> dict[str, list[dict[str, Any]]]:
    """What the handler kept since the last reset(), as Inductor's lookup table (torch._inductor.lookup_table, the
    format `perfmodel plan` writes: choices.record_table): per mm / addmm / bmm / baddbmm call the key torch's
    LookupTableChoices builds from its kernel inputs and the kept choices' entries. A deterministic compile's
    table, set as config.lookup_table.table under LookupTableChoices, gives the same choices without perfmodel."""
    with LOG.lock:
        return {k: [dict(e) for e in v] for k, v in LOG.table.items()}


def write_lookup_table(path: Any) -> Any:
    """lookup_table() written as JSON to path (a str or Path); the Path."""
    import json
    from pathlib import Path

    path = Path(path)
    path.write_text(json.dumps(lookup_table(), indent=2) + "\n")
    return path


def reset() -> None:
    LOG.reset()
    grouped.reset()


def _line(d: GemmDecision) -> str:
    p = d.problem
    lay = ("T" if p["transpose_left"] else "N") + ("T" if p["transpose_right"] else "N")
    aten = "aten::bmm" if d.op in BMM_OPS else "cuBLAS"
    times = (f"{aten} {d.cublas_ms:.4f} ms, best Triton {d.triton_ms:.4f} ms" if d.cublas_ms is not None
             and d.triton_ms is not None else "no prediction")
    what = f"Triton {', '.join(d.configs)}" + (" + aten" if d.choices_kept > len(d.configs) else "") \
        + (" (sure: not benchmarked)" if d.sure else "") if d.triton else "aten"
    batch = f"{p['batch']}x" if p.get("batch", 1) > 1 else ""
    at = f" (at the size hint; decided over {d.covers})" if d.covers else ""
    return f"  {d.op} {batch}{p['m']}x{p['k']}x{p['n']} {p['dtype']} {lay}{at}: {times} -> {what}"


def summary() -> str:
    """What the set-up decided: one line per GEMM shape (for a symbolic one: its size hint's, and the range or
    sizes the decision covers), and the ops left to aten."""
    ds = decisions()
    with LOG.lock:
        other, errors = dict(LOG.other_ops), list(LOG.errors)
    lines = [f"perfmodel: {len(ds)} GEMM shapes; Triton kept on {sum(d.triton for d in ds)}, "
             f"aten (cuBLAS) alone on {sum(not d.triton for d in ds)}"]
    lines += [_line(d) for d in ds]
    for g in grouped.decisions():
        what = (f"Triton {', '.join('x'.join(map(str, c[:3])) + f' s{c[3]} w{c[4]}' for c in g.kept)} + aten "
                f"(of {g.offered} configs)" if g.kept else f"aten _grouped_mm alone (of {g.offered} configs)")
        lines.append(f"  grouped_mm {g.g} experts, {g.m} rows x{g.k}x{g.n} {g.dtype}: {what}")
    if other:
        lines.append("  aten alone (not ranked): " + ", ".join(f"{k} x{v}" for k, v in sorted(other.items())))
    if errors:
        lines.append(f"  {len(errors)} fallbacks: {errors[0]}")
    return "\n".join(lines)
