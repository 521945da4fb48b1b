"""benchmarks/studies/tutorial_kernel.py's CPU half: the problems, the configs and the evaluation of a time run. The timings
here are SYNTHETIC (made up for the test); the GPU half is run on the device (its results file is the evidence)."""
import pytest

from benchmarks.studies import tutorial_kernel as tb
from perfmodel.devices import get_spec


def test_problems_cover_every_mode_and_layout_and_configs_are_seeded():
    ps = tb.problems()
    assert {p["mode"] for p in ps} == set(tb.MODES) and {p["layout"] for p in ps} == set(tb.LAYOUTS)
    spec = get_spec("h200")
    assert tb.configs_for(ps[3], 16, spec) == tb.configs_for(ps[3], 16, spec)
    assert len(tb.configs_for(ps[3], 16, spec)) == 16
    assert tb.gemm_problem(ps[3]).transpose_right == (ps[3]["layout"] == "NT")


@pytest.mark.parametrize("best", [0, 7])
def test_evaluate_scores_the_models_pick_against_the_best_timed(best):
    """SYNTHETIC times: every config 1.0 ms but one at 0.5 ms; top-5 is 1.0 exactly when the model's five hold it,
    and top-1 is 0.5 or 1.0, the pick's efficiency."""
    spec = get_spec("h200")
    p = {"m": 1000, "n": 2304, "k": 768, "mode": "bfloat16", "layout": "NT"}
    cfgs = tb.configs_for(p, 12, spec)
    rows = [{"config": list(c.__dict__.values()) if hasattr(c, "__dict__") else list(c), "status": "ok",
             "ms": 0.5 if i == best else 1.0} for i, c in enumerate(cfgs)]
    ev = tb.evaluate({"spec": "h200", "problems": [{**p, "rows": rows}]}, None)
    assert ev["problems"] == 1 and ev["all"]["top1"] in (0.5, 1.0) and ev["all"]["top5"] in (0.5, 1.0)
    assert ev["layout/NT"]["problems"] == 1 and ev["float16"]["problems"] == 0


def test_the_sweep_takes_dataset_problems_and_fixed_config_lists(tmp_path):
    import gzip
    import json

    spec = get_spec("h200")
    q = {"unit": "u1", "m": 333, "n": 3072, "k": 1024, "dtype": "float32", "allow_tf32": True,
         "transpose_left": False, "transpose_right": True}
    assert tb.study_problem(q) == {"m": 333, "n": 3072, "k": 1024, "mode": "tf32", "layout": "NT"}
    assert tb.study_problem({**q, "allow_tf32": False})["mode"] == "float32"
    with pytest.raises(ValueError, match="transpose_left"):
        tb.study_problem({**q, "transpose_left": True})
    # one list per mode and layout, the same on every call (its compiles are shared by the problems)
    a = tb.fixed_configs("tf32", "NT", 40, spec)
    assert a == tb.fixed_configs("tf32", "NT", 40, spec) and len(a) == 40 and a != tb.fixed_configs("tf32", "NN", 40, spec)
    run = tmp_path / "run"
    run.mkdir()
    with gzip.open(run / "static_rows.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"unit": "u1"}) + "\n" + json.dumps({"unit": "u2"}) + "\n")
    assert tb.done_units([run, tmp_path / "nothing"]) == {"u1", "u2"}
    assert len(tb.kernel_hash()) == 16


def test_the_committed_sweep_names_the_kernel_it_timed():
    """The sweeps written into data/h200 as gemm_tutorial parts timed this module's kernel (its source hash)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "tutorial_sweep_h200"
    runs = sorted(p.name for p in root.glob("sweep*") if p.is_dir())
    assert runs == [f"sweep{i}" for i in range(1, 9)]
    for run in runs:
        meta = json.loads((root / run / "run.json").read_text())
        assert meta["kernel"] == tb.KERNEL_MODE and meta["kernel_hash"] == tb.kernel_hash()


def test_the_dataset_list_sides_problems_by_the_inductor_heads_split(tmp_path):
    """dataset: the folder's own gemm problems under the floor cap, each with its family and the side the model's
    inductor head records, interleaved three train to one held out (test and val alternately); a model without
    that split is refused by name (SYNTHETIC data folder and split)."""
    import json

    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.train.families import family_key
    from tests._synthetic import write_synthetic_dataset

    folder = write_synthetic_dataset(tmp_path / "d", device="h200", n_problems=40, configs=4)
    rows = read_dataset(folder, "gemm")[0]
    keys = sorted({family_key(r["k"], r["n"]) for r in rows})
    assert len(keys) >= 6
    split = {"seed": 0, "test_keys": keys[:2], "val_keys": keys[2:4]}
    model = tmp_path / "m"
    model.mkdir()
    (model / "metadata.json").write_text(json.dumps({"inductor_metrics": {"family_split": split}}))
    spec = get_spec("h200")
    listing = tb.dataset_problems(folder, model, "h200", max_floor_ms=1e9)
    ps = listing["problems"]
    assert sorted(p["unit"] for p in ps) == sorted({r["unit"] for r in rows})
    side = lambda p: "test" if p["family"] in split["test_keys"] else "val" if p["family"] in split["val_keys"] \
        else "train"  # noqa: E731
    for p in ps:
        assert p["family"] == family_key(p["k"], p["n"])
        assert p["floor_ms"] == float(spec.roofline_ms(p["m"], p["n"], p["k"], p["dtype"], p["allow_tf32"]))
    sides = [side(p) for p in ps]
    n_held = sum(s != "train" for s in sides)
    assert 0 < n_held < len(ps)
    assert sides[:3] == ["train"] * 3 and sides[3] != "train"            # three train, then one held out
    held = [s for s in sides if s != "train"]
    assert held[:2] in (["test", "val"], ["val", "test"]) or len(set(held)) == 1
    assert tb.dataset_problems(folder, model, "h200", max_floor_ms=1e9) == listing    # seeded
    cap = sorted(p["floor_ms"] for p in ps)[len(ps) // 2]
    assert all(p["floor_ms"] <= cap for p in tb.dataset_problems(folder, model, "h200", max_floor_ms=cap)["problems"])
    (model / "metadata.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="--model"):
        tb.dataset_problems(folder, model, "h200")


@pytest.mark.slow  # reads data/h200's gemm rows (~3 s)
def test_the_committed_dataset_list_is_rebuilt_exactly():
    """benchmarks/results/tutorial_sweep_h200/problems.json, the list the H200 sweeps 1-2 timed, is what `dataset`
    makes of data/h200 and models/h200's inductor-head split."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    want = json.loads((root / "benchmarks/results/tutorial_sweep_h200/problems.json").read_text())
    assert tb.dataset_problems(root / "data" / "h200", root / "models" / "h200", "h200") == want


def test_the_unaligned_list_is_new_shapes_held_out_by_their_keys(tmp_path):
    """unaligned: weight shapes neither the folder's gemm problems nor the study's sizes hold, one of K and N off a
    multiple of 16, each problem under its physical floor cap, the side train/families.py extra_key_side's, the
    list naming its own config seed (SYNTHETIC data folder)."""
    from perfmodel.data_gen.problems import problem_id
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.schema import GemmProblem
    from perfmodel.train.families import extra_key_side, family_key
    from tests._synthetic import write_synthetic_dataset

    folder = write_synthetic_dataset(tmp_path / "d", device="h200", n_problems=24, configs=4)
    listing = tb.unaligned_problems(folder, "h200", n_keys=30, per_key=3, max_floor_ms=0.2)
    ps = listing["problems"]
    assert listing["config_seed"] == "unaligned" and 60 <= len(ps) <= 90
    data_keys = {family_key(r["k"], r["n"]) for r in read_dataset(folder, "gemm")[0]}
    study_keys = {family_key(k, n) for _, n, k in tb.SIZES}
    spec = get_spec("h200")
    for p in ps:
        assert p["family"] == family_key(p["k"], p["n"]) and p["family"] not in data_keys | study_keys
        assert p["k"] % 16 or p["n"] % 16
        assert p["side"] == ("train", "val", "test")[extra_key_side(p["family"], 0)]
        assert p["floor_ms"] <= 0.2 and p["floor_ms"] == float(spec.roofline_ms(p["m"], p["n"], p["k"], p["dtype"],
                                                                                p["allow_tf32"]))
        fields = {f: p[f] for f in ("m", "n", "k", "dtype", "allow_tf32", "transpose_left", "transpose_right")}
        assert p["unit"] == problem_id(GemmProblem(**fields))
    assert len({p["unit"] for p in ps}) == len(ps)
    assert {p["side"] for p in ps[:8]} >= {"train"} and any(p["side"] != "train" for p in ps[:8])   # interleaved
    assert tb.unaligned_problems(folder, "h200", n_keys=30, per_key=3, max_floor_ms=0.2) == listing
    # another config list than the first sweep's, the same on every call
    a = tb.fixed_configs("float16", "NN", 40, spec, "unaligned")
    assert a == tb.fixed_configs("float16", "NN", 40, spec, "unaligned") and a != tb.fixed_configs("float16", "NN", 40, spec)


def test_a_crashed_launch_is_read_back_and_only_device_errors_count(tmp_path):
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / tb.CRASHES_FILE).write_text(json.dumps({"unit": "u1", "config": [256, 16, 128, 8, 2, 2], "error": "x"}) + "\n"
                                       + json.dumps({"unit": "u1", "config": None, "error": "y"}) + "\n")
    assert tb.read_crashes([run, tmp_path / "none"]) == {"u1": [([256, 16, 128, 8, 2, 2], "x"), (None, "y")]}
    assert tb._device_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not tb._device_error(RuntimeError("output check: relative error nan"))
    assert not tb._device_error(RuntimeError("device error: CUDA error: ..."))   # a row's own record, not a launch
