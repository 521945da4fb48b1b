"""Training on several devices' datasets: each folder's device from its shard headers, the joint split,
--device-fraction, and a model of two devices end to end. Every dataset here is SYNTHETIC (shards in the
real format with formula timings, tests/_synthetic.py), written under tmp_path -- never GPU timings."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from perfmodel.data_gen.shards import ShardMismatchError, ShardWriter
from perfmodel.train.data import (joint_split, load_device_dataset, load_device_datasets, parse_device_fractions,
                                  split_problems, subsample_training)
from tests._synthetic import synthetic_header, write_synthetic_dataset

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """An H100 and an H200 dataset of the same 48 problems (and configs), plus 16 problems only the H200 has."""
    root = tmp_path_factory.mktemp("two")
    h100 = write_synthetic_dataset(root / "h100", device="h100-sxm", n_problems=48)
    h200 = write_synthetic_dataset(root / "h200", device="h200", n_problems=48)
    extra = load_device_dataset(write_synthetic_dataset(root / "h200-extra", seed=5, device="h200", n_problems=16))
    return {"root": root, "h100": h100, "h200": h200, "extra": extra}


# ---- the device of a folder

def test_device_comes_from_the_shard_headers(two, tmp_path):
    assert load_device_dataset(two["h100"]).device == "h100-sxm"
    assert load_device_dataset(two["h200"]).device == "h200"
    # a header without device_spec (as older sweeps wrote): matched by device name and SM count
    old = write_synthetic_dataset(tmp_path / "x", device="h200", n_problems=4,
                                  header=synthetic_header("h200", with_spec_name=False))
    assert load_device_dataset(old).device == "h200"


def test_a_folder_named_for_one_device_refuses_anothers_rows(tmp_path):
    write_synthetic_dataset(tmp_path / "h200", device="h100-sxm", n_problems=4)   # H100 rows in data/h200
    with pytest.raises(ShardMismatchError, match="stands for h200 but its shards were measured on 'NVIDIA H100"):
        load_device_dataset(tmp_path / "h200")
    write_synthetic_dataset(tmp_path / "h100-v9", device="h100-sxm", n_problems=4)   # h100-<anything>: fine
    assert load_device_dataset(tmp_path / "h100-v9").device == "h100-sxm"


def test_a_resumed_sweep_refuses_another_devices_rows(two, tmp_path):
    """The shard writer's resume check: an H200 run into a folder of H100 parts is refused before it writes."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(two["h100"], folder)
    before = sorted(p.name for p in folder.iterdir())
    for kind in ("gemm", "pad"):
        with pytest.raises(ShardMismatchError, match="device_name"):
            ShardWriter(folder, kind, synthetic_header("h200"))
    assert sorted(p.name for p in folder.iterdir()) == before


def test_parts_of_two_devices_in_one_folder_are_refused_across_kinds(tmp_path):
    """gemm parts of the H100 and pad parts of the H200 copied into one folder (as parts from several
    machines are): each kind alone is one device, the loader refuses the folder."""
    mixed = write_synthetic_dataset(tmp_path / "mixed", device="h100-sxm", n_problems=4)
    other = write_synthetic_dataset(tmp_path / "other", device="h200", n_problems=4)
    for p in mixed.glob("pad-*"):
        p.unlink()
    for p in other.glob("pad-*"):
        (mixed / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ShardMismatchError, match="refusing to mix devices: the pad shards' device_name"):
        load_device_dataset(tmp_path / "mixed")


def test_two_folders_of_one_device_or_two_kernels_are_refused(two, tmp_path):
    with pytest.raises(ValueError, match="both h200 datasets"):
        load_device_datasets([two["h200"], two["root"] / "h200-extra"])
    other = write_synthetic_dataset(tmp_path / "a100", device="a100-sxm", n_problems=4,
                                    header={**synthetic_header("a100-sxm"), "kernel_hash": "another-kernel"})
    with pytest.raises(ValueError, match="different kernels"):
        load_device_datasets([two["h100"], other])


# ---- the split

def test_joint_split_keeps_the_first_devices_split_and_a_problem_in_one_set(two):
    a, b = load_device_datasets([two["h100"], two["h200"]])
    c = two["extra"]
    gs, ps = joint_split([a, b, c], seed=3)
    # the default device's split is a model of it alone's
    assert np.array_equal(gs[0], split_problems(a.gemm.modes, 3)) and np.array_equal(ps[0], split_problems(a.pads.modes, 3))
    # the same problem is in the same set on every device: the H200 measured the H100's problems
    key = {tuple(r): s for r, s in zip(a.gemm.problems.tolist(), gs[0].tolist())}
    assert [key[tuple(r)] for r in b.gemm.problems.tolist()] == gs[1].tolist()
    # problems only a later device has: split among themselves, stratified by mode
    assert np.array_equal(gs[2], split_problems(c.gemm.modes, 3))
    # deterministic
    again = joint_split([a, b, c], seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(gs + ps, again[0] + again[1]))
    assert not np.array_equal(joint_split([a, b], seed=4)[0][0], gs[0])


def test_device_fraction_subsamples_training_problems_only():
    rng = np.random.default_rng(0)
    modes = np.array(["float16", "bfloat16", "tf32", "float32"])[rng.integers(0, 4, 400)]
    device = np.array(["h100-sxm"] * 200 + ["h200"] * 200, dtype=object)
    split = np.concatenate([split_problems(modes[:200], 0), split_problems(modes[200:], 0)])
    kept = {}
    for f in (0.0, 0.1, 0.3, 1.0):
        out = subsample_training(split, device, modes, {"h200": f}, seed=0)
        assert np.array_equal(out[:200], split[:200]), "the other device is untouched"
        assert np.array_equal(out[200:] == 1, split[200:] == 1) and np.array_equal(out[200:] == 2, split[200:] == 2)
        for mode in np.unique(modes):
            train = (device == "h200") & (modes == mode) & (split == 0)
            assert ((out == 0) & train).sum() == int(round(f * train.sum())), (f, mode)
        assert set(out[200:][split[200:] == 0]) <= {0, -1}
        kept[f] = set(np.flatnonzero(out == 0)) - set(range(200))
        assert np.array_equal(out, subsample_training(split, device, modes, {"h200": f}, seed=0))
    assert kept[0.0] == set() and kept[0.1] <= kept[0.3] <= kept[1.0]   # nested: a learning curve
    assert kept[1.0] == set(np.flatnonzero(split == 0)) - set(range(200))


@pytest.mark.parametrize("text, want", [("", {}), ("h200=0.1", {"h200": 0.1}),
                                        ("h200=0.3, h100-sxm=1", {"h200": 0.3, "h100-sxm": 1.0})])
def test_parse_device_fractions(text, want):
    assert parse_device_fractions(text) == want


@pytest.mark.parametrize("text", ["h200", "h200=1.5", "h200=-0.1", "=0.5", "h200=abc"])
def test_parse_device_fractions_refuses(text):
    with pytest.raises(ValueError, match="device_fraction"):
        parse_device_fractions(text)


# ---- a model of two devices, end to end (tiny epochs)

@pytest.fixture(scope="module")
def joint(two, isolated, tmp_path_factory):
    from perfmodel.train.pipeline import TrainSettings, run

    tmp = tmp_path_factory.mktemp("joint")
    s = TrainSettings(data=(two["h100"], two["h200"]), out=tmp / "model", epochs=1, small_head_epochs=1,
                      fast_dev_run=True, tracking_uri=f"sqlite:///{tmp}/mlflow.db", register_name="", progress=False,
                      baselines=False, hidden=(16, 16), pad_members=1, cublas_members=1, device_fraction="h200=0.5",
                      command="pytest tests/test_joint_training.py")
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)
    try:
        res = run(s)
    finally:
        mp.undo()
    return {"res": res, "out": tmp / "model", "settings": s}


@pytest.mark.slow
def test_joint_model_folder(joint, two):
    from perfmodel import Predictor, artifact
    from perfmodel.train.pipeline import load_data

    out = joint["out"]
    assert (out / "model.onnx").is_file() and (out / "model.h200.onnx").is_file()
    b = artifact.load(out)
    meta = b.metadata
    assert b.devices == ("h100-sxm", "h200") and meta["device_fraction"] == {"h200": 0.5}
    assert [d["device"] for d in meta["datasets"]] == ["h100-sxm", "h200"]
    assert set(meta["metrics_by_device"]) == {"h100-sxm", "h200"}
    assert "top1_eff" in " ".join(meta["metrics_by_device"]["h200"]["results"])
    d = load_data(joint["settings"])
    h200 = d.problem_device == "h200"
    # half the H200 training problems (per mode, rounded); its test problems as the H100's
    assert meta["split_by_device"]["h200"]["train"] == (d.split[h200] == 0).sum() < (d.split[~h200] == 0).sum()
    assert meta["split_by_device"]["h200"]["test"] == meta["split_by_device"]["h100-sxm"]["test"]
    # each row encoded with its own device's spec
    enc = d.enc
    dram = d.x[:, enc.names.index("log_dram_gbs")].exp()
    rows_h200 = h200[d.gemm.problem_idx]
    assert np.allclose(dram[rows_h200].numpy(), 4800, rtol=1e-5) and np.allclose(dram[~rows_h200].numpy(), 3350, rtol=1e-5)
    card = (out / "MODEL_CARD.md").read_text()
    assert "Devices: h100-sxm, h200 (default h100-sxm)" in card
    for dev in ("h100-sxm", "h200"):
        for backend in ("torch", "onnx"):
            assert Predictor.load(out, device=dev, backend=backend).device == dev


@pytest.mark.slow
def test_eval_cli_on_two_devices(joint, two):
    cmd = [sys.executable, "-m", "perfmodel.serve.cli", "eval", "--model", str(joint["out"]), "--data", str(two["h100"]),
           "--data", str(two["h200"]), "--json"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert [r["device"]["data"] for r in res] == ["h100-sxm", "h200"]
    assert not any(r["device"]["zero_shot"] for r in res)
    assert res[1]["test_problems"] == res[0]["test_problems"] > 0  # the same shapes held out
    # the H200's held-out problems follow the H100's split: without the H100's folder first, refused
    proc = subprocess.run(cmd[:6] + ["--data", str(two["h200"])], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "default device h100-sxm" in proc.stderr


@pytest.mark.slow
def test_joint_model_student_serves_each_device(joint, two):
    """perfmodel train's student step on two devices: one student, measured on each device's own test
    problems, in each device's ONNX file (predict graph); both backends agree per device."""
    from perfmodel import GemmProblem, Predictor, artifact
    from perfmodel.configs import pruned_space

    out = joint["out"]
    b = artifact.load(out)
    assert "student" in b.heads and b.encoders["student"].kind == "gemm"
    by = b.metadata["student_metrics_by_device"]
    assert set(by) == {"h100-sxm", "h200"}
    assert {k: v for k, v in b.metadata["student_metrics"].items() if k != "student/seconds"} == by["h100-sxm"]
    assert by["h200"]["student/test_problems"] == b.metadata["split_by_device"]["h200"]["test"]
    assert "h200: median" in (out / "MODEL_CARD.md").read_text()
    probs = [GemmProblem(m=16, n=8192, k=8192, dtype="bfloat16"), GemmProblem(m=3000, n=77, k=1024)]
    preds = {}
    for dev in ("h100-sxm", "h200"):
        pt, ox = Predictor.load(out, device=dev, backend="torch"), Predictor.load(out, device=dev, backend="onnx")
        assert ox._run.predict_session is not None  # model.<device>.onnx has the predict graph
        cfgs = list(pruned_space("bfloat16", pt.spec))[:64]
        a, c = np.log(pt.predict_many(probs, cfgs)), np.log(ox.predict_many(probs, cfgs))
        assert np.abs(a - c).max() < 1e-3
        preds[dev] = a
    assert not np.allclose(preds["h100-sxm"], preds["h200"])  # each device's features


@pytest.mark.slow
def test_student_step_on_a_model_of_two_devices(joint, two, tmp_path):
    """The student step (`build --only student`) on a two-device model takes both datasets in the model's order
    (the joint split), and refuses one folder or the wrong order."""
    import shutil

    from perfmodel import artifact
    from perfmodel.train.distill import DistillSettings
    from perfmodel.train.refit import refit_student

    folder = tmp_path / "m"
    shutil.copytree(joint["out"], folder)

    def settings(data):
        return DistillSettings(model=folder, data=tuple(data), hidden=(8,), epochs=1, random_problems=4,
                               random_configs=8)

    for data in ([two["h100"]], [two["h200"], two["h100"]]):
        with pytest.raises(ValueError, match="data: this model was trained for h100-sxm, h200"):
            refit_student(settings(data), log=lambda *a: None)
    refit_student(settings([two["h100"], two["h200"]]), log=lambda *a: None)
    b = artifact.load(folder)
    assert b.heads["student"].cfg.hidden == (8,) and set(b.metadata["student_metrics_by_device"]) == {"h100-sxm", "h200"}
    # the same held-out problems as training's evaluation
    assert b.metadata["student_metrics_by_device"]["h200"]["student/test_problems"] == \
        b.metadata["split_by_device"]["h200"]["test"]
    assert (folder / "model.h200.onnx").is_file()
