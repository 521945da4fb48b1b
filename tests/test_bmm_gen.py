"""The bmm sweep (`perfmodel gen bmm`, data_gen/bmm*.py) on the CPU, and GemmProblem.batch at serving.

The kernel runs under TRITON_INTERPRET=1 in subprocesses (the variable must be set before triton is
imported); bf16 is left out there (the interpreter's bf16 tl.dot is wrong) and covered by the sm_90
compile check and the GPU test. The sweep's timings on the CPU come from synthetic CUDA events: those
tests check the machinery (plan, compiles, checks, shards, resume, limits), not times.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfmodel import GemmConfig, GemmProblem
from perfmodel.devices import get_spec

SPEC = get_spec("h100-sxm")


def _child(repo_root: Path, code: str, *args: str, timeout: int = 600) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=repo_root, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line[len("RESULTS"):])


# ------------------------------------------------------------------------------ serving: batch > 1

def test_a_model_without_bmm_heads_refuses_batched_problems(tmp_path):
    from perfmodel.serve import Predictor
    from tests._synthetic import write_synthetic_model

    p = Predictor.load(write_synthetic_model(tmp_path / "model", seed=0), backend="torch")
    cfgs = [GemmConfig(128, 128, 64, 8, 3, 4), GemmConfig(64, 64, 32, 8, 2, 4)]
    plain, bmm = GemmProblem(m=384, n=384, k=64), GemmProblem(m=384, n=384, k=64, batch=256)
    for call in (lambda: p.predict(bmm, cfgs), lambda: p.rank(bmm, cfgs), lambda: p.candidates(bmm)):
        with pytest.raises(ValueError, match=r"^batch: .* has no 'bmm' head, so it cannot predict a bmm \(batch=256\)"):
            call()
    with pytest.raises(ValueError, match=r"^batch: .* has no 'bmm_aten' head"):
        p.predict_cublas(bmm)
    with pytest.raises(ValueError, match=r"^batch: the problems mix batch=1"):
        p.predict_many([plain, bmm], cfgs)
    # batch=1 spelled out is the plain GEMM: the same predictions
    assert (p.predict(GemmProblem(m=384, n=384, k=64, batch=1), cfgs) == p.predict(plain, cfgs)).all()


# ---------------------------------------------------------------------------------- the problem draw

@pytest.fixture(scope="module")
def drawn():
    from perfmodel.data_gen.bmm import bmm_problems

    return bmm_problems(400, SPEC, seed=0)


def test_draw_is_deterministic_and_extends(drawn):
    from perfmodel.data_gen.bmm import bmm_problems, problem_id

    assert bmm_problems(400, SPEC, seed=0) == drawn
    assert bmm_problems(150, SPEC, seed=0) == drawn[:150]  # a larger --n extends the list a run resumes
    assert bmm_problems(50, SPEC, seed=1) != drawn[:50]
    ids = [problem_id(p) for p, _ in drawn]
    assert len(set(ids)) == len(ids) and all(i.startswith("bmm-") for i in ids)
    # exclude: n new problems, none of those excluded
    ex = frozenset(ids[:100])
    more = bmm_problems(100, SPEC, seed=0, exclude=ex)
    assert len(more) == 100 and not {problem_id(p) for p, _ in more} & ex


def test_draw_modes(drawn):
    from perfmodel.data_gen.bmm import bmm_problems

    assert bmm_problems(400, SPEC, seed=0, modes=None) == drawn  # no --modes: the draw as before
    fp32 = bmm_problems(120, SPEC, seed=0, modes=("tf32", "float32"))
    got = {(p.dtype, p.allow_tf32) for p, _ in fp32}
    assert got == {("float32", True), ("float32", False)}  # both modes drawn, no other
    assert bmm_problems(120, SPEC, seed=0, modes=("float32", "tf32")) == fp32  # the order named does not matter
    assert {p.dtype for p, _ in bmm_problems(30, SPEC, seed=0, modes=("bfloat16",))} == {"bfloat16"}
    with pytest.raises(ValueError, match="modes"):
        bmm_problems(10, SPEC, seed=0, modes=("fp8",))


def test_draw_within_budget(drawn):
    from perfmodel.data_gen.bmm import BmmBudget, within

    b = BmmBudget()
    assert all(within(p, SPEC, b) for p, _ in drawn)
    assert max(p.flops for p, _ in drawn) <= 2e12
    assert all(p.batch * max(p.m * p.k, p.k * p.n, p.m * p.n) < 2**31 for p, _ in drawn)  # int32 indexing
    assert sum(p.flops > 1e11 for p, _ in drawn) >= 10  # and not only tiny ones


def test_draw_covers_what_users_run(drawn):
    from perfmodel.data_gen.bmm import FAMILIES, HEAD_DIMS, needs_padding

    fam = collections.Counter(f for _, f in drawn)
    assert set(fam) == set(FAMILIES) and min(fam.values()) >= 40
    modes = collections.Counter((p.dtype, p.allow_tf32) for p, _ in drawn)
    assert set(modes) == {("float16", False), ("bfloat16", False), ("float32", True), ("float32", False)}
    assert min(modes.values()) >= 20
    score = [p for p, f in drawn if f == "attn_score"]
    value = [p for p, f in drawn if f == "attn_value"]
    # QK^T: K^T a transposed view (B column-major) and a contiguous copy; head dims 64 and 128
    assert {p.transpose_right for p in score} == {True, False}
    assert {p.k for p in score} == set(HEAD_DIMS) and {p.n for p in value} == set(HEAD_DIMS)
    assert all(8 <= p.batch <= 512 for p in score + value)
    assert all(64 <= p.n <= 8192 for p in score) and max(p.n for p in score) >= 2048
    assert any(p.m < 32 for p in score + value)  # decode-like queries
    experts = [p for p, f in drawn if f == "experts"]
    assert all(8 <= p.batch <= 64 and 16 <= p.m <= 2048 and 1024 <= p.n <= 8192 and 1024 <= p.k <= 8192 for p in experts)
    small = [p for p, f in drawn if f == "small"]
    assert all(64 <= p.batch <= 4096 and max(p.m, p.n, p.k) <= 128 for p in small)
    layouts = collections.Counter((p.transpose_left, p.transpose_right) for p, _ in drawn)
    assert len(layouts) == 4 and min(layouts.values()) >= 10
    assert 0.2 < sum(needs_padding(p) for p, _ in drawn) / len(drawn) < 0.8  # pad_mm would pad these
    # problems that differ only in batch (they share every compiled kernel)
    from perfmodel.data_gen.bmm import shape_key

    assert len({shape_key(p) for p, _ in drawn}) < 0.85 * len(drawn)


def test_padded_dims_follow_pad_mm():
    from perfmodel.data_gen.bmm import needs_padding, padded_dims

    assert padded_dims(GemmProblem(m=77, n=77, k=64, batch=16)) == (80, 64, 80)
    assert padded_dims(GemmProblem(m=1, n=9, k=5, dtype="float32", batch=4)) == (1, 8, 12)  # 1 is never padded
    assert not needs_padding(GemmProblem(m=64, n=8, k=16, batch=3))


# ------------------------------------------------------------------------------------------ configs

def _torch_configs(m: int, n: int, k: int, exhaustive: bool) -> list[GemmConfig]:
    """The installed torch's own config list for a static (m, n, k) bmm (its private heuristics API)."""
    heur = pytest.importorskip("torch._inductor.template_heuristics.triton")
    from torch._inductor import config
    from torch._inductor.virtualized import V

    class SizeVars:
        def optimization_hint_with_override(self, x, hint_override=None):
            return int(x)

    class Graph:
        sizevars = SizeVars()

    h = heur.CUDAMMTemplateConfigHeuristic()
    with V.set_graph_handler(Graph()), config.patch(max_autotune_gemm_search_space="EXHAUSTIVE" if exhaustive else "DEFAULT"):
        gen = h.get_exhaustive_mm_configs() if exhaustive else h.get_mm_configs()
        return [GemmConfig(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["GROUP_M"],
                           c.num_stages, c.num_warps) for c in gen(m, n, k, dtype_size=2, op_name="bmm")]


@pytest.mark.parametrize("m,n,k", [(384, 384, 64), (384, 64, 384), (1, 8192, 128), (48, 100, 33), (16, 16, 16),
                                   (2048, 4096, 1024), (77, 77, 64), (7, 24, 1)])
def test_configs_are_inductors(m, n, k):
    """default_configs / inductor_scale reproduce Inductor's DEFAULT and EXHAUSTIVE lists for the shape."""
    from perfmodel.data_gen.bmm import EXHAUSTIVE_RAW, default_configs, inductor_scale

    try:
        want_default, want_exh = _torch_configs(m, n, k, False), _torch_configs(m, n, k, True)
    except (AttributeError, TypeError) as exc:  # a torch whose private heuristics API moved
        pytest.skip(f"torch's config heuristics API differs: {exc}")
    got = default_configs(GemmProblem(m=m, n=n, k=k, batch=8))
    assert [c for c, _ in got] == want_default
    assert [c for c, _ in inductor_scale(m, n, k, EXHAUSTIVE_RAW, prune_reg_spill=True)] == want_exh


def test_config_sources_and_extras():
    from perfmodel.configs import fits
    from perfmodel.data_gen.bmm import default_configs, extra_configs, fma_per_thread, sweep_configs

    p = GemmProblem(m=2048, n=2048, k=1024, batch=8)
    src = dict(default_configs(p))
    assert src[GemmConfig(128, 256, 64, 8, 4, 8)] == "default_2.13"  # only in torch 2.13's list
    assert collections.Counter(src.values()) == {"default": 20, "default_2.13": 1}
    cfgs = sweep_configs(p, SPEC, 6)
    extras = [c for c, s in cfgs if s == "exhaustive"]
    assert len(extras) == 6 and not set(extras) & set(src) and all(fits(c, "float16", SPEC) for c in extras)
    assert extras == extra_configs(GemmProblem(m=2048, n=2048, k=1024, batch=64), SPEC, 6, set(src))  # per shape
    # small dims: Inductor's list shrinks (blocks capped at the dims, duplicates dropped)
    tiny = default_configs(GemmProblem(m=16, n=16, k=16, batch=512))
    assert all((c.block_m, c.block_n, c.block_k, c.num_warps) == (16, 16, 16, 1) for c, _ in tiny) and len(tiny) < 10
    # fp32 without tf32: extras stay cheap to compile; Inductor's own list is kept whole
    ieee = GemmProblem(m=2048, n=2048, k=1024, dtype="float32", batch=8)
    ieee_cfgs = sweep_configs(ieee, SPEC, 6)
    assert all(fma_per_thread(c) <= 4096 for c, s in ieee_cfgs if s == "exhaustive")
    assert max(fma_per_thread(c) for c, s in ieee_cfgs if s != "exhaustive") == 8192


def test_estimate_shares_kernels_across_batches():
    from perfmodel.data_gen.bmm import estimate, sweep_configs

    a = GemmProblem(m=384, n=384, k=64, batch=64)
    b = GemmProblem(m=384, n=384, k=64, batch=256)
    c = GemmProblem(m=384, n=384, k=64, dtype="float32", batch=64)
    plan = {p: sweep_configs(p, SPEC, 6) for p in (a, b, c)}
    one, two = estimate([a], plan, SPEC, 15), estimate([a, b], plan, SPEC, 15)
    assert two["kernels"] == one["kernels"] == len(plan[a]) and two["configs"] == 2 * one["configs"]
    assert two["timing_s"] > one["timing_s"]
    ieee = estimate([c], plan, SPEC, 15)
    assert ieee["compile_s"] > 3 * one["compile_s"]  # fp32 without tf32 compiles much slower per config
    assert estimate([a], plan, SPEC, 5)["compile_s"] == pytest.approx(3 * one["compile_s"], rel=0.01)


def test_default_n_sized_for_eight_minutes():
    from perfmodel.data_gen.bmm import BmmSweepSettings, bmm_problems, estimate, sweep_configs

    s = BmmSweepSettings()
    problems = [p for p, _ in bmm_problems(s.n, SPEC, s.seed)]
    est = estimate(problems, {p: sweep_configs(p, SPEC, s.extra_configs) for p in problems}, SPEC, 15)
    assert 360 <= est["wall_s"] <= 480, est


# ------------------------------------------------------------------------------------------- kernel

KERNEL_CHILD = textwrap.dedent("""
    import json
    import torch
    import triton
    from perfmodel import GemmConfig
    from perfmodel.data_gen import bmm_kernel

    assert triton.runtime.interpreter is not None
    gen = torch.Generator().manual_seed(0)
    results = {}
    # (batch, M, N, K): odd sizes, a single row, K < BLOCK_K, K a multiple of 16 with ragged M/N,
    # M below BLOCK_M (the bmm template hints contiguity there too)
    shapes = [(3, 37, 45, 53), (2, 1, 17, 33), (4, 70, 16, 129), (2, 20, 7, 16)]
    configs = [GemmConfig(16, 16, 16, 8, 1, 1), GemmConfig(32, 16, 32, 4, 2, 4), GemmConfig(16, 32, 16, 2, 3, 8)]
    for b, m, n, k in shapes:
        for tl_ in (False, True):
            for tr in (False, True):
                for dtype, tf32 in (("float16", False), ("float32", False), ("float32", True)):
                    dt = getattr(torch, dtype)
                    a = torch.randn(b, k, m, generator=gen).to(dt).transpose(1, 2) if tl_ else torch.randn(b, m, k, generator=gen).to(dt)
                    w = torch.randn(b, n, k, generator=gen).to(dt).transpose(1, 2) if tr else torch.randn(b, k, n, generator=gen).to(dt)
                    ref = torch.bmm(a.double(), w.double())
                    aten = torch.bmm(a.float(), w.float()).double()
                    for cfg in configs:
                        # the output: a view into a NaN-poisoned buffer with 3 extra columns (an unwritten
                        # element and a store outside the mask both show)
                        buf = torch.full((b, m, n + 3), float("nan"), dtype=dt)
                        out = buf[:, :, :n]
                        bmm_kernel.launch(a, w, out, cfg, tf32)
                        key = f"{b}x{m}x{n}x{k}|{int(tl_)}{int(tr)}|{dtype}|{int(tf32)}|{cfg.block_m}-{cfg.block_n}-{cfg.block_k}"
                        results[key] = {"err": ((out.double() - ref).norm() / ref.norm()).item(),
                                        "err_vs_aten": ((out.double() - aten).norm() / aten.norm()).item(),
                                        "written": bool(torch.isfinite(out).all()),
                                        "outside": bool(torch.isnan(buf[:, :, n:]).all())}
                c = bmm_kernel.bmm(a, w, configs[0])
                results[f"alloc|{b}x{m}x{n}x{k}|{int(tl_)}{int(tr)}"] = [list(c.shape), c.is_contiguous()]
    print("RESULTS" + json.dumps(results))
""")


@pytest.fixture(scope="module")
def kernel_results(repo_root):
    return _child(repo_root, KERNEL_CHILD)


@pytest.mark.slow
def test_kernel_matches_torch_bmm(kernel_results):
    tol = {"float16": 1e-2, "float32": 1e-5}
    checked = 0
    for key, r in kernel_results.items():
        if key.startswith("alloc"):
            continue
        dtype, tf32 = key.split("|")[2], key.split("|")[3] == "1"
        assert r["written"] and r["outside"], key
        assert r["err"] < (1e-2 if tf32 else tol[dtype]), (key, r)
        assert r["err_vs_aten"] < (1e-2 if tf32 else tol[dtype]), (key, r)
        checked += 1
    assert checked == 4 * 4 * 3 * 3  # shapes x layouts x modes x configs


@pytest.mark.slow
def test_kernel_allocating_entry_point(kernel_results):
    for key, (shape, contiguous) in ((k, v) for k, v in kernel_results.items() if k.startswith("alloc")):
        b, m, n, _ = map(int, key.split("|")[1].split("x"))
        assert shape == [b, m, n] and contiguous


def test_kernel_compiles_for_the_h100():
    """The source compiles for sm_90 (Triton's own ptxas, no GPU), in every dtype mode and both layouts;
    a config over the H100's shared memory compiles and is refused at load (a failure row)."""
    import torch

    from perfmodel.data_gen import bmm_kernel
    from perfmodel.data_gen.bmm import strides

    pytest.importorskip("triton.backends.nvidia")
    for dtype, tf32 in (("float16", False), ("bfloat16", False), ("float32", True), ("float32", False)):
        for tl_, tr in ((False, False), (False, True), (True, True)):
            p = GemmProblem(m=384, n=197, k=100, dtype=dtype, allow_tf32=tf32, transpose_left=tl_, transpose_right=tr,
                            batch=64)
            k = bmm_kernel.compile_for_target(getattr(torch, dtype), p.m, p.n, p.k, strides(p),
                                              GemmConfig(64, 64, 32, 8, 3, 4), tf32)
            assert 0 < k.metadata.shared <= SPEC.shared_memory_per_block_optin
    big = bmm_kernel.compile_for_target(torch.float16, 1024, 1024, 4096, strides(GemmProblem(m=1024, n=1024, k=4096)),
                                        GemmConfig(128, 128, 128, 8, 4, 8), False)
    assert big.metadata.shared > SPEC.shared_memory_per_block_optin  # 128x128x128, 4 stages: 256 KiB


def test_kernel_hash_and_mode():
    from perfmodel.data_gen import bmm_kernel, kernel

    assert len(bmm_kernel.kernel_source_hash()) == 16 and bmm_kernel.kernel_source_hash() != kernel.kernel_source_hash()
    assert "bmm" in bmm_kernel.kernel_mode()
    assert bmm_kernel.grid(12, 100, 64, 32, 64) == (4, 12, 1)


# ----------------------------------------------------------------- the sweep on the CPU (interpreter)

SWEEP_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    from perfmodel import GemmConfig, GemmProblem
    from perfmodel.data_gen import bmm_kernel, bmm_sweep
    from perfmodel.data_gen.bmm import BmmSweepSettings
    from perfmodel.data_gen.measure import Bench, TimingSettings
    from perfmodel.data_gen.shards import ShardMismatchError
    from perfmodel.devices import get_spec

    class Event:  # every timed run takes 0.05 ms; never stalled
        def __init__(self, enable_timing=True):
            pass
        def record(self):
            pass
        def elapsed_time(self, end):
            return 0.05
        def query(self):
            return False

    torch.cuda.Event, torch.cuda._sleep = Event, lambda cycles: None
    torch.cuda.synchronize = torch.cuda.empty_cache = lambda: None

    def bench():
        b = Bench.__new__(Bench)
        b.device, b.flush_ms, b._sleep_cycles = torch.device("cpu"), 0.01, 0
        b.settings = TimingSettings(budget_ms=0.0, min_reps=1, max_reps=1)
        b.flush = lambda: None
        return b

    clock = type("Clock", (), {"sm_clock_mhz": lambda self: 1980.0})()
    P = [(GemmProblem(m=20, n=24, k=40, batch=3), "small"),
         (GemmProblem(m=20, n=24, k=40, batch=5), "small"),                      # the same kernels
         (GemmProblem(m=17, n=33, k=16, dtype="float32", transpose_right=True, batch=2), "attn_score"),  # padded
         (GemmProblem(m=9, n=16, k=24, dtype="float32", allow_tf32=True, transpose_left=True, batch=2), "attn_value")]
    bmm_sweep.bmm_problems = lambda n, spec, seed, budget, rebatch, exclude, modes: [q for q in P[:n] if True]
    spec, folder = get_spec("h100-sxm"), Path(sys.argv[1])
    live = {"device_name": "NVIDIA H100 80GB HBM3 (fake)", "sm_count": 132, "capability": [9, 0]}
    out = {}

    def run(n, **kw):
        s = BmmSweepSettings(n=n, extra_configs=1, compile_workers=1, **kw)
        return bmm_sweep.sweep(folder, spec, live, s, bench(), bench(), clock, progress=False)

    out["limited"] = run(4, time_limit_s=1e-9)
    out["first"] = run(3)
    out["resumed"] = run(4)
    out["nothing"] = run(4)
    try:
        bmm_sweep.sweep(folder, spec, {**live, "device_name": "another GPU"}, BmmSweepSettings(n=4), bench(), bench(),
                        clock, progress=False)
        out["mixed"] = "accepted"
    except ShardMismatchError as exc:
        out["mixed"] = str(exc)

    # measure_problem's failure rows: a compile error, and a config that writes nothing
    real = bmm_kernel.launch
    WRONG = GemmConfig(16, 16, 16, 8, 2, 1)
    bmm_kernel.launch = lambda a, b, c, cfg, tf32=False: None if cfg == WRONG else real(a, b, c, cfg, tf32)
    p = GemmProblem(m=20, n=24, k=40, batch=3)
    rows = bmm_sweep.measure_problem(p, "small", [(GemmConfig(16, 16, 16, 8, 1, 1), "default", ""),
                                                  (WRONG, "default", ""),
                                                  (GemmConfig(32, 32, 32, 8, 2, 4), "exhaustive", "compile:CompilationError:x")],
                                     bench(), bench(), spec, clock)
    out["failures"] = [{k: r.get(k) for k in ("kind", "block_m", "num_stages", "status", "source")} for r in rows]
    print("RESULTS" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def swept(repo_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bmm")
    return _child(repo_root, SWEEP_CHILD, str(folder)), folder


def test_sweep_stops_at_the_time_limit_and_resumes(swept):
    out, folder = swept
    assert out["limited"]["stopped_at_time_limit"] and out["limited"]["problems"] == 0
    assert out["first"]["problems"] == 3 and not out["first"]["stopped_at_time_limit"]
    assert out["resumed"]["problems"] == 1 and out["resumed"]["resumed_existing_rows"] == out["first"]["rows"]
    assert out["nothing"]["problems"] == 0 and out["nothing"]["resumed_existing_rows"] == (
        out["first"]["rows"] + out["resumed"]["rows"])
    # the batch-5 problem compiled nothing of its own: one kernel per (shape, config)
    assert out["first"]["kernels_compiled"] == out["first"]["kernels_to_compile"] < out["first"]["ok_rows"]
    assert "refusing to mix shards: device_name" in out["mixed"]


def test_sweep_rows(swept):
    from perfmodel.data_gen.bmm import default_configs, problem_id
    from perfmodel.data_gen.shards import read_dataset

    out, folder = swept
    rows, headers = read_dataset(folder, "bmm")
    assert len(headers) == 4 and {h["kernel_mode"] for h in headers} == {__import__(
        "perfmodel.data_gen.bmm_kernel", fromlist=["x"]).kernel_mode()}
    units = collections.defaultdict(list)
    for r in rows:
        units[r["unit"]].append(r)
    assert len(units) == 4
    for unit, rs in units.items():
        p = GemmProblem(**{f: rs[0][f] for f in ("m", "n", "k", "dtype", "allow_tf32", "transpose_left",
                                                 "transpose_right", "batch")})
        assert unit == problem_id(p) and all(r["batch"] == p.batch and r["family"] for r in rs)
        kinds = collections.Counter(r["kind"] for r in rs)
        pad = p.m % (4 if p.dtype == "float32" else 8) or p.n % (4 if p.dtype == "float32" else 8) or \
            p.k % (4 if p.dtype == "float32" else 8)
        assert kinds["aten"] == 1 and kinds["aten_pad"] == (1 if pad else 0)
        triton = [r for r in rs if r["kind"] == "triton"]
        want = [c for c, _ in default_configs(p)]
        assert [GemmConfig(*(r[f] for f in ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")))
                for r in triton if r["source"] != "exhaustive"] == want
        assert sum(r["source"] == "exhaustive" for r in triton) == 1
        for r in rs:  # every row checked against the reference and the physical limits
            assert r["status"] == "ok" and r["ms"] == 0.05 and r["rel_err"] < 1e-2 and 0 < r["frac_peak"] < 1
        if kinds["aten_pad"]:
            (r,) = [r for r in rs if r["kind"] == "aten_pad"]
            assert (r["padded_m"], r["padded_k"], r["padded_n"]) != (p.m, p.k, p.n)


def test_sweep_failure_rows(swept):
    out, _ = swept
    by = {(r["kind"], r["block_m"], r["num_stages"]): r for r in out["failures"]}
    assert by[("triton", 16, 1)]["status"] == "ok"
    assert by[("triton", 16, 2)]["status"] == "fail:wrong_result"
    assert by[("triton", 32, 2)]["status"] == "fail:compile:CompilationError:x"
    assert by[("triton", 32, 2)]["source"] == "exhaustive"
    assert by[("aten", None, None)]["status"] == "ok"


def test_data_info_counts_bmm_rows(swept):
    from perfmodel.data_gen.info import dataset_info
    from perfmodel.data_gen.shards import read_dataset

    _, folder = swept
    rows, _ = read_dataset(folder, "bmm")
    info = dataset_info(folder)
    assert info["bmm_problems"] == 4 and info["bmm_parts"] == 4
    assert info["bmm_rows"] == sum(r["kind"] == "triton" and r["status"] == "ok" for r in rows) > 0
    assert info["bmm_aten_rows"] == 4 and info["bmm_aten_pad_rows"] == 4  # every one has a dim pad_mm pads
    assert info["bmm_problems_by_family"] == {"attn_score": 1, "attn_value": 1, "small": 2}
    assert info["bmm_problems_by_dtype"] == {"float16": 2, "float32": 1, "tf32": 1}
    assert set(info["bmm_rows_by_source"]) == {"default", "exhaustive"}
    assert info["device"] == "NVIDIA H100 80GB HBM3 (fake)"


def _crashing_chunk(dtype, allow_tf32, M, N, K, strides, cfgs):
    """A compile task whose worker dies on BLOCK_M 32 (Compiles must survive it)."""
    if any(c["block_m"] == 32 for c in cfgs):
        os._exit(3)
    return [(c, "") for c in cfgs]


def test_compiles_survive_a_dying_worker(repo_root):
    from perfmodel.data_gen.bmm_sweep import Compiles

    p = GemmProblem(m=64, n=64, k=64, batch=4)
    cfgs = [GemmConfig(16, 16, 16), GemmConfig(32, 32, 32), GemmConfig(64, 64, 64), GemmConfig(64, 64, 32)]
    c = Compiles(1, compile_chunk=_crashing_chunk)
    try:
        assert c.submit(p, cfgs) == 4 and c.submit(GemmProblem(m=64, n=64, k=64, batch=9), cfgs) == 0
        errs = [c.error(p, cfg, timeout=120) for cfg in cfgs]
    finally:
        c.shutdown()
    # the task of the dying worker ([16, 32]) fails; the other ([64, 64]) is compiled by a fresh pool
    assert errs[0].startswith("compile:BrokenProcessPool") and errs[1].startswith("compile:BrokenProcessPool")
    assert errs[2:] == ["", ""] and c.restarts == 1


# ---------------------------------------------------------------------------------------------- CLI

@pytest.mark.parametrize("argv, flag", [(["--n", "0"], "--n"), (["--extra-configs", "-1"], "--extra-configs"),
                                        (["--workers", "0"], "--workers"), (["--time-limit", "0"], "--time-limit"),
                                        (["--budget-ms", "-1"], "--budget-ms"), (["--slow-factor", "-2"], "--slow-factor"),
                                        (["--exclude-from", "/no/such/folder"], "--exclude-from"),
                                        (["--problems-spec", "no-such-gpu"], "--problems-spec"),
                                        (["--modes", "float16,fp8"], "--modes")])
def test_cli_errors_name_the_flag(argv, flag, capsys, tmp_path):
    from perfmodel.cli import main

    assert main(["gen", "bmm", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}:" in err


def test_cli_builds_the_settings(tmp_path):
    from perfmodel.cli import build_parser
    from perfmodel.data_gen.cli import bmm_settings
    from perfmodel.data_gen.shards import ShardWriter

    ex = tmp_path / "ex"
    with ShardWriter(ex, "bmm", {"device_name": "x"}) as w:
        w.write_unit("bmm-aaaa", [{"kind": "aten", "status": "ok"}])
    args = build_parser().parse_args(["gen", "bmm", "--n", "7", "--seed", "3", "--time-limit", "480",
                                      "--exclude-from", str(ex), "--slow-factor", "0", "--problems-spec", "h100-sxm",
                                      "--modes", "tf32,float32"])
    s = bmm_settings(args)
    assert (s.n, s.seed, s.time_limit_s, s.exclude, s.timing.slow_factor) == (7, 3, 480.0, frozenset({"bmm-aaaa"}), None)
    assert s.modes == ("tf32", "float32")
    assert s.problem_spec == "h100-sxm"


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gen_bmm_end_to_end(tmp_path, repo_root):
    """`perfmodel gen bmm --n 4` on the GPU: every problem's rows, checked and valid; resumes; counted."""
    import torch

    from perfmodel.data_gen.bmm import KIND, bmm_problems, default_configs, problem_id
    from perfmodel.data_gen.bmm_kernel import kernel_source_hash
    from perfmodel.data_gen.measure import TOLERANCE
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.devices import match_spec

    def gen(*argv: str) -> dict:
        stats = tmp_path / "stats.json"
        proc = subprocess.run([sys.executable, "-m", "perfmodel.cli", "gen", "bmm", "--out", str(tmp_path / "data"),
                               "--no-progress", "--stats", str(stats), *argv], cwd=repo_root, capture_output=True,
                              text=True, timeout=580)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "estimate" in proc.stderr
        return json.loads(stats.read_text())

    stats = gen("--n", "4")
    assert stats["problems"] == 4 and stats["rejected_rows"] == 0
    rows, headers = read_dataset(tmp_path / "data", KIND)
    assert headers[0]["device_name"] == torch.cuda.get_device_name() and headers[0]["kernel_hash"] == kernel_source_hash()
    spec = match_spec(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)
    drawn = bmm_problems(4, spec or get_spec("h100-sxm"), 0)
    assert {r["unit"] for r in rows} == {problem_id(p) for p, _ in drawn}
    for p, _ in drawn:
        rs = [r for r in rows if r["unit"] == problem_id(p)]
        (aten,) = [r for r in rs if r["kind"] == "aten"]
        assert aten["status"] == "ok" and aten["rel_err"] <= TOLERANCE[(p.dtype, p.allow_tf32)]
        triton = [r for r in rs if r["kind"] == "triton"]
        assert len([r for r in triton if r["source"] != "exhaustive"]) == len(default_configs(p))
        ok = [r for r in triton if r["status"] == "ok"]
        assert len(ok) >= len(triton) // 2, [r["status"] for r in triton]
        assert all(r["status"] == "ok" or r["status"].startswith(("fail:launch", "fail:compile", "fail:wrong"))
                   for r in triton)
        assert all(0 < r["ms"] and 0 < r["frac_peak"] <= 1 and r["rel_err"] <= TOLERANCE[(p.dtype, p.allow_tf32)]
                   for r in ok)
    assert gen("--n", "4")["problems"] == 0  # resumed: nothing left
    info = subprocess.run([sys.executable, "-m", "perfmodel.cli", "data", "info", "--json", str(tmp_path / "data")],
                          cwd=repo_root, capture_output=True, text=True, check=True)
    assert json.loads(info.stdout)["bmm_rows"] == sum(r["kind"] == "triton" and r["status"] == "ok" for r in rows)
