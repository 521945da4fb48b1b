"""The bmm heads' fitter (train/bmm_head.py) and their refit step (train/refit.py bmm_step, refit_bmm) on
SYNTHETIC bmm shards (tests/_synthetic.py: a roofline-ish formula with noise) and a random-weight model
folder. Nothing here measures the shipped model."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from perfmodel import artifact
from perfmodel.devices import get_spec
from perfmodel.train import bmm_head
from perfmodel.train.bmm_head import (BmmHeadSettings, BmmTable, cross_validate, encode, fit_bmm_heads, fit_ranked,
                                      floor_column, implied_aten_log_ms, load_bmm, predict_log_ms, score, shape_folds,
                                      split_by_shape)
from perfmodel.train.refit import bmm_step, refit_bmm
from tests._synthetic import (make_synthetic_bundle, synthetic_header, write_synthetic_bmm, write_synthetic_dataset,
                              write_synthetic_model)

SPEC = get_spec("h100-sxm")
SMALL = dict(hidden=(32, 32), members=1, epochs=40, aten_hidden=(16,), aten_members=1, aten_epochs=400,
             call_hidden=(8,), call_members=1, call_epochs=50)
# For the tests of what the step and the refit write and record, not of what the heads learn: a few epochs
# (SMALL's made these tests most of the default run's time)
TINY = {**SMALL, "epochs": 2, "aten_epochs": 5, "call_epochs": 5}


def quiet(*_a) -> None:
    pass


@pytest.fixture(scope="module")
def bmm_data(tmp_path_factory: pytest.TempPathFactory):
    return write_synthetic_bmm(tmp_path_factory.mktemp("bmm") / "h100", n_problems=64)


def test_the_table_keeps_ok_triton_and_aten_rows(bmm_data):
    t = load_bmm(bmm_data)
    assert len(t.problems) == 64 and t.problems.shape[1] == 9
    assert len(t.ms) == 64 * 8  # the failed config and the aten_pad rows are left out
    assert np.isfinite(t.aten_ms).all() and (t.problems[:, 8] >= 8).all()
    assert t.inductor.sum() == 64 * 4  # the "default" source rows: Inductor's list
    # every fourth problem re-batches the one before it: 16 of them share a shape
    assert len(set(t.shape.tolist())) == 64 - 16


def test_the_split_is_by_shape_and_seeded(bmm_data):
    t = load_bmm(bmm_data)
    split = split_by_shape(t, 0)
    for s in set(t.shape.tolist()):
        assert len(set(split[t.shape == s].tolist())) == 1  # problems that differ in batch only: one set
    assert set(split.tolist()) == {0, 1, 2}
    assert np.array_equal(split, split_by_shape(t, 0)) and not np.array_equal(split, split_by_shape(t, 1))


def test_the_fitter_learns_floors_and_writes_nothing(bmm_data, tmp_path):
    t = load_bmm(bmm_data)
    split = split_by_shape(t, 0)
    before = sorted(bmm_data.rglob("*"))
    heads, m = fit_bmm_heads(t, split, SPEC, 3, BmmHeadSettings(**SMALL, aten_head=True), log=quiet)
    assert set(heads) == {artifact.BMM, artifact.BMM_ATEN, artifact.BMM_CALL} and sorted(bmm_data.rglob("*")) == before
    # the synthetic times span orders of magnitude: the heads fit far better than a constant
    y = np.log(t.ms)
    assert m["train/triton/mean_abs_log_err"] < 0.5 * np.abs(y - np.median(y)).mean()
    assert m["train/aten/mean_abs_log_err"] < 0.5 * np.abs(np.log(t.aten_ms) - np.median(np.log(t.aten_ms))).mean()
    for key in ("test/all/top1_eff", "test/all/top5_eff", "val/all/top1_eff", "test/call/accuracy",
                "test/call/accuracy_times", "test/call/accuracy_always_triton"):
        assert 0.0 < m[key] <= 1.0, key
    assert m["test/problems"] + m["val/problems"] + m["train/problems"] == len(t.problems)
    # the physical floor: the whole batch's roofline (one matrix's times the batch)
    x, xa = encode(t, SPEC, 3)
    f = floor_column("bmm", SPEC, 3)
    assert (predict_log_ms(heads[artifact.BMM], x) >= x[:, f].double().numpy() - 1e-6).all()
    assert heads[artifact.BMM].cfg.floor_features == (f,)
    one = x[:, 18].double() + torch.log(torch.from_numpy(t.problems[t.problem_idx, 8]))
    assert torch.allclose(x[:, f].double(), one, rtol=1e-5)


def test_without_the_aten_head_the_call_implies_aten(bmm_data):
    """The default (aten_head False): two heads; the aten figures are of the time the call implies (the best
    predicted config's log ms + the call's output), so the call by the times is the call head's own."""
    t = load_bmm(bmm_data)
    split = split_by_shape(t, 0)
    heads, m = fit_bmm_heads(t, split, SPEC, 3, BmmHeadSettings(**TINY), log=quiet)
    assert set(heads) == {artifact.BMM, artifact.BMM_CALL} and m["aten_head"] is False
    x, xa = encode(t, SPEC, 3)
    pred, call = predict_log_ms(heads[artifact.BMM], x), score(heads[artifact.BMM_CALL], xa)
    implied = implied_aten_log_ms(t, pred, call)
    best = np.array([pred[t.problem_idx == i].min() for i in range(len(t.problems))])
    assert np.array_equal(implied, best + call)
    test = (split == 2) & np.isfinite(t.aten_ms)
    assert m["test/aten/mean_abs_log_err"] == pytest.approx(float(np.abs(implied - np.log(t.aten_ms))[test].mean()))
    assert m["test/call/accuracy_times"] == m["test/call/accuracy"]


def _as_batch_one(t: BmmTable) -> BmmTable:
    """t's rows as batch-1 rows (what static_table makes of a folder's gemm_static rows)."""
    p = t.problems.copy()
    p[:, 8] = 1
    return BmmTable(p, t.modes, t.families, t.shape, np.full(len(p), np.nan), t.problem_idx, t.configs, t.ms / 8,
                    t.inductor)


def test_batch_one_rows_join_the_triton_heads_training_set_only(bmm_data):
    t = load_bmm(bmm_data)
    split = split_by_shape(t, 0)
    extra = _as_batch_one(t)
    _, with_rows = fit_bmm_heads(t, split, SPEC, 3, BmmHeadSettings(**TINY, aten_head=True), quiet, extra)
    _, without = fit_bmm_heads(t, split, SPEC, 3, BmmHeadSettings(**TINY, aten_head=True, static_rows=False), quiet,
                               extra)
    assert with_rows["static_rows"] == len(t.ms) and without["static_rows"] == 0
    # the figures are on table's problems either way; the aten head never sees the extra rows
    assert with_rows["test/problems"] == without["test/problems"]
    assert with_rows["test/aten/mean_abs_log_err"] == without["test/aten/mean_abs_log_err"]
    assert with_rows["test/triton/mean_abs_log_err"] != without["test/triton/mean_abs_log_err"]


@pytest.mark.parametrize("share, static_per_epoch", [(1.0, 40), (0.25, 10)])
def test_static_share_draws_that_share_of_the_batch_one_problems_each_epoch(monkeypatch, share, static_per_epoch):
    # synthetic rows: 10 bmm problems (groups 0-9) and 40 batch-1 static ones (10-49), 3 rows each; column 0
    # carries the group, so the spy on the head's score sees which problems each batch holds
    group = np.repeat(np.arange(50), 3)
    x = torch.cat([torch.from_numpy(group).float()[:, None], torch.rand(len(group), 3)], 1)
    y = torch.rand(len(group)) - 3.0
    seen: list[set[int]] = []
    made = bmm_head.new_head

    def spied(*a, **k):
        head = made(*a, **k)
        score = head.score
        head.score = lambda xb: (seen.append(set(xb[:, 0].round().long().tolist())), score(xb))[1]
        return head

    monkeypatch.setattr(bmm_head, "new_head", spied)
    s = BmmHeadSettings(hidden=(8,), epochs=3, problems_per_batch=4, static_share=share)
    fit_ranked(x, y, group, s, 0, 1, static_from=10)
    steps = -(-(10 + static_per_epoch) // 4)
    assert len(seen) == 3 * steps
    epochs = [set().union(*seen[e * steps:(e + 1) * steps]) for e in range(3)]
    for got in epochs:                             # every bmm problem every epoch, the share of the others
        assert set(range(10)) <= got and len(got - set(range(10))) == static_per_epoch
    if share < 1.0:                                # drawn afresh each epoch (40 choose 10: a repeat is ~1e-9)
        assert epochs[0] != epochs[1] or epochs[1] != epochs[2]


def test_cross_validation_holds_every_problem_out_once(bmm_data):
    t = load_bmm(bmm_data)
    folds = shape_folds(t, 4, 0)
    assert set(folds.tolist()) == {0, 1, 2, 3}
    for s in set(t.shape.tolist()):
        assert len(set(folds[t.shape == s].tolist())) == 1
    said: list[str] = []
    m = cross_validate(t, SPEC, 3, BmmHeadSettings(**TINY, cv_folds=4), 0, None, said.append)
    assert m["cv/problems"] == len(t.problems) and m["cv/folds"] == 4 and m["cv/members"] == 1
    assert 0.0 < m["cv/all/top1_eff"] <= m["cv/all/top5_eff"] <= 1.0 and 0.0 <= m["cv/call/accuracy"] <= 1.0
    assert sum("fold" in line for line in said) == 4


@pytest.mark.parametrize("field, value", [("cv_folds", 1), ("cv_folds", -1), ("rank_weight", -1.0),
                                          ("problems_per_batch", 0), ("epochs", 0), ("members", 0), ("aten_epochs", -1), ("hidden", ()),
                                          ("aten_hidden", (0,)), ("batch_rows", 2.5), ("static_share", 0.0),
                                          ("static_share", 1.5)])
def test_bad_settings_are_refused_naming_the_field(bmm_data, field, value):
    t = load_bmm(bmm_data)
    with pytest.raises(ValueError, match=field):
        fit_bmm_heads(t, split_by_shape(t, 0), SPEC, 3, BmmHeadSettings(**{**SMALL, field: value}), log=quiet)


def test_the_step_is_skipped_where_the_data_has_no_bmm_rows(tmp_path):
    bundle = make_synthetic_bundle(hidden=(16,))
    said: list[str] = []
    data = write_synthetic_dataset(tmp_path / "h100", n_problems=8)
    assert bmm_step(bundle, data, BmmHeadSettings(**SMALL), said.append) is None
    assert artifact.BMM not in bundle.heads and "bmm_metrics" not in bundle.metadata
    assert len(said) == 1 and "skipped" in said[0] and "no bmm rows" in said[0]
    # the refit command writes nothing then
    model = write_synthetic_model(tmp_path / "m", hidden=(16,))
    stamp = (model / "metadata.json").read_text()
    assert refit_bmm(BmmHeadSettings(model=model, data=data, **SMALL), log=quiet) == {}
    assert (model / "metadata.json").read_text() == stamp


def test_shards_of_another_device_are_refused_naming_data(tmp_path):
    data = write_synthetic_bmm(tmp_path / "a100", n_problems=8, header=synthetic_header("a100-sxm"))
    with pytest.raises(ValueError, match="data"):
        bmm_step(make_synthetic_bundle(hidden=(16,)), data, BmmHeadSettings(**SMALL), quiet)


def test_refit_adds_the_heads_and_records_the_step(bmm_data, tmp_path):
    model = write_synthetic_model(tmp_path / "m", hidden=(16, 16))
    refit_bmm(BmmHeadSettings(model=model, data=bmm_data, **TINY, aten_head=True), log=quiet)
    bundle = artifact.load(model)
    assert {artifact.BMM, artifact.BMM_ATEN, artifact.BMM_CALL} <= set(bundle.heads)
    assert [bundle.encoders[h].kind for h in (artifact.BMM, artifact.BMM_ATEN, artifact.BMM_CALL)] == \
        ["bmm", "bmm_aten", "bmm_aten"]
    # refitted without the aten head (the default): the folder loses it
    m = refit_bmm(BmmHeadSettings(model=model, data=bmm_data, **TINY), log=quiet, command="perfmodel bmm-head")
    bundle = artifact.load(model)
    assert {artifact.BMM, artifact.BMM_CALL} <= set(bundle.heads) and artifact.BMM_ATEN not in bundle.heads
    meta = json.loads((model / "metadata.json").read_text())
    step = meta["build"]["steps"][-1]
    assert step["step"] == "bmm-head" and step["refit"] and step["command"] == "perfmodel bmm-head"
    assert meta["bmm_metrics"]["test/all/top1_eff"] == m["test/all/top1_eff"]
    assert meta["bmm_settings"]["data"]["files"] and len(meta["bmm_settings"]["data"]["sha256"]) == 64
    assert "zero_shot" in m and "test/all/top1_eff" in m["zero_shot"]


def test_folds_by_problem_split_a_shapes_batches_and_a_bad_cv_by_is_refused(bmm_data):
    """cv_by="problem": each problem in one fold, a shape's batches dealt out apart (16 re-batched pairs: some
    split); "shape" (the default) keeps them in one fold. Every fold holds problems of each mode."""
    t = load_bmm(bmm_data)
    by_shape, by_problem = shape_folds(t, 4, 0), shape_folds(t, 4, 0, "problem")
    for s in set(t.shape.tolist()):
        assert len(set(by_shape[t.shape == s].tolist())) == 1
    assert any(len(set(by_problem[t.shape == s].tolist())) > 1 for s in set(t.shape.tolist()))
    assert sorted(np.bincount(by_problem).tolist()) == [16, 16, 16, 16]
    with pytest.raises(ValueError, match="cv_by"):
        fit_bmm_heads(t, split_by_shape(t, 0), SPEC, 3, BmmHeadSettings(**SMALL, cv_by="batch"), log=quiet)


def test_a_model_of_two_devices_fits_both_devices_bmm_rows(bmm_data, tmp_path):
    """bmm_step with one folder per device: the heads fit both devices' train problems (each encoded for its
    device); the second device's shapes keep the set the first device's split puts them in (its synthetic
    problems are the first's, timed with the H200's bandwidth); its figures under metrics["devices"]; the
    settings record both folders' shards."""
    h200 = write_synthetic_bmm(tmp_path / "h200", n_problems=64, device="h200", header=synthetic_header("h200"))
    bundle = make_synthetic_bundle(hidden=(16,), devices=("h100-sxm", "h200"))
    said: list[str] = []
    m = bmm_step(bundle, [bmm_data, h200], BmmHeadSettings(**TINY), said.append)
    assert {artifact.BMM, artifact.BMM_CALL} <= set(bundle.heads)
    assert any(line.startswith("bmm-head: h200: 64 problems") for line in said)
    assert 0.0 < m["devices"]["h200"]["test/all/top1_eff"] <= 1.0 and 0.0 < m["test/all/top1_eff"] <= 1.0
    t1, t2 = load_bmm(bmm_data), load_bmm(h200)
    s1 = split_by_shape(t1, 0)
    s2 = bmm_head.other_device_split(t1, s1, t2, 0)
    where = {tuple(p[:-1]): s for p, s in zip(t1.problems.tolist(), s1.tolist())}
    assert all(where[tuple(p[:-1])] == s for p, s in zip(t2.problems.tolist(), s2.tolist()))
    assert m["devices"]["h200"]["test/problems"] == int((s2 == 2).sum())
    data = bundle.metadata["bmm_settings"]["data"]
    assert [d["path"] for d in data] == [bmm_data.as_posix(), h200.as_posix()]
    # more folders than devices: refused naming data
    with pytest.raises(ValueError, match="data"):
        bmm_step(make_synthetic_bundle(hidden=(16,)), [bmm_data, h200], BmmHeadSettings(**TINY), quiet)
