"""The family-held-out split (train/families.py), the regret distribution (train/regret.py) and
`perfmodel eval --split` (train/eval_cmd.py, train/heldout.py).

The split tests run on the problem list of data_gen/problems.py (the real-model shapes and seeded random
draws, as the sweep builds it; no timings needed); the regret tests on synthetic efficiencies whose
quantiles are known; the CLI tests on the synthetic model and dataset of tests/_synthetic.py (random
weights, formula timings: the figures mean nothing, the plumbing is what is tested)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfmodel.data_gen.problems import LLM_LAYERS, gemm_problems
from perfmodel.devices import get_spec
from perfmodel.train.families import (assign_keys, family_key, family_keys, family_split, is_named,
                                      split_from_record)
from perfmodel.train.regret import distribution, layouts, regret, regret_report

REPO = Path(__file__).resolve().parent.parent


def _rows(problems) -> np.ndarray:
    """PROBLEM_COLUMNS rows (m, n, k, dtype bytes, bf16, tf32, transpose_left, transpose_right)."""
    return np.array([[p.m, p.n, p.k, p.dtype_bytes, p.dtype == "bfloat16", p.allow_tf32, p.transpose_left,
                      p.transpose_right] for p in problems], dtype=np.float64)


@pytest.fixture(scope="module")
def sweep_problems() -> np.ndarray:
    """The H100 sweep's GEMM problem list with 300 random draws (data_gen/problems.py, seed 0)."""
    return _rows(gemm_problems(300, get_spec("h100-sxm"), seed=0))


# ---------------------------------------------------------------- the split

def test_family_key_names_shared_shapes_once():
    # llama3-8b, mistral-7b and mixtral-8x7b share their qkv shape: one key naming the three
    assert family_key(4096, 6144) == "llama3-8b+mistral-7b+mixtral-8x7b:4096x6144"
    assert family_key(1600, 50257) == "gpt2-xl:1600x50257"
    assert family_key(9216, 4096) == "alexnet:9216x4096"          # the seed table's (M, K, N): K x N
    assert family_key(1000, 777) == "shape:1000x777"
    assert not is_named("shape:1000x777") and is_named("gpt2-xl:1600x50257")
    # the key is the weight shape alone: every M, dtype mode and layout of it maps to one key
    rows = np.array([[m, 6144, 4096, b, bf, tf, tl, tr] for m in (1, 333, 32768) for b, bf, tf in
                     ((2, 0, 0), (2, 1, 0), (4, 0, 1)) for tl in (0, 1) for tr in (0, 1)], dtype=np.float64)
    assert set(family_keys(rows)) == {"llama3-8b+mistral-7b+mixtral-8x7b:4096x6144"}


def test_split_is_deterministic_and_seeded(sweep_problems):
    a, b = family_split(sweep_problems, 0), family_split(sweep_problems, 0)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, family_split(sweep_problems, 1))   # another seed holds out other shapes
    # the problems' order does not matter: the assignment is per key
    perm = np.random.default_rng(3).permutation(len(sweep_problems))
    assert np.array_equal(family_split(sweep_problems[perm], 0), a[perm])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_key_in_two_sets_and_every_token_count_held_out(sweep_problems, seed):
    split = family_split(sweep_problems, seed)
    keys = family_keys(sweep_problems)
    for key in set(keys):
        assert len(set(split[keys == key])) == 1, key
    # every M of a held-out (K, N) is in test -- the property the split by problem lacks
    kn = {(int(r[2]), int(r[1])) for r in sweep_problems[split == 2]}
    for r, s in zip(sweep_problems, split):
        if (int(r[2]), int(r[1])) in kn:
            assert s == 2
    # test holds whole LLM layers (all 14 token counts of some layer) and random shapes
    test_keys = set(keys[split == 2])
    named = [k for k in test_keys if is_named(k)]
    assert named and len(test_keys) > len(named)
    layer = named[0]
    ms = {int(r[0]) for r, k in zip(sweep_problems, keys) if k == layer}
    assert {int(r[0]) for r, k, s in zip(sweep_problems, keys, split) if k == layer and s == 2} == ms
    # sizes near 80/10/10: within 5 points (one LLM layer is about 3 % of the problems)
    frac = np.bincount(split, minlength=3) / len(split)
    assert abs(frac[2] - 0.1) < 0.05 and abs(frac[1] - 0.1) < 0.05, frac


def test_assign_keys_hits_the_target_on_equal_keys():
    # 100 keys of 10 problems each in one stratum: exactly 10 keys to test, 10 to val
    keys = np.repeat([f"shape:{i}x{i}" for i in range(100)], 10)
    sets = assign_keys(keys, seed=4)
    assert np.bincount(list(sets.values()), minlength=3).tolist() == [80, 10, 10]


def test_split_from_record_reproduces_it(sweep_problems):
    split = family_split(sweep_problems, 0)
    keys = family_keys(sweep_problems)
    record = {"test_keys": sorted(set(keys[split == 2])), "val_keys": sorted(set(keys[split == 1]))}
    assert np.array_equal(split_from_record(sweep_problems, record), split)


def test_a_modes_own_shapes_are_held_out_by_a_hash_of_the_shape():
    # train/families.py extra_key_side / extra_sides: the tutorial kernel's own weight shapes, which no gemm row holds
    from perfmodel.train.families import extra_key_side, extra_sides

    keys = [f"shape:{k}x{n}" for k in range(100, 140) for n in range(200, 225)]   # 1,000 keys
    sides = [extra_key_side(k, 0) for k in keys]
    assert 70 <= sides.count(2) <= 130 and 70 <= sides.count(1) <= 130           # about one in ten each
    assert sides == [extra_key_side(k, 0) for k in keys] and sides != [extra_key_side(k, 1) for k in keys]
    # a shape the gemm rows hold keeps the record's side; a new one takes the hash's, and is returned as extra
    record = {"seed": 0, "test_keys": ["shape:64x64"], "val_keys": []}
    new = next(k for k in keys if extra_key_side(k, 0) == 2)
    kn = [int(v) for v in new.split(":")[1].split("x")]
    problems = np.array([[8, 64, 64, 2, 0, 0, 0, 1], [8, 96, 64, 2, 0, 0, 0, 1], [8, kn[1], kn[0], 2, 0, 0, 0, 1]],
                        dtype=np.float64)
    split, extra = extra_sides(problems, record, {"shape:64x64", "shape:64x96"})
    assert split.tolist() == [2, 0, 2] and extra == {new: 2}


def test_named_shapes_are_the_problem_lists():
    from perfmodel.train.families import family_names

    names = family_names()
    for fam, layers in LLM_LAYERS.items():
        for k, n in layers:
            assert fam in names[(k, n)]


# ---------------------------------------------------------------- regret (synthetic efficiencies)

def test_regret_is_the_slowdown_of_the_pick():
    assert np.allclose(regret(np.array([1.0, 0.5, 0.8])), [0.0, 1.0, 0.25], rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="efficiency"):
        regret(np.array([1.0, 0.0]))


def test_distribution_quantiles():
    # regrets 0, 0.01, ..., 0.10 (11 values): median 0.05, p90 0.09 (order statistic 9 of 0..10), worst 0.10
    d = distribution(np.arange(11) / 100.0)
    assert d["problems"] == 11
    assert d["median"] == pytest.approx(0.05, rel=1e-12)
    assert d["p90"] == pytest.approx(0.09, rel=1e-12)
    assert d["worst"] == pytest.approx(0.10, rel=1e-12)
    # NaN (a problem without rows) is left out; an empty group is NaN with count 0
    assert distribution(np.array([np.nan, 0.2]))["median"] == pytest.approx(0.2, rel=1e-12)
    assert distribution(np.array([]))["problems"] == 0


def test_layouts():
    assert layouts(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])).tolist() == ["NN", "NT", "TN", "TT"]


def test_regret_report_groups():
    top1 = np.array([1.0, 0.5, 0.8, 1.0, 0.9, np.nan])
    top5 = np.ones(6)
    modes = np.array(["float16", "float16", "tf32", "float32", "bfloat16", "bfloat16"])
    lay = np.array(["NN", "NT", "NT", "NT", "TT", "NN"])
    rep = regret_report(top1, top5, modes, lay)
    t1 = rep["top1"]
    assert set(t1) == {"all", "float16", "bfloat16", "tf32", "float32", "fp32_all", "layout/NN", "layout/NT",
                       "layout/TT"}   # TN absent: no problem of it
    assert t1["all"]["problems"] == 5   # the NaN problem left out
    assert t1["float16"]["worst"] == pytest.approx(1.0, rel=1e-12)
    assert t1["fp32_all"]["problems"] == 2 and t1["fp32_all"]["worst"] == pytest.approx(0.25, rel=1e-12)
    assert t1["layout/NT"]["median"] == pytest.approx(0.25, rel=1e-12)   # regrets 1.0, 0.25, 0.0
    assert t1["layout/TT"]["worst"] == pytest.approx(1 / 0.9 - 1, rel=1e-12)
    assert all(d["worst"] == 0.0 for d in rep["top5"].values() if d["problems"])


# ---------------------------------------------------------------- perfmodel eval --split (synthetic fixture)

@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from tests._synthetic import write_synthetic_dataset, write_synthetic_model

    root = tmp_path_factory.mktemp("family")
    return {"model": write_synthetic_model(root / "model", onnx=False),
            "data": write_synthetic_dataset(root / "h100", n_problems=60)}


def _eval(model: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfmodel.cli", "eval", "--model", str(model), "--data", str(data),
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_eval_cli_split_flag(synthetic):
    from perfmodel.train.data import load_device_dataset

    fam = _eval(synthetic["model"], synthetic["data"], "--split", "family", "--json")
    assert fam.returncode == 0, fam.stderr
    res = json.loads(fam.stdout)
    sp = res["split"]
    assert sp["kind"] == "family" and sp["model_split"] == "problem" and sp["contaminated"]
    assert 0 < sp["trained_share"] <= 1
    ds = load_device_dataset(synthetic["data"])
    keys = family_keys(ds.gemm.problems)
    want = family_split(ds.gemm.problems, 0) == 2
    assert sp["test_keys"] == sorted(set(keys[want])) and res["test_problems"] == int(want.sum())
    assert not any(k.endswith("(training run)") for k in res["results"])
    reg = res["regret"]["top1"]
    assert reg["all"]["problems"] == res["test_problems"]
    # the worst top-1 regret is the table's worst top-1 efficiency, seen from the other side
    worst = res["results"]["perfmodel"]["all/worst_top1"]
    assert reg["all"]["worst"] == pytest.approx(1 / worst - 1, rel=1e-9)
    assert {"median", "p90", "worst"} <= set(reg["float16"]) and any(k.startswith("layout/") for k in reg)
    # the default: the model's own split (by problem), not contaminated
    own = _eval(synthetic["model"], synthetic["data"], "--json")
    assert own.returncode == 0, own.stderr
    assert json.loads(own.stdout)["split"] == {"kind": "problem", "seed": 0, "source": "split_problems (seed)",
                                               "model_split": "problem", "contaminated": False}
    text = _eval(synthetic["model"], synthetic["data"], "--split", "family")
    assert text.returncode == 0, text.stderr
    assert "split by family" in text.stdout and "Held-out weight shapes" in text.stdout
    assert "| float16 |" in text.stdout and "top1 p90" in text.stdout and "flatter it" in text.stdout
    bad = _eval(synthetic["model"], synthetic["data"], "--split", "layer")
    assert bad.returncode != 0 and "--split" in bad.stderr


def test_eval_uses_the_recorded_family_split(synthetic):
    """A model trained on the family split: eval takes the held-out keys from its metadata, not the seed."""
    from perfmodel import artifact
    from perfmodel.train.data import load_device_dataset
    from perfmodel.train.eval_cmd import evaluate_datasets

    bundle = artifact.load(synthetic["model"])
    ds = load_device_dataset(synthetic["data"])
    keys = sorted(set(family_keys(ds.gemm.problems)))
    record = {"test_keys": keys[:5], "val_keys": keys[5:10]}
    bundle.metadata["settings"] = {**bundle.metadata.get("settings", {}), "split": "family"}
    bundle.metadata["family_split"] = record
    res = evaluate_datasets(bundle, [ds], full_space=False)[0]
    assert res["split"]["kind"] == "family" and not res["split"]["contaminated"]
    assert res["split"]["source"].startswith("the model's metadata")
    assert res["split"]["test_keys"] == keys[:5]
    assert res["test_problems"] == int(np.isin(family_keys(ds.gemm.problems), keys[:5]).sum())
    # asked for the split by problem, the model is reported as trained on some of those test problems
    res = evaluate_datasets(bundle, [ds], full_space=False, split="problem")[0]
    assert res["split"]["contaminated"] and res["split"]["model_split"] == "family"
