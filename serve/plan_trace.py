"""The GEMMs of a plan (perfmodel.serve.plan) without a GPU: from `--gemm` specs, or traced from a model.

A model is traced as a CUDA compile sees it, with no GPU and no kernel run: make_fx under FakeTensorMode with
Inductor's decomposition table (select_decomp_table), the module's parameters, buffers and the example inputs
replaced by fake tensors on the meta device (Inductor's decompositions of mm / addmm / bmm take their CPU branches
for CPU tensors, the GPU's for any other device: a model built on the CPU would otherwise be planned with the CPU's;
fake "cuda" tensors would do too, but indexing one needs torch built with CUDA), and torch.compiler.is_compiling()
reporting True for the trace (models that build what they need differently under Dynamo, e.g. transformers' attention masks, are
traced as Dynamo runs them). A model built on the meta device works: no weights are allocated.

scaled_dot_product_attention: a CUDA compile runs it as one fused kernel (no GEMM of the compile) unless torch's
CUDA backend choice rejects every fused kernel, and then as its math, whose bmm are the compile's GEMMs (in fp32 for
fp16 / bf16 inputs). The plan decides the same way (cuda_sdpa_fused: the flash and memory-efficient attention
checks torch makes on a GPU of compute capability 8.0 or newer, dense inputs, no grad): fused -> kept opaque (a
custom op, opaque_sdpa); else traced through torch's math. Attention written as matmuls (eager attention) gives its
bmm. Each aten.mm / addmm / bmm / baddbmm node gives its operands' dtype, shape and strides as traced -- what
Inductor's GEMM lowerings (kernel/mm.py, kernel/bmm.py) then key their lookups on. Limits: the forward only; the
installed torch's decompositions (a plan is made with the torch that compiles: torch 2.13's bmm decomposition turns
an outer product, [B, M, 1] x [B, 1, N], into a pointwise product that torch 2.11 lowers as a GEMM); cuDNN attention,
which torch may prefer on a Hopper GPU, is not emulated (it runs fused where flash or memory-efficient attention
could); Inductor's post-grad passes (e.g. an addmm unfused into mm + a pointwise bias, operands copied to another
layout) run later and are not seen: a GEMM they change is keyed differently in the compile, where the table then
misses and Inductor decides it as usual.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")
DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Operand:
    dtype: str                 # torch's name without "torch.", e.g. "bfloat16"
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class Gemm:
    """One GEMM call as Inductor's lowering receives it: op and its operands in argument order (addmm / baddbmm:
    bias, mat1, mat2), and its scalars (addmm / baddbmm: alpha, beta)."""

    op: str
    operands: tuple[Operand, ...]
    scalars: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def mats(self) -> tuple[Operand, Operand]:
        return (self.operands[-2], self.operands[-1])


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _positive(text: str, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"{what}: expected a positive int, got {text!r}") from None
    if v < 1:
        raise ValueError(f"{what}: expected a positive int, got {v}")
    return v


def parse_gemm(spec: str, dtype: str) -> Gemm:
    """'mm:M,N,K', 'addmm:M,N,K' (a 1-D bias of N), 'bmm:B,M,N,K' -> Gemm with row-major operands. ValueError
    naming --gemm and what is wrong."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    op, sep, dims = spec.partition(":")
    if not sep or op not in ("mm", "addmm", "bmm"):
        raise ValueError(f"--gemm {spec!r}: expected mm:M,N,K, addmm:M,N,K or bmm:B,M,N,K")
    names = ("B", "M", "N", "K") if op == "bmm" else ("M", "N", "K")
    parts = dims.split(",")
    if len(parts) != len(names):
        raise ValueError(f"--gemm {spec!r}: {op} takes {','.join(names)} ({len(names)} ints), got {len(parts)}")
    v = dict(zip(names, (_positive(p.strip(), f"--gemm {spec!r}: {n}") for p, n in zip(parts, names))))
    lead = (v["B"],) if op == "bmm" else ()
    a, b = lead + (v["M"], v["K"]), lead + (v["K"], v["N"])
    mats = (Operand(dtype, a, _contiguous(a)), Operand(dtype, b, _contiguous(b)))
    if op == "addmm":
        return Gemm(op, (Operand(dtype, (v["N"],), (1,)),) + mats, (("alpha", 1), ("beta", 1)))
    return Gemm(op, mats)


def load_factory(target: str) -> tuple[Any, tuple]:
    """'pkg.mod:factory' -> factory() as (model, example_inputs). ValueError naming --model-fn and what failed."""
    mod_name, sep, fn_name = target.partition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"--model-fn {target!r}: expected an importable 'package.module:factory'")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # any import failure of the user's module is reported as such
        raise ValueError(f"--model-fn {target!r}: module {mod_name!r} does not import "
                         f"({type(exc).__name__}: {exc})") from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--model-fn {target!r}: {mod_name} has no callable {fn_name!r}")
    out = fn()
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"--model-fn {target!r}: {fn_name}() must return (model, example_inputs), got "
                         f"{type(out).__name__}")
    model, inputs = out
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def _operand(val: Any) -> Operand:
    return Operand(str(val.dtype).replace("torch.", ""), tuple(int(s) for s in val.shape),
                   tuple(int(s) for s in val.stride()))


@functools.cache
def _sdpa_op() -> Any:
    """perfmodel_plan::sdpa, a custom op standing for scaled_dot_product_attention: runs it (real tensors), and on
    fake tensors returns its output (query's dtype, shape [..., L, Ev], for 4-D inputs the strides of the fused CUDA
    kernels' output) without tracing into it."""
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention

    @torch.library.custom_op("perfmodel_plan::sdpa", mutates_args=(), schema=(
        "(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, "
        "float? scale=None, bool enable_gqa=False) -> Tensor"))
    def op(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa).clone()

    @op.register_fake
    def _(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if query.dim() == 4:  # the fused kernels' layout: [B, L, H, Ev] in memory (their meta functions)
            b, h, n = query.shape[:3]
            return query.new_empty((b, n, h, value.shape[-1])).transpose(1, 2)
        return query.new_empty(tuple(query.shape[:-1]) + (value.shape[-1],))

    return op


HALF = ("float16", "bfloat16")


def cuda_sdpa_fused(query: Any, key: Any, value: Any, attn_mask: Any = None, is_causal: bool = False,
                    enable_gqa: bool = False) -> bool:
    """Would torch's CUDA scaled_dot_product_attention run a fused kernel on these inputs, or its math? The checks
    torch makes (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp and sdp_utils_cpp.h) for flash and for
    memory-efficient attention on a GPU of compute capability 8.0 or newer, for dense inputs without grad, every
    backend enabled: True if either passes. Shapes, strides, dtypes and storage offsets only (fake tensors do)."""
    q, k, v = query, key, value
    if not (q.dim() == k.dim() == v.dim() == 4) or q.shape[-2] == 0 or k.shape[-2] == 0:
        return False  # check_tensor_shapes, check_nonzero_sequence_lengths_dense: no fused kernel
    dtypes = {str(t.dtype).replace("torch.", "") for t in (q, k, v)}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if q.shape[0] != k.shape[0] or q.shape[0] != v.shape[0]:
        return False  # check_batch_size_and_num_heads_dense: one batch size
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if enable_gqa:
        heads_ok = hk == hv and hq % hk == 0
    else:
        heads_ok = hq == hk == hv
    if not heads_ok:
        return False
    mask_stride_1 = attn_mask is None or attn_mask.stride(-1) == 1
    qkv_stride_1 = all(t.stride(-1) == 1 for t in (q, k, v))
    d_qk, d_v = q.shape[-1], v.shape[-1]
    flash = (attn_mask is None and dtype in HALF and d_qk == k.shape[-1] == d_v and d_qk <= 256
             and (not is_causal or q.shape[-2] == k.shape[-2])
             and (qkv_stride_1 or d_qk == 1))
    if flash:
        return True
    align = 8 if dtype in HALF else 4
    elem = q.element_size()
    efficient = (dtype in HALF + ("float32",) and d_qk == k.shape[-1] and d_qk % align == 0 and d_v % align == 0
                 and all((t.storage_offset() * elem) % (align * elem) == 0 or t.numel() == 0 for t in (q, k, v))
                 and qkv_stride_1 and mask_stride_1)
    return efficient


@contextlib.contextmanager
def opaque_sdpa():
    """torch.nn.functional.scaled_dot_product_attention replaced for the block (models that look it up at call time,
    as transformers' sdpa attention does): by _sdpa_op where a CUDA compile runs it fused (cuda_sdpa_fused), else by
    torch's math (aten._scaled_dot_product_attention_math: its bmm are the compile's)."""
    import torch
    import torch.nn.functional as F

    op, prior = _sdpa_op(), F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if cuda_sdpa_fused(query, key, value, attn_mask, bool(is_causal), bool(enable_gqa)):
            return op(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                      None if scale is None else float(scale), bool(enable_gqa))
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, float(dropout_p), bool(is_causal), None,
            scale=None if scale is None else float(scale), enable_gqa=bool(enable_gqa))[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = prior


@contextlib.contextmanager
def as_compiling():
    """torch.compiler.is_compiling() reports True for the block: a model traced for a plan takes the branches it
    takes under Dynamo (transformers, for one, materialises the attention mask there instead of leaving it out)."""
    import torch

    prior = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = prior


def _on_device(mode: Any, x: Any, device: str, memo: dict) -> Any:
    """x (a tensor) as a fake tensor on `device` with its dtype, shape and strides (one per tensor: tied weights stay
    tied); anything else as it is."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    if id(x) not in memo:
        with mode:
            memo[id(x)] = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device=device)
    return memo[id(x)]


def trace_gemms(model: Any, inputs: tuple, device: str = "meta") -> list[Gemm]:
    """The model's forward GEMMs, traced on fake tensors on `device` (see the module docstring), in graph order;
    repeated calls of one shape kept once. model: a torch.nn.Module (its parameters and buffers moved to `device`
    as fake tensors, the module itself untouched) or a callable whose tensors are already on one device."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = {getattr(torch.ops.aten, op).default: op for op in GEMM_OPS}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}
    if isinstance(model, torch.nn.Module):
        state = {n: _on_device(mode, t, device, memo) for n, t in
                 [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]}
        fake = tuple(_on_device(mode, x, device, memo) for x in inputs)

        def fn(*a):
            return torch.func.functional_call(model, state, a, tie_weights=False, strict=False)
    else:
        fake = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
        fn = model
    with mode, torch.no_grad(), opaque_sdpa(), as_compiling():
        gm = make_fx(lambda *a: fn(*a), decomposition_table=select_decomp_table(), tracing_mode="fake")(*fake)
    out: dict[Gemm, None] = {}
    for n in gm.graph.nodes:
        op = ops.get(n.target) if n.op == "call_function" else None
        if op is None:
            continue
        vals = [a.meta["val"] for a in n.args[:3] if hasattr(a, "meta")]
        scalars = (("alpha", n.kwargs.get("alpha", 1)), ("beta", n.kwargs.get("beta", 1))) \
            if op in ("addmm", "baddbmm") else ()
        out[batch_one_as_mm(Gemm(op, tuple(_operand(v) for v in vals), scalars))] = None
    return list(out)


def batch_one_as_mm(g: Gemm) -> Gemm:
    """A bmm of batch 1 as the mm of its operands without the batch dimension: Inductor's joint-graph pass
    bmm_to_mm (fx_passes/joint_graph.py) rewrites it so on a GPU before lowering; other GEMMs as they are."""
    a, b = g.operands if g.op == "bmm" else (None, None)
    if a is None or len(a.shape) != 3 or a.shape[0] != 1 or b.shape[0] != 1:
        return g
    return Gemm("mm", tuple(Operand(o.dtype, o.shape[1:], o.stride[1:]) for o in (a, b)))
