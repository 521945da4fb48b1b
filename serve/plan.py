"""`perfmodel plan`: the model's GEMM decisions as an artifact -- Inductor's lookup table (torch._inductor.lookup_table).

    from perfmodel.serve.plan import plan
    p = plan(gemms=["mm:4096,4096,4096", "bmm:16,512,512,64"], device="h100", dtype="bfloat16")
    p = plan(model_fn="my_pkg.models:build", device="h200")   # build() -> (model, example_inputs)
    print(p.text()); p.write("table.json")

Every mm / addmm / bmm / baddbmm (given, or traced without a GPU: serve/plan_trace.py) is decided as the
deterministic set-up decides it (choices.DETERMINISTIC: the model's top-1 of the Triton configs Inductor offers for
the problem -- offered_configs: the installed torch's CUDA template heuristic, its config list scaled to the sizes --
where it is predicted no slower than aten, else aten's kernel), and written as the one choice the deterministic
compile keeps and records (choices.select, record_table) under the key torch's LookupTableChoices builds from the
kernel inputs ("<device name>+((dtype, shape, stride), ...)[+alpha=1&beta=1]+<op>"): one entry per GEMM, nothing
left to benchmark. An addmm is keyed as torch 2.11's lowering keys it for aten and Triton alike, the bias expanded to
[M, N] (stride 0 along M), and holds aten::bias_addmm (default mode's aten kernel, choices.DEFAULT_ATEN) or the Triton
config. docs/integration.md, "Decisions as an artifact".
"""
from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from perfmodel.schema import GemmConfig, GemmProblem, is_column_major

from .plan_trace import Gemm, Operand, load_factory, parse_gemm, trace_gemms

# Plan devices: the device spec the shipped model serves, and the name torch reports for the card
# (torch.cuda.get_device_properties().gcnArchName, which CUDA builds of torch set to the device's name: the
# device part of a lookup-table key). Another SKU's name: pass device_name.
DEVICES = {"h100": ("h100-sxm", "NVIDIA H100 80GB HBM3"), "h200": ("h200", "NVIDIA H200")}
TRITON_ID = {"mm": "triton::mm", "addmm": "triton::mm", "bmm": "triton::bmm", "baddbmm": "triton::bmm"}


@dataclass(frozen=True)
class PlanRow:
    """One GEMM's decision: the problem, the model's times (aten's and the best Triton config's), the choice and
    its margin (the other side's predicted time over the chosen one's, minus 1; None without both times)."""

    gemm: Gemm
    problem: GemmProblem
    aten_ms: float | None
    triton_ms: float | None
    config: GemmConfig | None       # the model's top-1 Triton config (None: none ranked)
    triton: bool                    # the choice: Triton (config) or aten
    entries: dict[str, list[dict[str, Any]]]
    padded_from: Gemm | None = None  # the mm as traced, where the model's pad decision padded it (pad_gemm)

    @property
    def margin(self) -> float | None:
        if self.aten_ms is None or self.triton_ms is None:
            return None
        return self.aten_ms / self.triton_ms - 1.0 if self.triton else self.triton_ms / self.aten_ms - 1.0


_SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}  # the table's dtype column


def check_device(device: str) -> tuple[str, str]:
    if device not in DEVICES:
        raise ValueError(f"--device: unknown device {device!r}; known: {', '.join(DEVICES)}")
    return DEVICES[device]


def inputs_key(operands: Sequence[Operand], scalars: Sequence[tuple[str, Any]] = ()) -> str:
    """LookupTableChoices._generate_kernel_inputs_key's string for these operands and scalars."""
    import torch

    key = str(tuple((getattr(torch, o.dtype), list(o.shape), list(o.stride)) for o in operands))
    if scalars:
        key += "+" + "&".join(f"{k}={v}" for k, v in sorted(scalars))
    return key


def lookup_key(device_name: str | None, operands: Sequence[Operand], scalars: Sequence[tuple[str, Any]], op: str
               ) -> str:
    """LookupTableChoices.make_lookup_key: '<device>+<inputs>+<op>' (device None: the device-agnostic key)."""
    parts = ([device_name] if device_name else []) + [inputs_key(operands, scalars), op]
    return "+".join(parts)


def expanded_bias(bias: Operand, m: int, n: int) -> Operand:
    """The bias as Inductor's mm_args expands it to the output's [.., M, N] (broadcast dims get stride 0)."""
    out = (m, n) if len(bias.shape) <= 2 else bias.shape[:-2] + (m, n)
    shape = (1,) * (len(out) - len(bias.shape)) + bias.shape
    stride = (0,) * (len(out) - len(bias.stride)) + bias.stride
    return Operand(bias.dtype, out, tuple(0 if s == 1 and o != 1 else st for s, o, st in zip(shape, out, stride)))


def problem_of(g: Gemm) -> GemmProblem:
    """The model's problem of a Gemm (layouts from each operand's last two dims); ValueError for what it does not
    cover."""
    a, b = g.mats
    if len(a.shape) != len(b.shape) or len(a.shape) not in (2, 3) or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{g.op}: operands {a.shape} @ {b.shape} are not an mm or a bmm")
    batch = a.shape[0] if len(a.shape) == 3 else 1
    return GemmProblem(m=a.shape[-2], n=b.shape[-1], k=a.shape[-1], dtype=a.dtype, batch=batch,
                       transpose_left=is_column_major(a.shape, a.stride),
                       transpose_right=is_column_major(b.shape, b.stride))


def aten_id(g: Gemm) -> str:
    """aten's kernel for the op: default mode's (an addmm's bias_addmm where Inductor offers it: a 2-D bias of
    stride 0 along M)."""
    if g.op == "addmm":
        bias = g.operands[0]
        return "aten::bias_addmm" if len(bias.shape) == 2 and bias.stride[0] == 0 else "aten::addmm"
    return f"aten::{g.op}"


def table_entry(template_id: str, cfg: GemmConfig | None = None, k: int = 0, template_hash: str | None = None
                ) -> dict[str, Any]:
    """One lookup-table entry, as the plan and the compile's recorded table (choices.record_table) both write it: an
    aten choice as its template_id alone; a Triton template's config (cfg, for a GEMM of reduction size k) as the
    kwargs Inductor's mm heuristics give it (template_heuristics/triton.py, _convert_config_to_template_kwargs) and
    the template's source hash (None: left out)."""
    if cfg is None:
        return {"template_id": template_id}
    e = {"template_id": template_id, "EVEN_K": k % cfg.block_k == 0, "USE_FAST_ACCUM": False,
         "ACC_TYPE": "tl.float32", "num_stages": cfg.num_stages, "num_warps": cfg.num_warps,
         "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m}
    if template_hash is not None:
        e["template_hash"] = template_hash
    return e


def triton_entry(g: Gemm, cfg: GemmConfig, template_hash: str | None) -> dict[str, Any]:
    """A Triton template's lookup-table entry for the Gemm (table_entry)."""
    return table_entry(TRITON_ID[g.op], cfg, g.mats[0].shape[-1], template_hash)


@functools.cache
def _cuda_device_name(index: int | None) -> str:
    import torch

    return torch.cuda.get_device_properties(index).gcnArchName


def kernel_inputs_key(kernel_inputs: Any, op: str) -> str:
    """The lookup key torch's LookupTableChoices.make_lookup_key(include_device=True) builds for Inductor's kernel
    inputs of an op (dtypes(), shapes_hinted(), strides_hinted(), _scalars; the device part gcnArchName of its CUDA
    device). Kernel inputs on another device (or without device(), as the CPU tests' stand-ins): the
    device-agnostic key, which torch tries second (torch itself looks nothing up off CUDA)."""
    device = kernel_inputs.device() if callable(getattr(kernel_inputs, "device", None)) else None
    name = _cuda_device_name(device.index) if device is not None and device.type == "cuda" else None
    operands = [Operand(str(dt).replace("torch.", ""), tuple(int(s) for s in shape), tuple(int(s) for s in stride))
                for dt, shape, stride in zip(kernel_inputs.dtypes(), kernel_inputs.shapes_hinted(),
                                             kernel_inputs.strides_hinted())]
    scalars = tuple((getattr(kernel_inputs, "_scalars", None) or {}).items())
    return lookup_key(name, operands, scalars, op)


def merge_entries(table: dict[str, list[dict[str, Any]]], key: str, entries: Sequence[dict[str, Any]]) -> None:
    """table[key] with entries appended (those not already there, in order); no key for no entries."""
    if entries:
        have = table.setdefault(key, [])
        have.extend(e for e in entries if e not in have)


_OPERAND = re.compile(r"\(torch\.(\w+), \[([^\]]*)\], \[([^\]]*)\]\)")


def canonical_key(key: str) -> str:
    """A lookup key with the strides of its operands' size-1 dimensions written '*': no kernel reads them, and
    Inductor's IR gives them values a trace cannot know (0 or the contiguous stride, by how the operand was viewed)."""
    def one(m: re.Match) -> str:
        shape = [d.strip() for d in m.group(2).split(",") if d.strip()]
        stride = [d.strip() for d in m.group(3).split(",") if d.strip()]
        stride = ["*" if d == "1" else st for d, st in zip(shape, stride)]
        return f"(torch.{m.group(1)}, [{', '.join(shape)}], [{', '.join(stride)}])"

    return _OPERAND.sub(one, key)


def stride_aliases(operands: Sequence[Operand]) -> list[tuple[Operand, ...]]:
    """The operands with every size-1 dimension's stride as traced, 0, or the contiguous stride (canonical_key's
    '*'), each combination once, the traced first: the keys a compile may build for one GEMM (entries_for writes
    the entry under each, so that the compile finds it whichever Inductor's IR gives)."""
    per_operand = []
    for o in operands:
        contiguous = [1] * len(o.shape)
        for i in range(len(o.shape) - 2, -1, -1):
            contiguous[i] = contiguous[i + 1] * max(o.shape[i + 1], 1)
        choices = [dict.fromkeys((st, 0, c)) if d == 1 else (st,)
                   for d, st, c in zip(o.shape, o.stride, contiguous)]
        per_operand.append([replace(o, stride=tuple(c)) for c in itertools.product(*choices)])
    return [tuple(c) for c in itertools.product(*per_operand)]


def compare_tables(a: dict[str, list[dict[str, Any]]], b: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Two lookup tables compared, keys taken as canonical_key (the strides of size-1 dimensions ignored: a plan
    holds one key per such stride, stride_aliases): keys in both, only in a, only in b, and the keys in both whose
    entries differ ignoring template_hash and their order (it differs between torch versions: a plan made with
    another torch than the compile's). equal: no key in one only and no entries that differ."""
    def norm(entries: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps({k: v for k, v in e.items() if k != "template_hash"}, sort_keys=True)
                      for e in entries)

    def canon(t: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k, v in t.items():
            have = out.setdefault(canonical_key(k), [])
            have.extend(e for e in norm(v) if e not in have)
        return {k: sorted(v) for k, v in out.items()}

    ca, cb = canon(a), canon(b)
    both = sorted(set(ca) & set(cb))
    differ = {k: {"a": ca[k], "b": cb[k]} for k in both if ca[k] != cb[k]}
    out = {"both": len(both), "only_a": sorted(set(ca) - set(cb)), "only_b": sorted(set(cb) - set(ca)),
           "differ": differ}
    out["equal"] = not (out["only_a"] or out["only_b"] or differ)
    return out


def template_hashes() -> dict[str, str | None]:
    """The installed torch's Triton mm / bmm template source hashes (what LookupTableChoices checks entries against
    with config.lookup_table.check_src_hash)."""
    from torch._inductor.kernel.bmm import bmm_template
    from torch._inductor.kernel.mm import mm_template

    return {mm_template.uid: mm_template.src_hash, bmm_template.uid: bmm_template.src_hash}


def kernel_gemm(g: Gemm, prob: GemmProblem) -> Gemm:
    """The Gemm as Inductor's lowering hands it to the choices (its kernel inputs): an addmm's bias expanded to
    [M, N] (mm_args; torch 2.11's tuned_addmm keys aten's and the Triton template's choices alike under it), other
    ops as they are."""
    if g.op != "addmm":
        return g
    bias, a, b = g.operands
    return Gemm(g.op, (expanded_bias(bias, prob.m, prob.n), a, b), g.scalars)


def entries_for(g: Gemm, prob: GemmProblem, triton: bool, cfg: GemmConfig | None, device_name: str | None,
                hashes: dict[str, str | None]) -> dict[str, list[dict[str, Any]]]:
    """The table entry of one decided GEMM, as the deterministic compile records it (choices.select with
    DETERMINISTIC, record_table): kernel_gemm's key and its stride_aliases, each holding the Triton config where triton, else default
    mode's aten kernel (aten::bias_addmm for an addmm with a broadcast bias, choices.DEFAULT_ATEN)."""
    kg = kernel_gemm(g, prob)
    entry = triton_entry(kg, cfg, hashes.get(TRITON_ID[g.op])) if triton and cfg is not None \
        else table_entry(aten_id(kg))
    return {lookup_key(device_name, ops, kg.scalars, g.op): [entry] for ops in stride_aliases(kg.operands)}


@dataclass
class Plan:
    """What plan() decided: per GEMM a PlanRow; the lookup table (table), for device (its torch name)."""

    device: str
    device_name: str | None
    model: str
    rows: list[PlanRow]

    @property
    def table(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.rows:
            out.update(r.entries)
        return out

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.table, indent=2) + "\n")
        return path

    def text(self) -> str:
        lines = [f"perfmodel plan: {len(self.rows)} GEMMs on {self.device} ({self.device_name or 'any device'}; "
                 f"{self.model}); Triton on {sum(r.triton for r in self.rows)}, aten on "
                 f"{sum(not r.triton for r in self.rows)}",
                 f"{'op':<8} {'problem':<26} {'aten ms':>9} {'Triton ms':>9}  {'choice':<34} {'margin':>7}"]
        for r in self.rows:
            p = r.problem
            lay = ("T" if p.transpose_left else "N") + ("T" if p.transpose_right else "N")
            dims = (f"{p.batch}x" if p.batch > 1 else "") + f"{p.m}x{p.n}x{p.k} {_SHORT.get(p.dtype, p.dtype)} {lay}"
            fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
            c = r.config
            choice = (f"triton {c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} s{c.num_stages} w{c.num_warps}"
                      if r.triton and c is not None else aten_id(kernel_gemm(r.gemm, r.problem)))
            margin = "-" if r.margin is None else f"{100 * r.margin:.1f}%"
            if r.padded_from is not None:
                a, b = r.padded_from.mats
                choice += f" (padded from {a.shape[0]}x{b.shape[1]}x{a.shape[1]})"
            lines.append(f"{r.gemm.op:<8} {dims:<26} {fmt(r.aten_ms):>9} {fmt(r.triton_ms):>9}  {choice:<34} "
                         f"{margin:>7}")
        return "\n".join(lines)


def _predictor(spec: str, model_dir: str | Path | None, backend: str | None) -> Any:
    from perfmodel.locations import default_model_dir

    from .predictor import Predictor

    p = Predictor.load(model_dir if model_dir is not None else default_model_dir(spec), backend=backend, device=spec)
    return p.with_kernel("inductor") if p.has_static else p


@functools.cache
def offered_configs(op: str, m: int, n: int, k: int, dtype: str, shared_memory: int | None = None
                    ) -> tuple[GemmConfig, ...]:
    """The Triton configs Inductor offers a static (m, n, k) GEMM of op on a CUDA device, in its order: the installed
    torch's CUDA template heuristic for the op's template (template_heuristics registry, device "cuda"), its
    default config list scaled to the sizes and de-duplicated (BaseConfigHeuristic.preprocess_mm_configs:
    _scale_mm_configs -- e.g. BLOCK_M shrunk to 16 for M=8 --, _finalize_mm_configs -- num_warps capped at one per
    16x16 tile), computed on the CPU under a stand-in graph whose size vars resolve the static ints. Where Inductor
    prunes by shared memory (config.max_autotune_prune_choices_based_on_shared_mem) the device's shared_memory
    stands in for the CUDA property (None: not pruned). The list the compile's choices handler ranks."""
    import torch
    from torch._inductor import config
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.template_heuristics.registry import get_template_heuristic
    from torch._inductor.virtualized import V

    from .kernel_inputs import kwargs_to_gemm

    h = get_template_heuristic(TRITON_ID[op], "cuda", op)
    if not callable(getattr(h, "get_mm_configs", None)):
        raise RuntimeError(f"torch has no CUDA Triton config heuristic for {TRITON_ID[op]} ({op})")
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()

    class _Graph:  # what _scale_mm_configs reads off V.graph
        sizevars = SizeVarAllocator()

    with V.set_graph_handler(_Graph()), config.patch(max_autotune_gemm_search_space="DEFAULT",
                                                     max_autotune_prune_choices_based_on_shared_mem=False):
        tcs = list(h.get_mm_configs()(m, n, k, dtype_size=size, op_name=op))
    out = []
    for tc in tcs:
        cfg = kwargs_to_gemm({**tc.kwargs, "num_stages": tc.num_stages, "num_warps": tc.num_warps})
        if config.max_autotune_prune_choices_based_on_shared_mem and shared_memory is not None and \
                h.get_shared_memory_estimation(cfg, size, False, 0) > shared_memory:
            continue
        out.append(cfg)
    return tuple(out)


def _padded(o: Operand, shape: tuple[int, int]) -> Operand:
    """o as pad_mm's pad_dim leaves it: unchanged if its shape is, else a new contiguous tensor of `shape`."""
    return o if tuple(o.shape) == shape else Operand(o.dtype, shape, (shape[1], 1))


def pad_gemm(predictor: Any, g: Gemm) -> tuple[Gemm, bool]:
    """An mm as the set-up's compile lowers it: where a dimension is misaligned and the model's pad decision pads it
    (the set-up's pad hook: serve/pad_hook.py, decisions.hook_pad_decision with the Triton template in play), Inductor's
    pad_mm pads M and K of mat1 and K and N of mat2 to the dtype's alignment (a dimension of size 1 never) and the
    padded operand is a new contiguous tensor (pad_mm.pad_dim: a cat with zeros); the GEMM Inductor then lowers, and
    so keys, is that one. (g, False) where nothing is padded. The operands' producers are not known here: the
    padding time is counted for both (pad_mm excludes it for an operand it can plan padded)."""
    from perfmodel.configs import inductor_default_configs
    from perfmodel.schema import PadProblem

    from .decisions import hook_pad_decision

    if g.op != "mm" or any(len(o.shape) != 2 for o in g.mats) or g.mats[0].dtype not in ("float16", "bfloat16",
                                                                                            "float32"):
        return g, False
    a, b = g.mats
    prob = problem_of(g)
    pp = PadProblem(m=prob.m, k=prob.k, n=prob.n, dtype=prob.dtype, transpose_left=prob.transpose_left,
                    transpose_right=prob.transpose_right)
    if not pp.needs_padding() or not hook_pad_decision(predictor, pp, True, list(inductor_default_configs())).should_pad:
        return g, False
    m, k, n = pp.padded_dims()
    return Gemm(g.op, (_padded(a, (m, k)), _padded(b, (k, n))), g.scalars), True


def decide_gemm(predictor: Any, g: Gemm, device_name: str | None, hashes: dict[str, str | None],
                shared_memory: int | None = None) -> PlanRow:
    """One GEMM decided as the deterministic set-up decides it (choices.DETERMINISTIC), over the configs Inductor
    offers for it (offered_configs); a bmm without the model's bmm heads, or a problem it does not cover, goes to
    aten."""
    from . import gemm_decisions as gd
    from .choices import DETERMINISTIC

    prob = problem_of(g)
    cfgs = list(offered_configs(g.op, prob.m, prob.n, prob.k, prob.dtype, shared_memory))
    keep, best, aten_ms = False, [], None
    if prob.batch == 1 or predictor.has_bmm:
        keep, best, aten_ms = gd.decide(predictor, prob, cfgs, DETERMINISTIC)
    cfg = cfgs[best[0][0]] if best else None
    return PlanRow(g, prob, aten_ms, best[0][1] if best else None, cfg, bool(keep and best),
                   entries_for(g, prob, bool(keep and best), cfg, device_name, hashes))


def plan(gemms: Sequence[str | Gemm] = (), *, model_fn: str | None = None, model: Any = None,
         inputs: Sequence[Any] = (), device: str = "h100", dtype: str = "bfloat16",
         model_dir: str | Path | None = None, backend: str | None = None, predictor: Any = None,
         device_name: str | None = "", template_hash: bool = True) -> Plan:
    """The decisions and lookup table for GEMMs given as specs ('mm:M,N,K', 'addmm:M,N,K', 'bmm:B,M,N,K' in
    dtype) or Gemm, and/or those of a model: model_fn 'pkg.mod:factory' returning (model, example_inputs), or
    model with inputs, traced without a GPU (serve/plan_trace.py). device: a DEVICES name (the shipped model for it
    unless model_dir / predictor). device_name: the key's device part ("": the device's torch name, DEVICES; None:
    device-agnostic keys). template_hash: entries carry the installed torch's template source hashes."""
    spec, torch_name = check_device(device)
    found = [parse_gemm(g, dtype) if isinstance(g, str) else g for g in gemms]
    if model_fn is not None:
        model, inputs = load_factory(model_fn)
    if model is not None:
        found += trace_gemms(model, tuple(inputs))
    if not found:
        raise ValueError("gemms: nothing to plan; give --gemm specs or --model-fn")
    found = list(dict.fromkeys(found))
    pred = predictor if predictor is not None else _predictor(spec, model_dir, backend)
    name = torch_name if device_name == "" else device_name
    hashes = template_hashes() if template_hash else {}
    # where Inductor prunes configs by shared memory it reads the CUDA device's property: the device spec's here
    from perfmodel.devices import get_spec

    smem = get_spec(spec).shared_memory_per_block_optin
    rows = []
    for g in found:  # an mm the model pads is planned as Inductor then lowers it (pad_gemm)
        lowered, padded = pad_gemm(pred, g)
        row = decide_gemm(pred, lowered, name, hashes, smem)
        rows.append(replace(row, padded_from=g) if padded else row)
    return Plan(device, name, str(getattr(pred, "source", "")), rows)
