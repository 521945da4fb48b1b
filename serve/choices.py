"""The one Inductor choices handler: which of Inductor's GEMM choices a compile keeps, decided by the model.

Both entry points install it: the whole-model set-up (perfmodel.serve.compile, Policy SETUP: default mode's
lowering plus the model's few Triton configs) and the max-autotune hook (perfmodel.serve.inductor, Policy
MAX_AUTOTUNE: max-autotune's own choices, its Triton mm/bmm configs pruned to the model's few). Per mm / addmm /
bmm / baddbmm call (InductorChoices._finalize_template_configs, before any choice is compiled) it

- ranks the Triton template's configs (triton::mm; triton::bmm where the model has bmm heads) with the model,
- keeps Triton where the best ranked config is predicted at least `Policy.triton_gain` faster than aten
  (decisions.triton_expected_gain, the one rule; None: always), its top_k configs beside aten's choice
  (keep_aten) or alone, and a bmm's best config alone where the model is sure of it (decisions.bmm_sure),
- where the sizes are symbolic (a dynamic compile), decides for the range the compile serves, not for the size
  hint (gemm_decisions.decide_range): a Triton config is kept only where it is predicted no slower than aten (by the
  same rule) at every size of the range -- the user's `sizes` within the range, else powers of two across it --
  and with Inductor's multi_kernel_hints, one decision per hint;
- every other choice: SETUP lowers as default mode does (default mode's aten kernel alone: DEFAULT_ATEN);
  MAX_AUTOTUNE leaves it to Inductor (aten::addmm only gives way to aten::bias_addmm).

Every decision is recorded (decisions(), summary() in perfmodel.serve.compile), and what each call kept as
Inductor's lookup table (lookup_table() there: record_table). A failure inside the handler
falls back to Inductor's choices with one warning. Imports neither the Triton @autotune adapter nor Inductor at
import time.
"""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from perfmodel.configs import inductor_default_configs
from perfmodel.schema import GemmConfig, GemmProblem

from . import gemm_decisions as gd
from .decisions import BMM_SURE_GAIN, CUBLAS_MARGIN, check_bmm_sure_gain, gain_from_margin
from .gemm_decisions import decide, kept_alone, rank_positions  # noqa: F401  (the decision, importable from here)
from .kernel_inputs import kwargs_to_gemm, problem_from_kernel_inputs, symbolic_problem, template_allow_tf32
from .notices import warn_once
from .plan import kernel_inputs_key, merge_entries, table_entry
from .predictor import Predictor, _check_top_k

MM_OPS = ("mm", "addmm")
BMM_OPS = ("bmm", "baddbmm")
RANKED_OPS = MM_OPS + BMM_OPS
TRITON_MM = "triton::mm"
TRITON_MM_TEMPLATES = (TRITON_MM,)
TRITON_BMM_TEMPLATES = ("triton::bmm",)
RANKED_TEMPLATES = TRITON_MM_TEMPLATES + TRITON_BMM_TEMPLATES
# The Triton template ranked for each op: Inductor's mm template, and its bmm template (whose configs come from
# the same heuristics and map to the same GemmConfig)
TRITON_TEMPLATE = {"mm": TRITON_MM, "addmm": TRITON_MM, "bmm": "triton::bmm", "baddbmm": "triton::bmm"}
# The aten choice that gives default mode's kernel, in order of preference. Under max_autotune_gemm Inductor
# hands aten::addmm the bias expanded to [M, N]: ATen then copies the bias into the output and runs the GEMM
# with beta=1 (on the H100, GPT-2's 48 addmm bias copies cost 0.61 ms of a 3.3 ms step), where default mode
# passes the 1-D bias and cuBLASLt adds it in the GEMM's epilogue -- which is aten::bias_addmm.
DEFAULT_ATEN = {"mm": ("aten::mm",), "addmm": ("aten::bias_addmm", "aten::addmm"), "bmm": ("aten::bmm",),
                "baddbmm": ("aten::baddbmm",)}

# The set-up keeps Triton where the model predicts its best config at least this much faster than cuBLAS (a
# fraction): 0 keeps it wherever it is predicted faster at all (docs/benchmarks.md, "Whole models").
TRITON_GAIN = 0.0
# Triton configs the set-up keeps beside aten where Triton is kept. Three, not one: on the GPT-2 training step the
# lm head's weight gradient ran 1.97 ms with the model's top-1 config and 1.05 ms with its third (stock's best); on
# the H100 the set-up's step with three was 0.892 of default mode's against 0.972 with one.
TOP_K = 3
# The hook's top_k (install's default): the Triton mm configs max-autotune benchmarks beside its other choices
# (docs/benchmarks.md, "The 12 shapes and the hook's settings").
HOOK_TOP_K = 5
# Triton bmm configs kept per bmm/baddbmm by both. One: each kept bmm config is compiled and benchmarked. Set-up
# (BERT-large, T5-base, Swin-T; H100, runs s13/s13b): one config against three cost BERT 1 % of step time and saved
# 3.1 s of its compile; the hook (call s8): BERT-large's bmm autotuning 6.8 s with the top 5, 0.7 s with the top 1.
BMM_TOP_K = 1
LOWERINGS = ("default", "max-autotune")


@dataclass(frozen=True)
class Policy:
    """How the handler decides. triton_gain: keep Triton where its best config is predicted >= this fraction faster
    than aten (inf: never; None: always, without asking aten's time). top_k: Triton configs kept (None: TOP_K with
    keep_aten, else 1). keep_aten: keep aten's choice beside them (Inductor benchmarks the few kept) or not (the
    model's top-1 is used as it is). conv_1x1_as_mm: let Inductor lower channels-last 1x1 convolutions as mm (the
    set-up's convolution lowering; off, they stay convolutions, as in default mode). bmm_top_k: Triton configs kept
    for a bmm/baddbmm (None: top_k). bmm_sure_gain: a bmm whose aten::bmm time (as the model's call implies it) is
    predicted at least this fraction slower than the best ranked config keeps that config alone, without aten (no
    benchmark; None: never). lowering: what the other choices get -- "default" (default mode's aten kernel alone:
    the set-up) or "max-autotune" (Inductor's own choices: the hook). ops / templates: the ops and Triton templates
    ranked. range_kernel: the kernel mode a symbolic-size problem is ranked for (None: the predictor's own)."""

    triton_gain: float | None = TRITON_GAIN
    top_k: int | None = None
    keep_aten: bool = True
    conv_1x1_as_mm: bool = False
    bmm_top_k: int | None = BMM_TOP_K
    bmm_sure_gain: float | None = BMM_SURE_GAIN
    lowering: str = "default"
    ops: tuple[str, ...] = RANKED_OPS
    templates: tuple[str, ...] = RANKED_TEMPLATES
    range_kernel: str | None = None

    def __post_init__(self) -> None:
        if self.top_k is None:
            object.__setattr__(self, "top_k", TOP_K if self.keep_aten is True else 1)
        _check_top_k(self.top_k)
        if self.bmm_top_k is not None:
            _check_top_k(self.bmm_top_k, "bmm_top_k")
            if not self.keep_aten and self.bmm_top_k != 1:
                raise ValueError("bmm_top_k: without keep_aten only the model's top-1 config can be used")
        check_bmm_sure_gain(self.bmm_sure_gain)
        g = self.triton_gain
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not g > -1.0):
            raise ValueError(f"triton_gain: expected None or a number > -1 (or inf), got {g!r}")
        for name in ("keep_aten", "conv_1x1_as_mm"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}: expected a bool, got {type(getattr(self, name)).__name__}")
        if not self.keep_aten and self.top_k != 1:
            raise ValueError("top_k: without keep_aten only the model's top-1 config can be used (top_k=1)")
        if self.lowering not in LOWERINGS:
            raise ValueError(f"lowering: expected one of {LOWERINGS}, got {self.lowering!r}")
        if self.range_kernel is not None and self.range_kernel not in ("autotune", "inductor"):
            raise ValueError(f"range_kernel: expected None, 'autotune' or 'inductor', got {self.range_kernel!r}")
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "templates", tuple(self.templates))

    def k_for(self, prob: GemmProblem) -> int:
        """The Triton configs kept for prob: bmm_top_k for a bmm (batch > 1), else top_k."""
        return self.bmm_top_k if prob.batch > 1 and self.bmm_top_k is not None else self.top_k


# The whole-model set-up's policy: default mode's lowering, Triton kept where predicted faster at all, top 3.
SETUP = Policy()
# The max-autotune hook's: max-autotune's choices, Triton kept only where predicted more than 5 % faster than cuBLAS
# (decisions.CUBLAS_MARGIN, measured for the hook: fewer configs compiled and benchmarked for 0.2-0.3 % of kernel
# time on held-out problems), its top 5.
MAX_AUTOTUNE = Policy(triton_gain=gain_from_margin(CUBLAS_MARGIN), top_k=HOOK_TOP_K, lowering="max-autotune")
# The deterministic set-up: no benchmark at all. Per GEMM one choice is handed to Inductor -- the model's top-1
# config where it is predicted no slower than aten, else aten's kernel -- so a compile gives the same kernels every
# time (grouped GEMMs decide without a benchmark already); `perfmodel plan` writes these decisions as a lookup table.
DETERMINISTIC = Policy(keep_aten=False, top_k=1, bmm_top_k=1)

# The parameters of InductorChoices._finalize_template_configs that the handler was written against.
_EXPECTED_PARAMS = ("self", "template_choices", "kernel_inputs", "templates", "op_name", "kwarg_overrides")

def check_torch_api() -> str | None:
    """None when the installed torch has what the handler needs (the InductorChoices API it subclasses), else why not."""
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



@dataclass
class GemmDecision:
    """One mm/addmm/bmm/baddbmm the handler saw: the problem (at the size hints; with its batch for a bmm), the
    model's times at it (cublas_ms: aten's -- for a bmm, the aten::bmm time the model's call implies), what it
    kept, and for symbolic sizes the range the decision covers."""

    op: str
    problem: dict[str, Any]
    cublas_ms: float | None
    triton_ms: float | None
    triton: bool                       # Triton configs kept
    configs: list[str] = field(default_factory=list)   # the kept configs, in the order decided
    choices_in: int = 0                # choices Inductor offered (all of this op's calls)
    choices_kept: int = 0
    sure: bool = False                 # a bmm's best config kept alone (Policy.bmm_sure_gain): not benchmarked
    covers: str | None = None          # symbolic sizes: the range (or sizes) decided over; None: static


class DecisionLog:
    """What the handlers decided (thread-safe): decisions by (op, problem, covers), first seen first; other ops
    left to aten / Inductor, with their counts; fallbacks; and the choices kept as a lookup table (record_table)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decisions: dict[tuple, GemmDecision] = {}
        self.other_ops: dict[str, int] = {}
        self.errors: list[str] = []
        self.table: dict[str, list[dict[str, Any]]] = {}

    def record(self, d: GemmDecision, prob: GemmProblem, with_configs: bool) -> GemmDecision:
        """d, recorded; a call without Triton choices (addmm's aten call) records only where the op's Triton call
        was not seen already (then the earlier decision is returned)."""
        key = (d.op, prob, d.covers)
        with self.lock:
            old = self.decisions.get(key)
            if old is None or with_configs:
                if old is not None:
                    d.choices_in, d.choices_kept = old.choices_in, old.choices_kept
                self.decisions[key] = d
                return d
            return old

    def other(self, op_name: str) -> None:
        with self.lock:
            self.other_ops[op_name] = self.other_ops.get(op_name, 0) + 1

    def reset(self) -> None:
        with self.lock:
            self.decisions.clear()
            self.other_ops.clear()
            self.errors.clear()
            self.table.clear()


LOG = DecisionLog()


def _uid(choice: Any) -> str:
    return str(getattr(getattr(choice, "template", None), "uid", None) or "")


def filter_choices(choices: list, op_name: str, keep_triton: bool, positions: Sequence[int], policy: Policy,
                   alone: bool = False) -> list:
    """Default mode's lowering (Policy.lowering "default"): the op's Triton template's choices (TRITON_TEMPLATE) at
    `positions` (among this call's choices of that template) when keep_triton and the op is ranked; default mode's
    aten choice (DEFAULT_ATEN: aten::bias_addmm over aten::addmm), unless this call keeps Triton without keep_aten
    or `alone` (a bmm the model is sure of); nothing else (decompose-k, TMA/persistent and contiguous-subgraph
    templates, the other aten variants, other ops' Triton templates).
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


def prefer_bias_addmm(choices: list, op_name: str) -> list:
    """An addmm's choices without aten::addmm where aten::bias_addmm is offered too. Under max-autotune Inductor
    hands aten::addmm the bias expanded to [M, N]: ATen copies it into the output and runs the GEMM with
    beta=1, where aten::bias_addmm passes the 1-D bias to cuBLASLt's epilogue, default mode's kernel. Inductor's
    benchmark of the two favours aten::addmm (on BERT-large's 6144x1024x1024 projections 0.043-0.056 ms against
    0.053-0.075 ms), which then ran its copies in the step: under the hook BERT-large stepped 3.058 / 3.096 ms
    against stock max-autotune's 2.975 / 2.961 and the set-up's 2.923 / 2.909 (docs/benchmarks.md)."""
    if op_name != "addmm":
        return choices
    uids = [_uid(c) for c in choices]
    if "aten::bias_addmm" not in uids or "aten::addmm" not in uids:
        return choices
    return [c for c, u in zip(choices, uids) if u != "aten::addmm"]


def _max_autotune_choices(choices: list, ranked: list[int], kept: list[int], alone: bool) -> list:
    """Max-autotune's lowering: every choice but the ranked Triton configs not kept; `alone` (a bmm the model is
    sure of): nor the aten choices."""
    ranked_set, kept_set = set(ranked), set(kept)
    if alone:
        out = [c for i, c in enumerate(choices) if i in kept_set or not (i in ranked_set or _uid(c).startswith("aten::"))]
    else:
        out = [c for i, c in enumerate(choices) if i not in ranked_set or i in kept_set]
    return choices if len(out) == len(choices) else out  # nothing dropped: Inductor's own list


def record_table(log: DecisionLog, kernel_inputs: Any, op_name: str, kept: list) -> None:
    """The kept choices of one call as lookup-table entries (plan.table_entry: an aten choice by its uid, a Triton
    mm / bmm config with its kwargs and template hash) under the key torch's LookupTableChoices looks this call up
    by (plan.kernel_inputs_key; device-agnostic off CUDA), merged into log.table. Not written: choices of other
    templates (a TMA, decompose-k or subgraph template the max-autotune hook keeps) and configs outside the model's
    space -- a table of the set-up's compile holds all it kept, one of the hook's compile may not."""
    try:
        key = kernel_inputs_key(kernel_inputs, op_name)
        k = int(kernel_inputs.mnk_hinted()[2])
    except (AttributeError, TypeError, ValueError, IndexError):
        return
    entries = []
    for c in kept:
        uid = _uid(c)
        if uid.startswith("aten::"):
            entries.append(table_entry(uid))
        elif uid in RANKED_TEMPLATES:
            try:
                cfg = kwargs_to_gemm(c.params.to_kwargs())
            except (ValueError, TypeError):
                continue
            entries.append(table_entry(uid, cfg, k, getattr(c.template, "src_hash", None)))
    with log.lock:
        merge_entries(log.table, key, entries)


def select(choices: list, kernel_inputs: Any, op_name: str, predictor: Predictor, policy: Policy,
           sizes: Sequence[int] | None = None, log: DecisionLog = LOG) -> list:
    """The choices of one _finalize_template_configs call that the handler keeps (see the module docstring),
    recorded as lookup-table entries (record_table)."""
    out = _select(choices, kernel_inputs, op_name, predictor, policy, sizes, log)
    record_table(log, kernel_inputs, op_name, out)
    return out


def _select(choices: list, kernel_inputs: Any, op_name: str, predictor: Predictor, policy: Policy,
            sizes: Sequence[int] | None, log: DecisionLog) -> list:
    default = policy.lowering == "default"
    if op_name not in policy.ops or (op_name in BMM_OPS and not predictor.has_bmm):
        log.other(op_name)
        return filter_choices(choices, op_name, False, [], policy) if default else choices
    if not default:
        choices = prefer_bias_addmm(choices, op_name)
    fallback = filter_choices(choices, op_name, False, [], policy) if default else choices
    template = TRITON_TEMPLATE[op_name] if TRITON_TEMPLATE[op_name] in policy.templates else None
    ranked, cfgs, hints = [], [], []
    for i, c in enumerate(choices):
        if _uid(c) != template:
            continue
        try:
            kw = c.params.to_kwargs()
            cfgs.append(kwargs_to_gemm(kw))
        except (ValueError, TypeError):
            if default:  # outside the model's space: this call is left as default mode would have it
                return fallback
            continue     # max-autotune benchmarks it as Inductor would
        ranked.append(i)
        hints.append(kw.get("hint_override"))
    has_aten = any(_uid(c).startswith("aten::") for c in choices)
    # without an aten choice to fall back on, the model's top k are kept (no comparison, nothing kept alone)
    pol = policy if has_aten else replace(policy, triton_gain=None, bmm_sure_gain=None)
    try:
        prob = problem_from_kernel_inputs(kernel_inputs, template_allow_tf32([choices[i] for i in ranked]))
        sym = symbolic_problem(kernel_inputs, prob)
        keep, best, aten_ms, sure, covers = gd.decide_call(predictor, prob, sym, cfgs, hints, pol, sizes)
    except ValueError:  # a problem the model does not cover: the fallback
        return fallback
    positions = [j for j, _ in best] if keep and cfgs else []
    listed = cfgs or list(inductor_default_configs())
    d = log.record(GemmDecision(op=op_name, problem=asdict(prob), cublas_ms=aten_ms,
                                triton_ms=best[0][1] if best else None, triton=keep and bool(cfgs),
                                configs=[str(listed[j]) for j, _ in best] if keep and cfgs else [],
                                sure=sure and bool(cfgs), covers=covers), prob, bool(cfgs))
    if default:
        out = filter_choices(choices, op_name, bool(positions), positions, policy, d.sure)
    else:
        out = _max_autotune_choices(choices, ranked, [ranked[j] for j in positions], sure and bool(positions))
    with log.lock:
        d.choices_in += len(choices)
        d.choices_kept += len(out)
    return out


@functools.cache
def handler_class() -> type:
    """The InductorChoices subclass both entry points install (imported on first use)."""
    from torch._inductor.choices import InductorChoices

    class PerfmodelChoices(InductorChoices):
        """InductorChoices deciding GEMM choices with the model: see perfmodel.serve.choices."""

        def __init__(self, predictor: Predictor, policy: Policy = SETUP, sizes: Sequence[int] | None = None,
                     log: DecisionLog = LOG) -> None:
            super().__init__()
            self.perfmodel, self.policy, self.sizes, self.log = predictor, policy, sizes, log

        @property
        def perfmodel_top_k(self) -> int:
            return self.policy.top_k

        def _finalize_template_configs(self, template_choices, kernel_inputs, templates, op_name,
                                       kwarg_overrides=None):
            choices = super()._finalize_template_configs(template_choices, kernel_inputs, templates, op_name,
                                                         kwarg_overrides)
            try:
                return select(choices, kernel_inputs, op_name, self.perfmodel, self.policy, self.sizes, self.log)
            # Inductor's private structures change between releases; a mismatch here must not break the user's
            # compile: Inductor's choices, said once
            except (AttributeError, TypeError, KeyError, IndexError, ValueError, AssertionError,
                    RuntimeError) as exc:
                with self.log.lock:
                    self.log.errors.append(f"{op_name}: {type(exc).__name__}: {exc}")
                warn_once(f"handler:{type(exc).__name__}", f"could not decide {op_name} with the model "
                                                           f"({type(exc).__name__}: {exc}); Inductor's default choices kept")
                return choices

    return PerfmodelChoices


def check_sizes(sizes: Any) -> tuple[int, ...] | None:
    """sizes as a sorted tuple, or None; ValueError/TypeError naming sizes (and the element) unless it is None or a
    non-empty sequence of positive ints."""
    if sizes is None:
        return None
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise TypeError(f"sizes: expected a sequence of positive ints, got {type(sizes).__name__}")
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes: empty; pass the sizes the dynamic dimension takes, or None")
    for i, v in enumerate(sizes):
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise TypeError(f"sizes[{i}]: expected a positive int, got {type(v).__name__} ({v!r})")
        if int(v) < 1:
            raise ValueError(f"sizes[{i}]: expected a positive int, got {v}")
    return tuple(sorted({int(v) for v in sizes}))
