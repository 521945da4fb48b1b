"""The inductor head (perfmodel/heads/inductor.py, train/inductor_head.py): a config network's inductor mode fitted
beside a gemm head that is not one, stored as gemm_inductor, serving kernel="inductor" while kernel="autotune" keeps
the gemm head. On SYNTHETIC data (tests/_synthetic.py: formula timings, and static rows made up from them as the
dataset's x 1.1) and random-weight models: what is tested is the plumbing, not the figures."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perfmodel import GemmProblem

pytest.importorskip("lightning", reason="fitting needs the train extra (pip install 'perfmodel[train]')")

REPO = Path(__file__).resolve().parent.parent
DEVICES = ("h100-sxm", "h200")


def _with_static(folder: Path, run: Path, every: int) -> Path:
    """SYNTHETIC: every `every`-th problem of the folder's gemm rows re-timed as static rows (the dataset's time
    x 1.1, kernel "v4 static"), written into the folder by `perfmodel gen static`."""
    from perfmodel.cli import main
    from tests._synthetic import write_retimed_run

    write_retimed_run(folder, run, slice(None, None, every), 1.1, kernel="v4 static")
    assert main(["gen", "static", str(run), "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """SYNTHETIC: a two-device data set (the H100's and the H200's folder, the same problems, static rows of half
    of them on each) and a random-weight two-device model folder with a 2-member gemm head, no config network."""
    from tests._synthetic import write_synthetic_dataset, write_synthetic_model

    root = tmp_path_factory.mktemp("inductor")
    folders = [_with_static(write_synthetic_dataset(root / dev, device=dev, n_problems=48, configs=8),
                            root / f"run-{dev}", 2) for dev in DEVICES]
    model = write_synthetic_model(root / "m", hidden=(16,), members=2, devices=DEVICES, screen="random",
                                  screen_keep=6, lead_keep=3)
    return folders, model


def _settings(**kw):
    from perfmodel.train.inductor_head import InductorSettings

    return InductorSettings(**{"hidden": (8,), "members": 2, "epochs": 1, "problems_per_batch": 4, **kw})


def test_the_refit_adds_the_head_and_leaves_the_gemm_head(two_devices, tmp_path):
    from safetensors.torch import load_file

    from perfmodel import Predictor
    from perfmodel.artifact import INDUCTOR_GEMM, load
    from perfmodel.train.inductor_head import refit_inductor

    folders, model = two_devices
    folder = shutil.copytree(model, tmp_path / "m")
    before = load_file(str(folder / "model.safetensors"))
    prob = GemmProblem(m=1000, n=3000, k=777, dtype="bfloat16")
    autotune = {b: Predictor.load(folder, backend=b, device="h200").rank(prob, top_k=4) for b in ("torch", "onnx")}
    with pytest.raises(ValueError, match="kernel"):  # no inductor mode yet, and the error says how to get one
        Predictor.load(folder, backend="torch", kernel="inductor")
    metrics = refit_inductor(_settings(split="problem"), folder, folders, log=lambda *a: None)
    assert set(metrics["devices"]) == set(DEVICES) and metrics["split"] == "problem"
    for dev in DEVICES:
        m = metrics["devices"][dev]
        assert m["static_problems"] == 24 and 0 < m["problems/train"] < 24
        assert 0.0 < m["test_static/static_head/all/top1_eff"] <= 1.0
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["heads"][INDUCTOR_GEMM]["features"] == meta["heads"]["gemm"]["features"]   # the flag folded in
    assert "kernel_mode_input" not in meta and meta["inductor_settings"]["members"] == 2
    after = load_file(str(folder / "model.safetensors"))
    assert all(k in after and before[k].equal(after[k]) for k in before)                  # every other head as it was
    assert {k.split(".")[0] for k in after} - {k.split(".")[0] for k in before} == {INDUCTOR_GEMM}
    b = load(folder)
    assert b.config_net is None and b.heads[INDUCTOR_GEMM].cfg.n_inputs == len(b.encoders["gemm"])
    for backend in ("torch", "onnx"):   # kernel="autotune" ranks as before, with the same predicted times
        assert Predictor.load(folder, backend=backend, device="h200").rank(prob, top_k=4) == autotune[backend]
        p = Predictor.load(folder, backend=backend, device="h200", kernel="inductor")
        assert p.has_static and p.kernel == "inductor"
    got = {b: [c for c, _ in Predictor.load(folder, backend=b, device="h200", kernel="inductor").rank(prob, top_k=4)]
           for b in ("torch", "onnx")}
    assert got["torch"] == got["onnx"]


def test_the_family_split_is_recorded(two_devices):
    from perfmodel.artifact import load
    from perfmodel.train.inductor_head import fit_inductor_head

    folders, model = two_devices
    head, metrics = fit_inductor_head(load(model), folders, _settings(), log=lambda *a: None)
    rec = metrics["family_split"]
    assert rec["seed"] == 0 and rec["test_keys"] and set(rec["problems"]) == {"train", "val", "test"}
    assert sum(rec["problems"].values()) == 2 * 48


def test_bad_settings_and_folders_are_refused_by_name(two_devices, tmp_path):
    from perfmodel.artifact import load
    from perfmodel.train.inductor_head import InductorSettings, inductor_step
    from tests._synthetic import make_synthetic_bundle, write_synthetic_dataset

    folders, model = two_devices
    with pytest.raises(ValueError, match="split"):
        InductorSettings(split="shape")
    with pytest.raises(ValueError, match="members"):
        InductorSettings(members=0)
    with pytest.raises(ValueError, match="hidden"):
        InductorSettings(hidden=())
    with pytest.raises(ValueError, match="members"):   # the model's lead member needs an ensemble
        inductor_step(load(model), folders, _settings(members=1), log=lambda *a: None)
    bare = write_synthetic_dataset(tmp_path / "h200", device="h200", n_problems=8)
    with pytest.raises(ValueError, match="gemm_static"):
        inductor_step(load(model), [bare], _settings(), log=lambda *a: None)
    with pytest.raises(ValueError, match="config network"):
        inductor_step(make_synthetic_bundle(hidden=(16,), members=2, config_net=True), folders[:1], _settings(),
                      log=lambda *a: None)


def test_a_folder_with_both_a_config_network_and_the_head_is_refused(tmp_path):
    from perfmodel.artifact import INDUCTOR_GEMM, ArtifactError, load
    from tests._synthetic import write_synthetic_model

    folder = write_synthetic_model(tmp_path / "c", hidden=(16,), members=2, config_net=True, onnx=False)
    meta = json.loads((folder / "metadata.json").read_text())
    meta["heads"][INDUCTOR_GEMM] = {**meta["heads"]["student"]}   # as if stored beside the network
    (folder / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError):
        load(folder)


def test_the_call_falls_back_to_the_autotune_call_without_call_static(tmp_path):
    # random weights: a model with an inductor mode whose problem network has a call output but no call_static
    # decides cuBLAS-or-Triton with that call output in both kernel modes (the decisions without the inductor mode)
    from perfmodel import Predictor
    from perfmodel.artifact import INDUCTOR_GEMM, PROBLEM, save
    from perfmodel.model import MLPConfig, PerfMLP
    from tests._synthetic import make_synthetic_bundle

    b = make_synthetic_bundle(hidden=(16,), members=2, lead_keep=0)
    n = len(b.encoders[PROBLEM])
    b.heads[PROBLEM] = PerfMLP(MLPConfig(n, (8,), "none", n_outputs=2, floor_features=(-1, -1))).eval()
    b.metadata["problem_outputs"] = ["cublas", "call"]
    b.heads[INDUCTOR_GEMM], b.encoders[INDUCTOR_GEMM] = make_synthetic_bundle(seed=1, hidden=(16,), members=2).heads[
        "gemm"], b.encoders["gemm"]
    save(b, tmp_path / "m")
    probs = [GemmProblem(m=m, n=n_, k=k, dtype=d) for m, n_, k, d in
             ((64, 4096, 4096, "float16"), (4096, 4096, 64, "bfloat16"), (333, 1000, 3000, "float16"))]
    auto = Predictor.load(tmp_path / "m", backend="torch")
    ind = auto.with_kernel("inductor")
    assert auto._call_head == ind._call_head == "call"
    assert (auto.prefers_cublas_many(probs) == ind.prefers_cublas_many(probs)).all()
    assert [c for c, _ in auto.rank(probs[2], top_k=3)] != [c for c, _ in ind.rank(probs[2], top_k=3)]


def test_the_h200_recipe_reads_only_the_first_folders_static_rows():
    # the build's data record hashes the gemm_static shards only where a step reads them: models/h200's bmm step
    # reads data/h100's (its batch-1 rows); without the inductor mode no step reads data/h200's, so the static rows
    # added to it for the inductor head (a refit, which records its own data) change nothing a rebuild fits
    from perfmodel.train.recipe import load_recipe, reads_static

    r = load_recipe(REPO / "recipes" / "h200.toml")
    assert r.inductor is None and not r.train.config_net
    assert reads_static(r, 0) and not reads_static(r, 1)
    h100 = load_recipe(REPO / "recipes" / "h100.toml")
    assert h100.train.config_net and reads_static(h100, 0)


def test_eval_reports_the_inductor_mode_on_every_device_on_the_heads_split(two_devices, tmp_path):
    # `perfmodel eval --split family` of a two-device folder with an inductor head: the static figures of each
    # device's data, taken on the head's recorded family split (SYNTHETIC data: the plumbing, not the figures)
    from perfmodel.artifact import load
    from perfmodel.train.data import load_device_datasets
    from perfmodel.train.eval_cmd import evaluate_datasets
    from perfmodel.train.inductor_head import refit_inductor

    folders, model = two_devices
    folder = shutil.copytree(model, tmp_path / "m")
    metrics = refit_inductor(_settings(), folder, folders, log=lambda *a: None)
    res = evaluate_datasets(load(folder), load_device_datasets(folders), full_space=False, split="family")
    assert [r["device"]["data"] for r in res] == list(DEVICES)
    for r in res:
        st = r["static"]
        assert st["split"] == "the inductor head's family split (its metadata)"
        want = metrics["devices"][r["device"]["data"]]
        assert st["problems"] == want["test_static/problems"]
        assert st["inductor"]["all/top1_eff"] == pytest.approx(want["test_static/static_head/all/top1_eff"], rel=1e-9)


@pytest.mark.slow
def test_a_recipe_with_an_inductor_section_builds_the_head(two_devices, tmp_path, monkeypatch):
    # `perfmodel build` of a two-device recipe with an [inductor] section (SYNTHETIC folders, tiny settings): the
    # head is fitted in the build, its metadata is written with the folder, and the build record hashes the static
    # shards it read
    import torch

    from perfmodel import Predictor
    from perfmodel.cli import main

    folders, _ = two_devices
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"""[build]
data = ["{folders[0].as_posix()}", "{folders[1].as_posix()}"]
out = "{(tmp_path / 'built').as_posix()}"
threads = 2

[train]
epochs = 1
hidden = [16]
gemm_members = 2
small_head_epochs = 1
cublas_hidden = [8]
cublas_members = 1
pad_hidden = [8]
pad_members = 1
baselines = false
progress = false
register_name = ""

[inductor]
hidden = [8]
members = 2
epochs = 1
problems_per_batch = 4
""")
    threads = torch.get_num_threads()
    try:
        assert main(["build", "--recipe", str(recipe)]) == 0
    finally:
        torch.set_num_threads(threads)
    meta = json.loads((tmp_path / "built" / "metadata.json").read_text())
    assert "gemm_inductor" in meta["heads"] and set(meta["inductor_metrics"]["devices"]) == set(DEVICES)
    assert meta["inductor_settings"]["epochs"] == 1
    assert [s["step"] for s in meta["build"]["steps"]].count("inductor-head") == 1
    assert all(d["files"] == 3 for d in meta["build"]["data"])   # gemm, pad and gemm_static: read, so hashed
    assert "- Inductor head (" in (tmp_path / "built" / "MODEL_CARD.md").read_text()
    assert Predictor.load(tmp_path / "built", backend="torch", device="h200", kernel="inductor").has_static
