"""Compile sizes (serve/specialize.py): with sizes= and specialize=True, each listed batch size gets a compile of its
own, the other sizes the dynamic one (CPU)."""
from __future__ import annotations

import pytest
import torch

from perfmodel.serve import specialize


def test_leading_size_and_mark_static():
    a, b = torch.zeros(8, 4), torch.zeros(32, 2)
    assert specialize.leading_size((3, a), {"b": b}) == 8
    assert specialize.leading_size((), {"b": b}) == 32
    assert specialize.leading_size((torch.tensor(1.0),), {}) is None
    assert specialize.mark_static((a,), {"b": b}, 8) == 1
    assert 0 in a._dynamo_static_indices and not hasattr(b, "_dynamo_static_indices")


def test_recompile_limit_raised_never_lowered():
    import torch._dynamo.config as dc

    name = "recompile_limit" if hasattr(dc, "recompile_limit") else "cache_size_limit"
    with dc.patch(name, 8):
        assert specialize.ensure_recompile_limit(3) == 8
        assert specialize.ensure_recompile_limit(10) == 10 + specialize.EXTRA_ENTRIES


def test_listed_sizes_compile_their_own_graphs(monkeypatch):
    """Graph compiles counted at Inductor's compile_fx (its outermost call) and which compile each call went to: a
    listed size compiles a static graph of its own at its first call, an unlisted size the dynamic graph once, a
    repeat nothing; outputs equal eager's."""
    import torch._inductor.compile_fx as cfx

    import perfmodel.serve.compile as pc

    calls, depth, shapes = [], [0], []
    real = cfx.compile_fx

    def counted(gm, inputs, *a, **kw):
        if depth[0] == 0:
            calls.append(1)
            vals = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
            shapes.append(any(isinstance(v, torch.SymInt) or isinstance(v, torch.Tensor) and
                              any(isinstance(d, torch.SymInt) for d in v.shape) for v in vals))
        depth[0] += 1
        try:
            return real(gm, inputs, *a, **kw)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(cfx, "compile_fx", counted)
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    cm = pc.compile(m, dynamic=True, sizes=[4, 6], specialize=True)
    seen = []
    with torch.no_grad():
        for b in (4, 5, 6, 4, 7, 6):
            x = torch.randn(b, 16)
            assert torch.allclose(cm(x), m(x), rtol=1e-4, atol=1e-5)
            seen.append(len(calls))
    assert seen == [1, 2, 3, 3, 3, 3]
    assert cm._compiled.calls == {"per_size": 4, "dynamic": 2}
    # the listed sizes' graphs are static; the dynamic one has a symbolic size
    assert shapes == [False, True, False]
    torch._dynamo.reset()


def test_specialisation_is_opt_in_and_checked():
    import perfmodel.serve.compile as pc

    m = torch.nn.Linear(4, 4)
    cm = pc.compile(m, dynamic=True, sizes=[4])                   # the default: the range decision alone
    assert cm._sizes is None and not isinstance(cm._compiled, specialize.Dispatch)
    assert pc.compile(m, dynamic=True, sizes=[4], specialize=True)._sizes == (4,)
    assert pc.compile(m, dynamic=False, sizes=[4], specialize=True)._sizes is None
    with pytest.raises(ValueError, match="specialize: True needs sizes"):
        pc.compile(m, dynamic=True, specialize=True)
    with pytest.raises(TypeError, match="specialize: expected a bool"):
        pc.compile(m, dynamic=True, sizes=[4], specialize="yes")


class _ScaledMLP(torch.nn.Module):
    """An MLP that reads a tensor attribute with .item() in its forward, as transformers' rotary embedding reads
    attention_scaling: the graph Dynamo's own specialize_on failed to compile per size on torch 2.11."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        self.register_buffer("scaling", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.scaling.item()


def test_compile_sizes_with_an_item_call():
    import perfmodel.serve.compile as pc

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _ScaledMLP().eval()
    cm = pc.compile(m, dynamic=True, sizes=[4, 8], specialize=True)
    with torch.no_grad():
        for b in (4, 8, 5, 4):
            x = torch.randn(b, 16)
            assert torch.allclose(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert cm._compiled.calls == {"per_size": 3, "dynamic": 1}
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_compile_sizes_dispatch_and_match_eager():
    """On a GPU, with the set-up's CUDA graphs: each listed batch size runs its own static graph, an unlisted one the
    dynamic graph; every output equals eager's (fp32 on TF32 off: 1e-3 relative)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import perfmodel.serve.compile as pc

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = _ScaledMLP().cuda().eval()
    cm = pc.compile(m, dynamic=True, sizes=[8, 32], specialize=True)
    with torch.no_grad():
        for b in (8, 32, 16, 8, 32):
            x = torch.randn(b, 16, device="cuda")
            for _ in range(3):  # CUDA graphs record on a later call
                torch.compiler.cudagraph_mark_step_begin()
                out = cm(x).clone()
            ref = m(x)
            assert ((out - ref).norm() / ref.norm()).item() < 1e-3
    assert cm._compiled.calls["per_size"] == 12 and cm._compiled.calls["dynamic"] == 3
    torch._dynamo.reset()
