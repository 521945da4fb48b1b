"""The shipped dataset (data/h100): size, coverage and physical validity, and `perfmodel data info`."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import numpy as np
import pytest

from perfmodel.data_gen.info import dataset_info
from perfmodel.data_gen.shards import IDENTITY_FIELDS, read_dataset
from perfmodel import GemmConfig, GemmProblem, PadProblem
from perfmodel.configs import fits
from perfmodel.devices import get_spec


@pytest.fixture(scope="module")
def data_dir(repo_root):
    return repo_root / "data" / "h100"


@pytest.fixture(scope="module")
def info(data_dir):
    return dataset_info(data_dir)


@pytest.fixture(scope="module")
def gemm(data_dir):
    return read_dataset(data_dir, "gemm")


@pytest.fixture(scope="module")
def pad(data_dir):
    return read_dataset(data_dir, "pad")


@pytest.fixture(scope="module")
def retimed(data_dir):
    return read_dataset(data_dir, "cublas")


@pytest.mark.slow
def test_size(info):
    assert info["gemm_rows"] >= 100_000
    assert info["gemm_problems"] >= 800
    for dtype in ("float16", "bfloat16", "float32"):
        assert info["gemm_problems_by_dtype"].get(dtype, 0) >= 200, dtype
    assert info["gemm_problems_unaligned16"] >= 0.25 * info["gemm_problems"]
    assert info["pad_rows"] >= 3000
    assert set(info["pad_rows_by_dtype"]) == {"float16", "bfloat16", "float32"}
    assert info["gemm_problems_tf32"] > 0


@pytest.mark.slow
def test_cublas_only_rows(info, data_dir):
    # torch.mm alone on problems of every alignment class and layout (perfmodel gen cublas-only)
    from perfmodel.data_gen.cublas_sweep import ONLY_KIND

    assert info["cublas_only_rows"] >= 14_000
    assert set(info["cublas_only_rows_by_layout"]) == {"NN", "NT", "TN", "TT"}
    assert info["cublas_only_dims_8_mod_16"] >= 0.3 * info["cublas_only_rows"]
    assert info["cublas_only_rows_above_1e12_flops"] >= 100
    rows, headers = read_dataset(data_dir, ONLY_KIND)
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(0 < r["frac_peak"] <= 1.0 and r["ms"] > 0 for r in ok)
    assert len({r["unit"] for r in rows}) == len(rows)  # one row a problem
    gemm_units = {r["unit"] for r in read_dataset(data_dir, "gemm")[0]}
    assert not gemm_units & {r["unit"] for r in rows}  # none is a GEMM problem
    assert {h["device_spec"] for h in headers} == {"h100-sxm"}


@pytest.mark.slow
def test_layouts(info, gemm):
    assert {"NN", "NT"} <= set(info["gemm_problems_by_layout"])
    rows, _ = gemm
    assert {r["transpose_right"] for r in rows} == {False, True}


@pytest.mark.slow
def test_every_problem_has_cublas(info, gemm, retimed):
    """Every problem has one valid cuBLAS time: its sweep row, or else its quiet re-time (a sweep row
    can be rejected above the physical peak, as one is in data/h100)."""
    rows, _ = gemm
    cublas_ms = defaultdict(list)
    for r in rows:
        if r["kind"] == "cublas" and r["status"] == "ok":
            cublas_ms[r["unit"]].append(r["ms"])
    units = {r["unit"] for r in rows}
    assert all(len(v) == 1 and v[0] > 0 for v in cublas_ms.values())
    retime_ok = {r["unit"] for r in retimed[0] if r.get("status", "ok") == "ok" and r.get("ms")}
    assert units - set(cublas_ms) <= retime_ok
    assert info["gemm_problems_with_cublas"] == info["gemm_problems"] == len(units)


@pytest.mark.slow
def test_physically_valid(info, gemm, pad):
    assert info["max_fraction_of_peak"] is not None and 0 < info["max_fraction_of_peak"] <= 1.0
    for rows in (gemm[0], pad[0]):
        ok = [r for r in rows if r["status"] == "ok"]
        assert ok
        bad = [r for r in ok if not 0 <= r["frac_peak"] <= 1.0]  # rounded to 5 decimals: 0.0 for tiny ones
        assert not bad, bad[:3]
    for r in gemm[0]:
        if r["status"] == "ok":
            assert r["ms"] > 0
    for r in pad[0]:
        if r["status"] == "ok":
            assert r["orig_ms"] > 0 and r["padded_ms"] > 0


@pytest.mark.slow
def test_rows_are_valid_schema(gemm, pad):
    """Every row rebuilds its GemmProblem/GemmConfig/PadProblem, and ok Triton configs fit the device."""
    spec = get_spec("h100-sxm")
    rows, headers = gemm
    for h in headers:
        assert h["device_spec"] == "h100-sxm" and h["sm_count"] == spec.sm_count
    problems = {}
    for r in rows:
        p = GemmProblem(m=r["m"], n=r["n"], k=r["k"], dtype=r["dtype"], allow_tf32=r["allow_tf32"],
                        transpose_left=r["transpose_left"], transpose_right=r["transpose_right"])
        assert problems.setdefault(r["unit"], p) == p, "a unit holds rows of two problems"
        if r["kind"] == "triton":
            cfg = GemmConfig(r["block_m"], r["block_n"], r["block_k"], r["group_m"], r["num_stages"], r["num_warps"])
            assert fits(cfg, p.dtype, spec)
    assert len(set(problems.values())) == len(problems), "a problem is measured in two units"
    for r in pad[0]:
        pp = PadProblem(m=r["m"], k=r["k"], n=r["n"], dtype=r["dtype"], transpose_left=r["transpose_left"],
                        transpose_right=r["transpose_right"], prepadded_left=r["prepadded_left"],
                        prepadded_right=r["prepadded_right"], allow_tf32=r["allow_tf32"])
        assert pp.padded_dims() == (r["padded_m"], r["padded_k"], r["padded_n"])


@pytest.mark.slow
def test_no_duplicate_rows(gemm):
    rows, _ = gemm
    keys = [(r["unit"], r["kind"], r.get("block_m"), r.get("block_n"), r.get("block_k"), r.get("group_m"),
             r.get("num_stages"), r.get("num_warps")) for r in rows]
    assert len(keys) == len(set(keys))


@pytest.mark.slow
def test_one_identity(gemm, pad, retimed):
    headers = gemm[1] + pad[1] + retimed[1]
    assert headers
    for field in IDENTITY_FIELDS:
        if field == "kind":
            continue
        assert len({json.dumps(h.get(field)) for h in headers}) == 1, field


@pytest.mark.slow
def test_cli_data_info_json(repo_root, info):
    proc = subprocess.run([sys.executable, "-m", "perfmodel.serve.cli", "data", "info", "--json"], cwd=repo_root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    for key in ("device", "gemm_rows", "gemm_problems", "gemm_problems_by_dtype", "pad_rows", "max_fraction_of_peak"):
        assert key in out, key
    assert "H100" in out["device"]
    assert out["gemm_rows"] == info["gemm_rows"]
    assert out["gemm_problems"] == info["gemm_problems"]
    assert out["gemm_problems_by_dtype"] == info["gemm_problems_by_dtype"]
    assert out["pad_rows"] == info["pad_rows"]
    assert out["max_fraction_of_peak"] == info["max_fraction_of_peak"]


def test_cli_data_info_missing_folder(repo_root, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "perfmodel.serve.cli", "data", "info", str(tmp_path / "nope"), "--json"],
                          cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "nope" in proc.stderr


@pytest.mark.slow
def test_v4_parts_match_current_kernel(repo_root, info):
    # A resumed sweep refuses parts of another kernel version: every part of data/h100 (dataset v4)
    # must be of this kernel, and say which.
    from perfmodel.data_gen.kernel import STATIC_KIND, kernel_mode, kernel_source_hash, static_kernel_mode

    headers = [h for kind in ("gemm", "pad", "cublas") for h in read_dataset(repo_root / "data" / "h100", kind)[1]]
    assert len(headers) >= 3
    assert {h["kernel_hash"] for h in headers} == {kernel_source_hash()}
    assert {h["kernel_mode"] for h in headers} == {kernel_mode()}
    # ... and the gemm_static parts: the same source (hash), compiled for each problem's shape
    static = read_dataset(repo_root / "data" / "h100", STATIC_KIND)[1]
    assert static and {h["kernel_hash"] for h in static} == {kernel_source_hash()}
    assert {h["kernel_mode"] for h in static} == {static_kernel_mode()}
    assert info["kernel_modes"] == sorted([kernel_mode(), static_kernel_mode()])


@pytest.mark.slow
def test_static_rows_pair_with_dataset_rows(repo_root, info):
    # Every gemm_static row is a problem and config of the dataset's own rows (its log ratio is what the
    # static head learns); the test split's problems are timed statically on every dataset config.
    from perfmodel.train.data import load_gemm, split_problems
    from perfmodel.train.static_head import load_static, paired

    table, static = load_gemm(repo_root / "data" / "h100"), load_static(repo_root / "data" / "h100")
    rows, prob = paired(table, static)
    assert (rows >= 0).all() and (prob >= 0).all()
    assert info["gemm_static_rows"] == len(static.ms) and info["gemm_static_problems"] == len(static.problems)
    split = split_problems(table.modes, 0)
    test = np.flatnonzero(split == 2)
    per_problem = np.bincount(table.problem_idx, minlength=len(table.problems))
    static_per = np.bincount(prob, minlength=len(table.problems))
    assert (static_per[test] == per_problem[test]).all()
    assert ((static_per > 0) & (split == 0)).sum() >= 400


@pytest.mark.slow
def test_v4_sizes(info):
    # Dataset v4's coverage: the GEMM sizes training and prefill run, pad rows to 1e11+ FLOP.
    assert info["gemm_rows"] >= 150_000 and info["gemm_problems"] >= 1_300
    assert info["gemm_problems_above_1e12_flops"] >= 100
    assert info["pad_rows"] >= 3_000 and info["pad_rows_above_1e11_flops"] >= 300
    assert info["max_fraction_of_peak"] <= 1.0


@pytest.mark.slow
def test_every_problem_retimed_in_a_quiet_process(gemm, retimed, info):
    # The shipped cuBLAS times are `perfmodel gen cublas` rows: one per GEMM problem, same problem fields.
    units = {r["unit"]: r for r in gemm[0]}
    rows = retimed[0]
    assert sorted(r["unit"] for r in rows) == sorted(units)
    for r in rows:
        g = units[r["unit"]]
        assert r["kind"] == "cublas" and r["status"] == "ok" and r["ms"] > 0, r
        assert all(r[f] == g[f] for f in ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right"))
    assert info["cublas_retimed_problems"] == info["gemm_problems"]


@pytest.mark.slow
def test_sweep_regenerates_the_v4_problems_and_configs(repo_root):
    # The v4 sweep (data/h100, resumed across device sessions) must keep drawing the same seeded
    # problems and per-group config samples: every problem in its parts is on the current problem list
    # and timed exactly its group's sample (a large problem: large_subset of it).
    from perfmodel.data_gen.gemm_sweep import config_sample, is_aligned, large_subset
    from perfmodel.data_gen.problems import estimated_ms, gemm_problems, problem_id, spec_key

    spec = get_spec("h100-sxm")
    rows, headers = read_dataset(repo_root / "data" / "h100", "gemm")
    sweep = headers[0]["sweep"]
    problems = {problem_id(p): p for p in gemm_problems(sweep["n_random"], spec, sweep["seed"])}
    shipped = defaultdict(set)
    for r in rows:
        if r["kind"] == "triton":
            shipped[r["unit"]].add(GemmConfig(*(r[f] for f in ("block_m", "block_n", "block_k", "group_m",
                                                                 "num_stages", "num_warps"))))
    assert len(shipped) >= 400 and set(shipped) <= set(problems)
    samples: dict[tuple, list[GemmConfig]] = {}  # config_sample is a function of its arguments: one per group
    for unit, cfgs in shipped.items():
        p = problems[unit]
        key = spec_key(p)
        n = sweep["configs_per_group"] if is_aligned(key) else 40
        args = (p.dtype, p.allow_tf32, (p.transpose_left, p.transpose_right), n)
        if args not in samples:
            samples[args] = config_sample(*args[:3], spec, n)
        sample = samples[args]
        if estimated_ms(p, spec) > sweep["large_ms"]:
            sample = large_subset(sample, sweep["configs_large"])
        assert cfgs == set(sample), p