"""The cuBLAS head fitted on every torch.mm time of the dataset (train/cublas_head.py) and the cuBLAS-only
problem list it learns from (data_gen/problems.cublas_only_problems).

The shipped cuBLAS output (now the problem network's, artifact.problem_output) is judged on the committed rows
(data/h100: GEMM problems, cublas_only problems, pad rows' unpadded times); the head-by-head refit runs, for
two epochs, on a copy of the shipped folder in the layout from before the problem network (tests/_layout.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from perfmodel import artifact
from perfmodel.devices import get_spec
from tests._layout import old_layout_copy


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


def test_refit_rewrites_only_the_cublas_head(tmp_path, repo_root):
    from perfmodel import artifact
    from perfmodel.train.cublas_head import CublasHeadSettings
    from perfmodel.train.refit import refit_cublas as run

    model = old_layout_copy(repo_root / "models" / "h100", tmp_path / "m")  # cublas-head refuses a problem network
    old = artifact.load(model)
    metrics = run(CublasHeadSettings(model=model, data=repo_root / "data" / "h100", epochs=2, members=1,
                                     hidden=(16,), threads=1), log=lambda *a: None)
    new = artifact.load(model)
    assert metrics["rows"]["cublas_only"] > 1000 and "cublas_only/test/mean_abs_log_err" in metrics
    meta = json.loads((model / "metadata.json").read_text())
    assert meta["cublas_head_settings"]["hidden"] == [16] and meta["cublas_head_settings"]["epochs"] == 2
    from perfmodel.features import problems_tensor
    from perfmodel.schema import GemmProblem

    x = new.encoders["cublas"].encode(problems_tensor([GemmProblem(m=m, n=1000 + m, k=4096, dtype="bfloat16")
                                                       for m in (1, 300, 4096)]))
    assert not torch.equal(old.heads["cublas"].eval()(x), new.heads["cublas"].eval()(x))
    for name in set(old.heads) - {"cublas"}:  # every other head as it was
        a, b = old.heads[name].state_dict(), new.heads[name].state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_refit_errors_name_the_field(tmp_path, repo_root):
    from perfmodel.train.cublas_head import CublasHeadSettings
    from perfmodel.train.refit import refit_cublas as run

    with pytest.raises(ValueError, match="members: must be >= 1"):
        run(CublasHeadSettings(model=tmp_path / "none", members=0))
    with pytest.raises(ValueError, match="hidden"):
        run(CublasHeadSettings(model=tmp_path / "none", hidden=(0,)))
    with pytest.raises(FileNotFoundError):
        run(CublasHeadSettings(model=tmp_path / "none", data=repo_root / "data" / "h100"))


@pytest.mark.slow
def test_refit_of_a_model_of_two_devices(tmp_path, repo_root, monkeypatch):
    # models/h200 serves the H100 and the H200: each device's folder gives its rows, encoded with its spec
    from perfmodel import artifact
    from perfmodel.train.cublas_head import CublasHeadSettings
    from perfmodel.train.refit import refit_cublas as run

    model = old_layout_copy(repo_root / "models" / "h200", tmp_path / "m")
    old = artifact.load(model)
    data = (repo_root / "data" / "h100", repo_root / "data" / "h200")
    with pytest.raises(ValueError, match="^data: .*one per device"):  # folders out of the model's device order
        run(CublasHeadSettings(model=model, data=data[::-1], epochs=1, members=1, hidden=(8,)), log=lambda *a: None)
    with pytest.raises(ValueError, match="^data: .*one per device"):  # one device's folder only
        run(CublasHeadSettings(model=model, data=data[1], epochs=1, members=1, hidden=(8,)), log=lambda *a: None)
    monkeypatch.chdir(repo_root)  # no --data: the folders the model's metadata names (relative to the repo)
    metrics = run(CublasHeadSettings(model=model, epochs=2, members=1, hidden=(16,), threads=1), log=lambda *a: None)
    by = metrics["by_device"]
    assert set(by) == {"h100-sxm", "h200"} and metrics["rows"] == by["h100-sxm"]["rows"]
    for dev in by:
        assert by[dev]["rows"]["cublas_only"] > 1000 and by[dev]["rows"]["gemm"] > 1000
    meta = json.loads((model / "metadata.json").read_text())
    assert meta["cublas_head_settings"]["data"] == ["data/h100", "data/h200"]
    new = artifact.load(model)
    assert new.devices == old.devices
    for name in set(old.heads) - {"cublas"}:
        a, b = old.heads[name].state_dict(), new.heads[name].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), name
    # the per-device held-out call figures were recomputed with the new head
    for dev in by:
        assert meta["metrics_by_device"][dev]["cublas"]["cublas/mape"] != \
            old.metadata["metrics_by_device"][dev]["cublas"]["cublas/mape"]
