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
    for run in ("sweep1", "sweep2"):
        meta = json.loads((root / run / "run.json").read_text())
        assert meta["kernel"] == tb.KERNEL_MODE and meta["kernel_hash"] == tb.kernel_hash()
