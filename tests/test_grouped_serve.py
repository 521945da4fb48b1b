"""The set-up's grouped-GEMM decisions (serve/grouped.py) on CPU: Inductor's real mm_grouped module is wrapped, its
prune is called as the lowering calls it, with SYNTHETIC stand-ins for the operands (no GPU, no compile) and a
SYNTHETIC grouped head (random weights) or the shipped one."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

mg = pytest.importorskip("torch._inductor.kernel.mm_grouped")

from perfmodel.features import FeatureEncoder  # noqa: E402
from perfmodel.model import MLPConfig, PerfMLP  # noqa: E402
from perfmodel.serve import grouped  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


class _Box:
    """An operand as grouped_mm_args reads it: sizes and a dtype (SYNTHETIC)."""

    def __init__(self, size, dtype=torch.bfloat16) -> None:
        self.size, self.dtype = size, dtype

    def get_size(self):
        return self.size

    def get_dtype(self):
        return self.dtype


def _predictor(head=None, encoder=None):
    heads = {} if head is None else {grouped.GROUPED: head}
    encs = {} if encoder is None else {grouped.GROUPED: encoder}
    return SimpleNamespace(bundle=SimpleNamespace(heads=heads, encoders=encs))


def _lower(g=8, m=512, k=2048, n=1408, b_k_major=True, dtype=torch.bfloat16):
    """What the lowering does: grouped_mm_args on the operands, then early_config_prune on Inductor's config list
    (shared memory checked against a Hopper's 227 KiB: get_gpu_shared_memory has no GPU here)."""
    mg.grouped_mm_args((m, k), (g, k, n))
    named = {"A_IS_2D": True, "B_IS_2D": False, "B_IS_K_MAJOR": b_k_major}
    return mg.early_config_prune(g, m, 2, mg.grouped_mm_configs(), named)


@pytest.fixture(autouse=True)
def _fake_args(request, monkeypatch):
    """grouped_mm_args needs Inductor's IR; the stand-in returns the sizes the wrapper reads, and the smem query a
    Hopper's (SYNTHETIC). GPU tests get Inductor's own (a real compile hands the lowering IR nodes)."""
    grouped.reset()
    if request.node.get_closest_marker("gpu"):
        yield
        grouped.reset()
        return
    monkeypatch.setattr(mg, "grouped_mm_args", lambda a, b, *r, **kw: (a, b, None, _Box(a), _Box(b), None))
    monkeypatch.setattr(mg, "get_gpu_shared_memory", lambda: 232448)
    grouped.reset()
    yield
    grouped.reset()


def test_without_a_head_aten_alone_and_recorded():
    inductor = _lower()
    assert len(inductor) > 10                      # Inductor's own prune keeps dozens
    with grouped.installed(_predictor()):
        kept = _lower()
    assert kept == []                              # aten's _grouped_mm alone: nothing benchmarked
    (d,) = grouped.decisions()
    assert (d.g, d.m, d.n, d.k, d.dtype, d.b_k_major) == (8, 512, 1408, 2048, "bfloat16", True)
    assert d.offered == len(inductor) and d.kept == ()
    assert _lower() == inductor                    # the module is restored on exit


def _random_head(seed=0):
    enc = FeatureEncoder(grouped_spec(), "bmm")
    torch.manual_seed(seed)
    head = PerfMLP(MLPConfig(len(enc.names), (32, 32), "none",
                             floor_features=(enc.names.index("log_bmm_roofline_ms"),)))
    return head.eval(), enc


def grouped_spec():
    from perfmodel.devices import get_spec

    return get_spec("h200")


def test_with_a_head_its_top_k_of_inductors_configs():
    head, enc = _random_head()
    inductor = _lower()
    with grouped.installed(_predictor(head, enc), top_k=3):
        kept = _lower()
    tuples = [grouped._config_tuple(c) for c in inductor]
    scores = grouped.rank(head, enc, 8, 512, 1408, 2048, "bfloat16", True, tuples)
    want = [inductor[i] for i in np.argsort(scores, kind="stable")[:3]]
    assert kept == want and len(kept) == 3
    assert all(c in inductor for c in kept)        # never a config Inductor's own prune dropped
    (d,) = grouped.decisions()
    assert d.kept == tuple(grouped._config_tuple(c) for c in want)
    assert len(d.predicted_ms) == 3 and all(np.isfinite(d.predicted_ms))


def test_rank_encodes_tokens_per_expert():
    """The head sees the grouped problem as a bmm of batch g and M = ceil(m / g): two problems with the same tokens
    per expert and experts score alike, whatever the total."""
    head, enc = _random_head(1)
    cfgs = [(16, 128, 128, 3, 4), (64, 128, 64, 4, 8)]
    a = grouped.rank(head, enc, 8, 64, 4096, 4096, "bfloat16", True, cfgs)
    b = grouped.rank(head, enc, 8, 57, 4096, 4096, "bfloat16", True, cfgs)    # ceil(57 / 8) = 8 as well
    assert np.array_equal(a, b)


def test_shipped_h200_head_ranks_the_sweeps_best_high():
    """models/h200's grouped head (fitted on data/h200's grouped rows: this checks it was stored and served, not
    its held-out quality) puts the sweep's best timed config, or one within 1 % of it, in its top 5."""
    from perfmodel import Predictor

    p = Predictor.load(REPO / "models" / "h200", device="h200", backend="torch")
    if grouped.GROUPED not in p.bundle.heads:
        pytest.skip("models/h200 has no grouped head")
    import gzip
    import json

    rows = [json.loads(line) for line in gzip.open(REPO / "data" / "h200" / "grouped-s0of1-p000.jsonl.gz")]
    rows = [r for r in rows if r.get("kind") == "triton" and r.get("routing") == "even_inductor" and r.get("ms")]
    r0 = rows[0]
    same = [r for r in rows if (r["g"], r["total_m"], r["k"], r["n"]) == (r0["g"], r0["total_m"], r0["k"], r0["n"])]
    cfgs = [(r["block_m"], r["block_n"], r["block_k"], r["num_stages"], r["num_warps"]) for r in same]
    scores = grouped.rank(p.bundle.heads[grouped.GROUPED], p.bundle.encoders[grouped.GROUPED], r0["g"],
                          r0["total_m"], r0["n"], r0["k"], r0["dtype"], r0["b_layout"] == "kmajor", cfgs)
    ms = np.array([r["ms"] for r in same])
    top5 = np.argsort(scores, kind="stable")[:5]
    assert ms.min() / ms[top5].min() > 0.99      # the top 5 hold the best timed config or one within 1 % of it


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="Inductor's triton_grouped_mm needs a Hopper GPU")
def test_gpu_setup_decides_a_grouped_mm():
    """A real compile through the set-up: the grouped GEMM is decided (recorded, at most the head's top 3 beside aten
    with models/h200, aten alone without a grouped head) and its output matches eager's."""
    import perfmodel.serve.compile as pc
    from perfmodel import Predictor

    torch._dynamo.reset()
    pc.reset()
    g, m, k, n = 8, 512, 2048, 1408
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * (m // g)

    def f(a, w, offs):
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)

    p = Predictor.load(REPO / "models" / "h200", device="h200")
    out = pc.compile(f, predictor=p, options={"triton.cudagraphs": False})(a, w, offs)
    ref = f(a, w, offs)
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2
    ds = grouped.decisions()
    assert len(ds) == 1 and (ds[0].g, ds[0].m, ds[0].k, ds[0].n) == (g, m, k, n)
    has_head = grouped.GROUPED in p.bundle.heads
    assert (0 < len(ds[0].kept) <= grouped.TOP_K) if has_head else ds[0].kept == ()
    assert "grouped_mm 8 experts" in pc.summary()


def _select_with(choices, alone):
    """What the wrapped autotune_select_algorithm hands Inductor's: the stand-in selector returns its choices."""
    seen = []
    sel = grouped._Select(lambda name, cs, *a, **kw: seen.append(list(cs)) or cs)
    grouped._local.alone = alone
    sel("grouped_mm", choices, [], None)
    return seen[0]


def test_the_set_up_keeps_one_choice_and_benchmarks_nothing():
    """alone=True (the set-up): the head's top-1 config, then one choice reaches Inductor's selection (a lone choice
    is taken without a benchmark); above ATEN_ABOVE rows per expert aten's alone (SYNTHETIC choices)."""
    from torch._inductor.select_algorithm import ExternKernelCaller

    head, enc = _random_head()
    with grouped.installed(_predictor(head, enc), alone=True):
        kept = _lower()
        assert grouped._local.alone is True
    assert len(kept) == 1
    with grouped.installed(_predictor(head, enc), alone=True):
        _lower()                                   # the same problem again: still one record
    assert len(grouped.decisions()) == 1
    aten, tri1, tri2 = object.__new__(ExternKernelCaller), object(), object()
    assert _select_with([aten, tri1, tri2], alone=True) == [tri1]
    assert _select_with([aten], alone=True) == [aten]
    assert _select_with([aten, tri1, tri2], alone=False) == [aten, tri1, tri2]   # the hook: Inductor benchmarks
    grouped.reset()
    m = 8 * (grouped.ATEN_ABOVE + 1)                                              # > ATEN_ABOVE rows per expert
    with grouped.installed(_predictor(head, enc), alone=True):
        assert _lower(m=m) == []
    (d,) = grouped.decisions()
    assert d.m == m and d.kept == ()


def test_spilling_configs_rank_last():
    """A config whose fp32 accumulator needs >= 256 registers a thread (128x256 on 4 warps) ranks after every other,
    whatever the head says (SYNTHETIC head)."""
    head, enc = _random_head(2)
    cfgs = [(128, 256, 64, 3, 4), (16, 128, 128, 3, 4), (128, 256, 64, 3, 8)]
    s = grouped.rank(head, enc, 8, 4096, 4096, 4096, "bfloat16", True, cfgs)
    assert int(np.argmax(s)) == 0 and s[0] - max(s[1], s[2]) > 5
