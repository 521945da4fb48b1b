"""The GEMMs of a plan (perfmodel.serve.plan) without a GPU: from `--gemm` specs, or traced from a model.

A model is traced with make_fx under FakeTensorMode and Inductor's decomposition table (select_decomp_table):
no kernel runs, no GPU is needed, a model built on the meta device works. torch.nn.functional's
scaled_dot_product_attention is kept opaque while tracing (a custom op, opaque_sdpa): traced off CUDA it decomposes
into math bmm (fp32) that a CUDA compile runs as one fused attention kernel, so its insides are no GEMMs of the
compile; attention written as matmuls (eager attention) still gives its bmm. Each aten.mm / addmm / bmm / baddbmm node
gives its operands' dtype, shape and strides as traced -- what Inductor's GEMM lowerings (kernel/mm.py,
kernel/bmm.py) then key their lookups on. Limits: the forward only; Inductor's post-grad passes (e.g. an addmm
unfused into mm + a pointwise bias, operands copied to another layout) run later and are not seen: a GEMM they
change is keyed differently in the compile, where the table then misses and Inductor decides it as usual.
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
    fake tensors returns its output (query's dtype, shape [..., L, Ev]) without tracing into it."""
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
        return query.new_empty(tuple(query.shape[:-1]) + (value.shape[-1],))

    return op


@contextlib.contextmanager
def opaque_sdpa():
    """torch.nn.functional.scaled_dot_product_attention replaced by _sdpa_op for the block (models that look it up
    at call time, as transformers' sdpa attention does)."""
    import torch.nn.functional as F

    op, prior = _sdpa_op(), F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return op(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                  None if scale is None else float(scale), bool(enable_gqa))

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = prior


def trace_gemms(model: Any, inputs: tuple) -> list[Gemm]:
    """The model's forward GEMMs, traced on fake tensors (see the module docstring), in graph order; repeated
    calls of one shape kept once."""
    import torch
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    ops = {getattr(torch.ops.aten, op).default: op for op in GEMM_OPS}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
    with mode, torch.no_grad(), opaque_sdpa():
        gm = make_fx(lambda *a: model(*a), decomposition_table=select_decomp_table(), tracing_mode="fake")(*fake)
    out: dict[Gemm, None] = {}
    for n in gm.graph.nodes:
        op = ops.get(n.target) if n.op == "call_function" else None
        if op is None:
            continue
        vals = [a.meta["val"] for a in n.args[:3] if hasattr(a, "meta")]
        scalars = (("alpha", n.kwargs.get("alpha", 1)), ("beta", n.kwargs.get("beta", 1))) \
            if op in ("addmm", "baddbmm") else ()
        out[Gemm(op, tuple(_operand(v) for v in vals), scalars)] = None
    return list(out)
