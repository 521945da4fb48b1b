"""The Triton GEMM kernel (data_gen/kernel.py, kernel v4) against a float64 reference, on the CPU.

TRITON_INTERPRET=1 must be set before triton is imported, so the checks run in a subprocess that prints its
results as JSON: one for the default run (the allocating entry point on every shape, layout and mode, the other
kernels and the helpers), one more for the slow tests (every config of the grid: three times as many launches). bf16 is left out: the interpreter's bf16
tl.dot is wrong (docs/design.md); the GPU test covers it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# (M, N, K): odd sizes, a single row, K < BLOCK_K and K a multiple of 16 with ragged M/N.
SHAPES = [(37, 45, 53), (1, 17, 33), (70, 16, 129), (33, 7, 16)]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
# (block_m, block_n, block_k, group_m, num_stages, num_warps): small blocks keep the interpreter fast;
# group_m 2 / 4 exercise a last group smaller than GROUP_M.
CONFIGS = [(16, 16, 16, 8, 1, 2), (32, 16, 32, 4, 2, 4), (16, 32, 16, 2, 3, 8)]
MODES = [("float16", False), ("float32", False), ("float32", True)]
TOL = {("float16", False): 1e-2, ("float32", False): 1e-5, ("float32", True): 1e-2}

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import triton
    from perfmodel import GemmConfig
    from perfmodel.data_gen import kernel

    assert triton.runtime.interpreter is not None
    spec = json.loads(sys.argv[1])
    results = {}
    gen = torch.Generator().manual_seed(0)
    dtypes = {"float16": torch.float16, "float32": torch.float32}
    for m, n, k in spec["shapes"]:  # the grid (spec["configs"], [] for none) and the allocating entry point
        for tl_, tr in spec["layouts"]:
            for dtype, tf32 in spec["modes"]:
                dt = dtypes[dtype]
                a = torch.randn(k, m, generator=gen).to(dt).t() if tl_ else torch.randn(m, k, generator=gen).to(dt)
                b = torch.randn(n, k, generator=gen).to(dt).t() if tr else torch.randn(k, n, generator=gen).to(dt)
                assert a.shape == (m, k) and b.shape == (k, n)
                assert a.is_contiguous() != tl_ or m == 1 or k == 1
                ref = a.double() @ b.double()
                for c in spec["configs"]:
                    cfg = GemmConfig(*c)
                    key = f"{m}x{n}x{k}|{int(tl_)}{int(tr)}|{dtype}|{int(tf32)}|{'-'.join(map(str, c))}"
                    # Output: a strided view into a NaN-poisoned buffer with 3 extra columns, so that
                    # both an unwritten element and a store outside the mask show up.
                    buf = torch.full((m, n + 3), float("nan"), dtype=dt)
                    out = buf[:, :n]
                    kernel.launch(a, b, out, cfg, allow_tf32=tf32)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    results[key] = {"rel_err": err,
                                    "all_written": bool(torch.isfinite(out).all()),
                                    "outside_untouched": bool(torch.isnan(buf[:, n:]).all()),
                                    "out_dtype": str(out.dtype)}
                if spec["grid_only"]:
                    continue
                # kernel.matmul: the allocating entry point
                c0 = kernel.matmul(a, b, GemmConfig(*spec["matmul_config"]), allow_tf32=tf32)
                results[f"matmul|{m}x{n}x{k}|{int(tl_)}{int(tr)}|{dtype}|{int(tf32)}"] = {
                    "rel_err": ((c0.double() - ref).norm() / ref.norm()).item(),
                    "shape": list(c0.shape), "out_dtype": str(c0.dtype)}
    if spec["grid_only"]:
        print("RESULTS" + json.dumps(results))
        sys.exit(0)
    # The previous dataset kernel (benchmarks/studies/kernel_fidelity.py compares it), and sizes divisible by 8
    # but not 16, which the v4 kernel passes divided by their power-of-two divisor.
    for tl_, tr in spec["layouts"]:
        for name, (m, n, k) in (("v3", (37, 29, 45)), ("div8", (40, 24, 56)), ("div2", (38, 18, 50)),
                                ("static", (37, 29, 45)), ("static16", (48, 32, 64))):
            a = torch.randn(k, m, generator=gen).t() if tl_ else torch.randn(m, k, generator=gen)
            b = torch.randn(n, k, generator=gen).t() if tr else torch.randn(k, n, generator=gen)
            ref = a.double() @ b.double()
            out = torch.full((m, n), float("nan"))
            if name == "v3":
                kernel.launch_v3(a, b, out, GemmConfig(16, 16, 16, 8, 1, 2))
            else:  # static: every size and stride a constexpr (kernel._args), the shape's own compile
                kernel.launch(a, b, out, GemmConfig(16, 16, 16, 8, 1, 2), static=name.startswith("static"))
            results[f"{name}|{int(tl_)}{int(tr)}"] = ((out.double() - ref).norm() / ref.norm()).item()
    results["divisors"] = [kernel.divisor(v) for v in (1, 16, 4096, 1000, 1001, 50, 12, 24)]
    ints, meta = kernel._args(37, 29, 45, (45, 1, 29, 1, 29, 1), GemmConfig(16, 16, 16), torch.float32, False, static=True)
    results["static_args"] = [ints, [meta[n] for n in kernel._DIV_NAMES]]
    try:
        kernel.matmul(torch.randn(3, 4), torch.randn(5, 6), GemmConfig(16, 16, 16))
        results["shape_error"] = None
    except ValueError as exc:
        results["shape_error"] = str(exc)
    results["hash"] = kernel.kernel_source_hash()
    import hashlib, inspect
    results["hash_of_source"] = hashlib.sha256(inspect.getsource(kernel.matmul_kernel.fn).encode()).hexdigest()[:16]
    results["hash_of_v3"] = hashlib.sha256(inspect.getsource(kernel.matmul_kernel_v3.fn).encode()).hexdigest()[:16]
    results["precision"] = [kernel.input_precision(torch.float32, True), kernel.input_precision(torch.float32, False),
                            kernel.input_precision(torch.float16, True)]
    print("RESULTS" + json.dumps(results))
""")


def key(shape, layout, mode, cfg) -> str:
    (m, n, k), (tl_, tr), (dtype, tf32) = shape, layout, mode
    return f"{m}x{n}x{k}|{int(tl_)}{int(tr)}|{dtype}|{int(tf32)}|{'-'.join(map(str, cfg))}"


def _run_child(repo_root, configs, grid_only: bool) -> dict:
    spec = {"shapes": SHAPES, "layouts": LAYOUTS, "configs": configs, "modes": MODES, "matmul_config": CONFIGS[0],
            "grid_only": grid_only}
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo_root)}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, cwd=repo_root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULTS"))
    return json.loads(line[len("RESULTS"):])


@pytest.fixture(scope="module")
def results(repo_root):
    """Everything but the grid of configs."""
    return _run_child(repo_root, [], grid_only=False)


@pytest.fixture(scope="module")
def grid(repo_root):
    """The grid alone: every shape, layout, mode and config launched into a strided output."""
    return _run_child(repo_root, CONFIGS, grid_only=True)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "cfg" + "-".join(map(str, c)))
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m[0] + ("-tf32" if m[1] else ""))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: ("T" if l[0] else "N") + ("T" if l[1] else "N"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_reference(grid, shape, layout, mode, cfg):
    r = grid[key(shape, layout, mode, cfg)]
    assert r["all_written"], "some output element was never stored"
    assert r["outside_untouched"], "the store wrote outside the (M, N) mask"
    assert r["out_dtype"] == f"torch.{mode[0]}"
    assert r["rel_err"] < TOL[mode], r


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m[0] + ("-tf32" if m[1] else ""))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: ("T" if l[0] else "N") + ("T" if l[1] else "N"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_allocates_output(results, shape, layout, mode):
    (m, n, k), (tl_, tr), (dtype, tf32) = shape, layout, mode
    r = results[f"matmul|{m}x{n}x{k}|{int(tl_)}{int(tr)}|{dtype}|{int(tf32)}"]
    assert r["shape"] == [m, n]
    assert r["out_dtype"] == f"torch.{dtype}"
    assert r["rel_err"] < TOL[mode]


@pytest.mark.parametrize("variant", ["v3", "div8", "div2", "static", "static16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: ("T" if l[0] else "N") + ("T" if l[1] else "N"))
def test_v3_kernel_and_divided_sizes(results, variant, layout):
    err = results[f"{variant}|{int(layout[0])}{int(layout[1])}"]
    assert err < 1e-5, err  # fp32 without tf32


def test_static_args_make_every_size_a_constant(results):
    """static: each size and stride passed as 1 (Triton specialises 1 as a constant) times a DIV_ equal to it."""
    ints, divs = results["static_args"]
    assert ints == [1] * 9 and divs == [37, 29, 45, 45, 1, 29, 1, 29, 1]


def test_divisors(results):
    # 1 and multiples of 16: Triton's own specialisation; else the largest power of two dividing the size
    assert results["divisors"] == [1, 1, 1, 8, 1, 2, 4, 8]


def test_fp32_ieee_is_exact_to_fp32(results):
    # Without tf32 the fp32 path must be far more accurate than the fp16 one, on every case (the entry point's
    # here; the grid's in test_kernel_matches_reference, whose fp32 tolerance is this one).
    errs = [v["rel_err"] for k, v in results.items() if k.startswith("matmul|") and k.endswith("|float32|0")]
    assert len(errs) == len(SHAPES) * len(LAYOUTS) and max(errs) < 1e-5


def test_matmul_rejects_mismatched_shapes(results):
    assert results["shape_error"] is not None and "do not multiply" in results["shape_error"]


def test_kernel_hash_and_precision(results):
    # The shard identity is the hash of the v4 kernel's source: not of another kernel's
    assert results["hash"] == results["hash_of_source"] != results["hash_of_v3"]
    assert results["precision"] == ["tf32", "ieee", "ieee"]
