"""The cuBLAS head fitted on every torch.mm time of the dataset (train/cublas_head.py) and the cuBLAS-only
problem list it learns from (data_gen/problems.cublas_only_problems).

The shipped cuBLAS output (now the problem network's, artifact.problem_output) is judged on the committed rows
(data/h100: GEMM problems, cublas_only problems, pad rows' unpadded times). The head-by-head refit of a separate
cuBLAS head (`perfmodel cublas-head`) is gone with that head (an older layout, perfmodel/heads/legacy.py): the
problem network's refit is tests/test_problem_head.py's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from perfmodel import artifact
from perfmodel.devices import get_spec


def test_cublas_only_problems_cover_the_alignment_classes():
    from perfmodel.data_gen.problems import LARGE, cublas_only_problems, problem_id, within

    spec = get_spec("h100-sxm")
    a = cublas_only_problems(400, spec, seed=3)
    assert a == cublas_only_problems(400, spec, seed=3)  # deterministic: a resumed sweep draws the same list
    assert len(set(a)) == 400 and all(within(p, spec, LARGE) for p in a)
    dims = np.array([(p.m, p.n, p.k) for p in a])
    assert ((dims % 16) == 8).any(axis=0).all()          # a multiple of 8 but not of 16, in every dim
    assert ((dims % 8) == 4).any(axis=0).all() and ((dims % 2) == 1).any(axis=0).all()
    assert {(p.transpose_left, p.transpose_right) for p in a} == {(False, False), (False, True), (True, False), (True, True)}
    assert {p.dtype for p in a} == {"float16", "bfloat16", "float32"} and any(p.allow_tf32 for p in a)
    assert (dims[:, 0] < 256).any() and max(p.flops for p in a) > 1e12
    skip = frozenset(problem_id(p) for p in a[:50])
    b = cublas_only_problems(400, spec, seed=3, exclude=skip)
    assert not skip & {problem_id(p) for p in b}


@pytest.fixture(scope="module")
def rows(repo_root, shipped):
    from perfmodel.train.cublas_head import all_rows

    return all_rows(repo_root / "data" / "h100", int(shipped.metadata["settings"]["seed"]))


def test_rows_keep_the_models_split(repo_root, shipped, rows):
    from perfmodel.train.data import load_gemm, split_problems

    table = load_gemm(repo_root / "data" / "h100")
    split = split_problems(table.modes, int(shipped.metadata["settings"]["seed"]))
    g = rows.kind == "gemm"
    assert g.sum() == np.isfinite(table.cublas_ms).sum()
    assert (rows.split[g] == split[np.isfinite(table.cublas_ms)]).all()
    # no row of another kind is a held-out GEMM problem
    held = {tuple(r) for r in table.problems[split > 0].tolist()}
    assert not held & {tuple(r) for r in rows.problems[~g].tolist()}
    for kind in ("cublas_only", "pad_orig"):
        k = rows.kind == kind
        assert k.sum() > 1000 and set(rows.split[k].tolist()) == {0, 1, 2}
    assert np.isfinite(rows.log_ms).all()


def test_metrics_reproduce_from_the_data(shipped, rows):
    # the metadata's fit figures, recomputed from the shipped head and the committed rows, to the tolerance
    # of float32 outputs on another CPU (tests/_tolerance.py): row counts exactly, mean |log error|
    # relatively, the share within 10 % with one row allowed to cross the 10 % line
    from perfmodel.train.cublas_head import fit_metrics
    from perfmodel.train.evaluate import head_outputs
    from tests._tolerance import mean_of_outputs, share

    with torch.inference_mode():
        pred = head_outputs(artifact.problem_output(shipped, "cublas"),
                            shipped.encoders.get("cublas", shipped.encoders.get(artifact.PROBLEM))
                            .encode(torch.from_numpy(rows.problems)))[1]
    m = shipped.metadata["cublas_head_metrics"]
    got = fit_metrics(pred, rows)
    assert {k for k in m if not k.startswith("before/")} - {"rows", "seconds"} == set(got)
    for k, v in got.items():
        if k.endswith("/rows"):
            assert m[k] == v, k
        elif k.endswith("/mean_abs_log_err"):
            assert m[k] == mean_of_outputs(v), k
        else:
            assert m[k] == share(v, got[k.rsplit("/", 1)[0] + "/rows"]), k
    # the problem network's cuBLAS output, recomputed here, holds the separate cuBLAS head's held-out error
    # that it replaced (the metadata's "before/"; test_cublas_head's history: that head's refit on the
    # cuBLAS-only and pad rows cut their error from 0.651 and 0.419 to 0.141 and 0.146)
    for kind in ("gemm", "cublas_only", "pad_orig"):
        assert got[f"{kind}/test/mean_abs_log_err"] < 1.02 * m[f"before/{kind}/test/mean_abs_log_err"], kind
        assert got[f"{kind}/test/mean_abs_log_err"] < 0.2, kind


def test_settings_errors_name_the_field():
    # the cuBLAS fit's settings (train/cublas_head.check_settings, which the problem network's fit runs too)
    from perfmodel.train.cublas_head import CublasHeadSettings, check_settings

    with pytest.raises(ValueError, match="members: must be >= 1"):
        check_settings(CublasHeadSettings(members=0))
    with pytest.raises(ValueError, match="epochs: must be >= 1"):
        check_settings(CublasHeadSettings(epochs=0))
    with pytest.raises(ValueError, match="hidden"):
        check_settings(CublasHeadSettings(hidden=(0,)))
    check_settings(CublasHeadSettings())
