"""GPU tests (skipped where no CUDA device is visible): the kernel on the device, and tiny sweeps end to end."""
from __future__ import annotations

import pytest

from perfmodel import GemmConfig, PadProblem
from perfmodel.configs import fits
from perfmodel.devices import get_spec, match_spec

pytestmark = pytest.mark.gpu

# (M, N, K): odd sizes (M, N not multiples of any block: the wrapped offsets and the masked store),
# a single row, K smaller than BLOCK_K, and K / strides not divisible by 16.
SHAPES = [(37, 45, 53), (1, 17, 33), (70, 16, 129), (257, 129, 300), (300, 1000, 64)]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]
CONFIGS = [GemmConfig(16, 16, 16, 8, 1, 2), GemmConfig(32, 16, 32, 4, 2, 4), GemmConfig(64, 64, 32, 8, 3, 4),
           GemmConfig(128, 128, 64, 8, 3, 8), GemmConfig(128, 64, 32, 1, 4, 4), GemmConfig(64, 256, 32, 8, 3, 8)]
# (dtype, allow_tf32) -> relative Frobenius error allowed against the float64 product
MODES = {("float16", False): 1e-2, ("bfloat16", False): 3e-2, ("float32", False): 1e-5, ("float32", True): 1e-2}


def _ids(x):
    if isinstance(x, GemmConfig):
        return "cfg" + "-".join(map(str, x.as_dict().values()))
    return None


@pytest.fixture(scope="module")
def spec():
    import torch

    spec = match_spec(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)
    return spec or get_spec("h100-sxm")


@pytest.mark.parametrize("mode", list(MODES), ids=lambda m: m[0] + ("-tf32" if m[1] else ""))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: ("T" if l[0] else "N") + ("T" if l[1] else "N"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernel_matches_reference(spec, shape, layout, mode):
    import torch

    from perfmodel.data_gen import kernel

    (m, n, k), (tl_, tr), (dtype, tf32) = shape, layout, mode
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(m * 7 + n * 3 + k)
    a = (torch.randn(k, m, device=dev, generator=gen).to(dt).t() if tl_
         else torch.randn(m, k, device=dev, generator=gen).to(dt))
    b = (torch.randn(n, k, device=dev, generator=gen).to(dt).t() if tr
         else torch.randn(k, n, device=dev, generator=gen).to(dt))
    ref = a.double() @ b.double()
    # Two configs per case, rotating so that every config meets every shape, layout and mode somewhere
    # (each config is a separate compile: all of them on every case would take minutes).
    i = SHAPES.index(shape) * 16 + LAYOUTS.index(layout) * 4 + list(MODES).index(mode)
    cfgs = [c for c in (CONFIGS[i % len(CONFIGS)], CONFIGS[(i + 3) % len(CONFIGS)]) if fits(c, dtype, spec)]
    checked = 0
    for cfg in cfgs:
        # A NaN-poisoned buffer with 3 extra columns: every output element written, nothing outside.
        buf = torch.full((m, n + 3), float("nan"), device=dev, dtype=dt)
        out = buf[:, :n]
        kernel.launch(a, b, out, cfg, allow_tf32=tf32)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"{cfg}: unwritten output"
        assert torch.isnan(buf[:, n:]).all(), f"{cfg}: store outside the mask"
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < MODES[mode], (cfg, err)
        checked += 1
    assert checked >= 1
    c = kernel.matmul(a, b, CONFIGS[0], allow_tf32=tf32)
    assert c.shape == (m, n) and c.dtype == dt and c.device.type == "cuda"
    assert ((c.double() - ref).norm() / ref.norm()).item() < MODES[mode]


def test_tf32_changes_fp32_precision():
    # With tf32 the fp32 product loses precision (10-bit mantissa inputs); without it, it does not.
    import torch

    from perfmodel.data_gen import kernel

    a = torch.randn(256, 512, device="cuda")
    b = torch.randn(512, 256, device="cuda")
    ref = a.double() @ b.double()
    cfg = GemmConfig(64, 64, 32, 8, 3, 4)
    err_ieee = ((kernel.matmul(a, b, cfg, allow_tf32=False).double() - ref).norm() / ref.norm()).item()
    err_tf32 = ((kernel.matmul(a, b, cfg, allow_tf32=True).double() - ref).norm() / ref.norm()).item()
    assert err_ieee < 1e-6
    assert 1e-5 < err_tf32 < 1e-2


def _check_gemm_rows(rows, settings, spec):
    from perfmodel.data_gen.gemm_sweep import is_aligned, spec_key
    from perfmodel.data_gen.measure import TOLERANCE
    from perfmodel import GemmProblem

    units: dict[str, list[dict]] = {}
    for r in rows:
        units.setdefault(r["unit"], []).append(r)
    for unit, urows in units.items():
        r0 = urows[0]
        p = GemmProblem(m=r0["m"], n=r0["n"], k=r0["k"], dtype=r0["dtype"], allow_tf32=r0["allow_tf32"],
                        transpose_left=r0["transpose_left"], transpose_right=r0["transpose_right"])
        assert [r["kind"] for r in urows].count("cublas") == 1
        triton = [r for r in urows if r["kind"] == "triton"]
        expected = settings.configs_per_group if is_aligned(spec_key(p)) else settings.configs_unaligned
        assert len(triton) == expected
        for r in triton:
            assert fits(GemmConfig(r["block_m"], r["block_n"], r["block_k"], r["group_m"], r["num_stages"],
                                   r["num_warps"]), p.dtype, spec)
        best = min(r["ms"] for r in triton)
        t = settings.timing
        for r in urows:
            assert r["status"] == "ok", r
            assert r["ms"] > 0 and r["reps"] >= 1
            if r["reps"] < t.min_reps:
                # Kept at its first run (TimingSettings.slow_factor): a Triton config far slower than the
                # problem's fastest. First runs decided, not these medians: a margin.
                assert r["kind"] == "triton" and t.slow_factor, r
                assert r["ms"] > 0.8 * max(t.slow_min_ms, t.slow_factor * best), (r, best)
            assert 0 <= r["frac_peak"] <= 1.0
            assert r["rel_err"] <= TOLERANCE[(p.dtype, p.allow_tf32)]
    return units


def test_gemm_sweep_end_to_end(tmp_path, spec):
    import torch

    from perfmodel.data_gen.gemm_sweep import GemmSweepSettings, run
    from perfmodel.data_gen.kernel import kernel_source_hash
    from perfmodel.data_gen.shards import read_dataset

    settings = GemmSweepSettings(n_random=2, configs_per_group=4, configs_unaligned=2, max_problems=3,
                                 compile_workers=2)
    stats = run(tmp_path, settings=settings, progress=False)
    assert stats["problems"] == 3
    assert stats["failed_rows"] == 0 and stats["rejected_rows"] == 0
    rows, headers = read_dataset(tmp_path, "gemm")
    assert len(headers) == 1
    h = headers[0]
    assert h["device_name"] == torch.cuda.get_device_name()
    assert h["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    assert h["kernel_hash"] == kernel_source_hash()
    assert h["device_spec"] == spec.name
    units = _check_gemm_rows(rows, settings, spec)
    assert len(units) == 3
    assert stats["rows"] == len(rows)

    # Resume: the finished problems are skipped, one new one is measured.
    settings.max_problems = 1
    stats2 = run(tmp_path, settings=settings, progress=False)
    assert stats2["resumed_existing_rows"] == len(rows)
    assert stats2["problems"] == 1
    rows2, headers2 = read_dataset(tmp_path, "gemm")  # raises on a unit complete twice
    assert len(headers2) == 2
    units2 = _check_gemm_rows(rows2, settings, spec)
    assert set(units) < set(units2) and len(units2) == 4

    # The quiet cuBLAS re-time: one ok row per GEMM problem, resumable, preferred by the loaders.
    from perfmodel.data_gen import cublas_sweep
    from perfmodel.data_gen.shards import cublas_times

    cstats = cublas_sweep.run(tmp_path, tmp_path, progress=False)
    assert cstats["rows"] == cstats["ok_rows"] == 4
    crows, _ = read_dataset(tmp_path, "cublas")
    assert sorted(r["unit"] for r in crows) == sorted(units2)
    assert all(r["ms"] > 0 and r["reps"] >= 3 and 0 < r["frac_peak"] <= 1 for r in crows)
    assert cublas_times(rows2, crows) == {r["unit"]: r["ms"] for r in crows}
    assert cublas_sweep.run(tmp_path, tmp_path, progress=False)["rows"] == 0

    # torch.mm alone on problems of its own: none of the folder's GEMM problems, resumable, time-limited.
    from perfmodel.data_gen.problems import cublas_only_problems, problem_id

    ostats = cublas_sweep.run_only(tmp_path, 6, seed=5, progress=False, exclude_from=tmp_path)
    assert ostats["problems"] == 6 and ostats["rows"] == 6 and not ostats["stopped_at_limit"]
    orows, oheaders = read_dataset(tmp_path, cublas_sweep.ONLY_KIND)
    assert {r["unit"] for r in orows} == {problem_id(p) for p in cublas_only_problems(6, spec, 5, exclude=frozenset(units2))}
    assert not {r["unit"] for r in orows} & set(units2)
    assert all(r["ms"] > 0 and 0 < r["frac_peak"] <= 1 for r in orows if r["status"] == "ok")
    assert oheaders[0]["sweep"]["excluded"] == 4
    more = cublas_sweep.run_only(tmp_path, 9, seed=5, progress=False, exclude_from=tmp_path, time_limit_s=0.0)
    assert more["rows"] == 0 and more["stopped_at_limit"]  # the limit stops it before the first new problem
    assert cublas_sweep.run_only(tmp_path, 9, seed=5, progress=False, exclude_from=tmp_path)["rows"] == 3


def test_pad_sweep_end_to_end(tmp_path, spec):
    from perfmodel.data_gen.measure import TOLERANCE
    from perfmodel.data_gen.pad_sweep import UNIT_SIZE, run
    from perfmodel.data_gen.shards import read_dataset

    stats = run(tmp_path, n=30, max_problems=25, progress=False)
    assert stats["rows"] == UNIT_SIZE == 25
    assert stats["ok_rows"] == 25
    rows, headers = read_dataset(tmp_path, "pad")
    assert len(rows) == 25 and len(headers) == 1
    assert len({r["unit"] for r in rows}) == 1
    for r in rows:
        pp = PadProblem(m=r["m"], k=r["k"], n=r["n"], dtype=r["dtype"], transpose_left=r["transpose_left"],
                        transpose_right=r["transpose_right"], prepadded_left=r["prepadded_left"],
                        prepadded_right=r["prepadded_right"], allow_tf32=r["allow_tf32"])
        assert (r["padded_m"], r["padded_k"], r["padded_n"]) == pp.padded_dims()
        assert r["status"] == "ok", r
        assert r["orig_ms"] > 0 and r["padded_ms"] > 0
        assert 0 <= r["frac_peak"] <= 1.0
        assert r["rel_err"] <= TOLERANCE[(pp.dtype, pp.allow_tf32)]
