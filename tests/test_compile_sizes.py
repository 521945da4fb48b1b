"""Compile sizes (serve/specialize.py): with sizes=, each listed batch size gets a compile of its own (CPU)."""
from __future__ import annotations

import pytest
import torch

from perfmodel.serve import specialize

pytestmark = pytest.mark.skipif(not specialize.supported(), reason="this torch's mark_dynamic has no specialize_on")


def test_mark_sets_one_predicate_per_size_and_leaves_size_one_alone():
    a, b, one = torch.zeros(8, 4), torch.zeros(32, 2), torch.zeros(1, 4)
    assert specialize.mark((a, one), {"b": b, "n": 3}, (8, 32)) == 2
    preds = a._specialize_on[0]
    assert [p(8) for p in preds] == [True, False] and [p(32) for p in preds] == [False, True]
    assert not hasattr(one, "_specialize_on") or 0 not in one._specialize_on
    assert specialize.mark((a,), {}, (8, 32)) == 0          # a tensor is marked once


def test_a_listed_size_compiles_its_own_graph(monkeypatch):
    """Backend compiles counted at Inductor's compile_fx: the first call (size 1, Dynamo specialises it) one; the
    first at a listed size the dynamic graph and that size's own; an unlisted size and a repeat none."""
    import torch._inductor.compile_fx as cfx

    import perfmodel.serve.compile as pc

    calls, depth = [], [0]
    real = cfx.compile_fx

    def counted(gm, inputs, *a, **kw):  # compile_fx may call itself: the outermost call is one graph's compile
        calls.extend([1] if depth[0] == 0 else [])
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
        for b in (1, 4, 5, 6, 4):
            x = torch.randn(b, 16)
            assert torch.allclose(cm(x), m(x), rtol=1e-4, atol=1e-5)
            seen.append(len(calls))
    assert seen == [1, 3, 3, 4, 4]
    torch._dynamo.reset()


def test_specialisation_is_opt_in():
    import perfmodel.serve.compile as pc

    m = torch.nn.Linear(4, 4)
    cm = pc.compile(m, dynamic=True, sizes=[4])                   # the default: the range decision alone
    assert cm._sizes is None
    assert pc.compile(m, dynamic=True, sizes=[4], specialize=True)._sizes == (4,)
    assert pc.compile(m, dynamic=False, sizes=[4], specialize=True)._sizes is None
