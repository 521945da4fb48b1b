"""`perfmodel build --recipe`: recipes/ci-small.toml builds a small model end to end on a slice of data/h100
(every step of the shipped recipe, minutes on two CPU cores), the Predictor loads it with both backends;
the build record, the card, refits appended to the record, recipe errors naming the key, and a failed
build leaving the previous folder in place."""
from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pytest

from perfmodel import GemmConfig, GemmProblem

REPO = Path(__file__).resolve().parent.parent


def _shards_sha256(folder: Path, bmm: bool = True, grouped: bool = False, static: bool = True,
                   only: tuple[str, ...] | None = None) -> tuple[str, int]:
    """The hash over every shard file of a data folder (without its bmm shards unless bmm, its grouped shards unless
    grouped: a build without a [bmm] / [grouped] step reads none; without its gemm_static shards unless static: a
    build reads them only with the inductor mode, or for the bmm step's static rows of its first folder; never its
    gemm_tutorial shards, which only the tutorial head's refit reads; only: just the shards of these kinds),
    recomputed here (not through train.folder): sorted paths relative to the folder, then each file's bytes; and how
    many files."""
    h = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))
                   and (bmm or not p.name.startswith("bmm-")) and (grouped or not p.name.startswith("grouped-"))
                   and (static or not p.name.startswith("gemm_static-")) and not p.name.startswith("gemm_tutorial-"))
    if only is not None:
        files = sorted(p for p in folder.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))
                       and p.name.split("-")[0] in only)
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest(), len(files)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("lightning", reason="building needs the train extra (pip install 'perfmodel[train]')")
    import torch

    from perfmodel.cli import main

    out = tmp_path_factory.mktemp("build") / "model"
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)  # the recipe's paths are relative to the working directory
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        assert main(["build", "--recipe", "recipes/ci-small.toml", "--out", str(out)]) == 0
    finally:
        mp.undo()
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return out


@pytest.mark.slow
def test_ci_recipe_builds_a_model_the_predictor_serves(built):
    from perfmodel import Predictor

    prob = GemmProblem(m=512, n=4096, k=1024, dtype="bfloat16")
    cfgs = [GemmConfig(block_m=bm, block_n=bn, block_k=bk, group_m=8, num_stages=3, num_warps=4)
            for bm, bn, bk in ((64, 64, 32), (128, 128, 64), (128, 64, 32), (64, 128, 64))]
    ranked = {}
    for backend in ("torch", "onnx"):
        p = Predictor.load(built, backend=backend)
        top = p.rank(prob, cfgs, top_k=2)
        assert len(top) == 2 and all(c in cfgs for c, _ in top) and 0 < top[0][1] <= top[1][1]
        ranked[backend] = [c for c, _ in top]
        for kernel in ("autotune", "inductor"):  # the config network serves the inductor mode
            assert Predictor.load(built, backend=backend, kernel=kernel).rank(prob, cfgs, top_k=1)[0]
    assert ranked["torch"][0] == ranked["onnx"][0]
    # the problem network serves the cuBLAS time and the call, the same on both backends
    probs = [GemmProblem(m=m, n=n, k=k, dtype=d) for m, n, k, d in ((512, 4096, 1024, "bfloat16"), (64, 768, 3072, "float16"),
                                                                     (4096, 4096, 4096, "float32"))]
    for kernel in ("autotune", "inductor"):
        ms, prefer = {}, {}
        for backend in ("torch", "onnx"):
            p = Predictor.load(built, backend=backend, kernel=kernel)
            assert p.has_cublas
            ms[backend], prefer[backend] = p.predict_cublas_many(probs), p.prefers_cublas_many(probs)
        # float32 rounding of two graphs of the same weights (the backends' check: rtol 1e-3)
        assert ms["torch"] == pytest.approx(ms["onnx"], rel=1e-3) and (ms["torch"] > 0).all()
        assert (prefer["torch"] == prefer["onnx"]).all()
    # the slice's bmm rows gave it bmm heads: a batched problem is ranked by them in both backends
    bmm = GemmProblem(m=512, n=512, k=64, dtype="float16", batch=32)
    tops = [Predictor.load(built, backend=b).rank(bmm, cfgs, top_k=1)[0] for b in ("torch", "onnx")]
    assert tops[0][0] == tops[1][0] and tops[0][1] > 0


@pytest.mark.slow
def test_the_build_record(built):
    meta = json.loads((built / "metadata.json").read_text())
    # one speed head: the student screens the ranking ([student].screens), no screen head; the gemm head is the
    # config network ([train].config_net: the kernel-mode input last), no static head
    assert set(meta["heads"]) == {"gemm", "pad", "student", "problem", "bmm", "bmm_call"}
    assert meta["kernel_mode_input"] == {"autotune": 0.0, "inductor": 1.0}
    assert meta["heads"]["gemm"]["features"][-1] == "kernel_mode"
    assert meta["heads"]["gemm"]["mlp"]["n_inputs"] == len(meta["heads"]["student"]["features"]) + 1
    assert meta["static_metrics"]["source"] == "config_net" and meta["static_metrics"]["test_static/problems"] > 0
    assert meta["screen_head"] == "student"
    assert meta["problem_outputs"] == ["cublas", "call", "call_static"]
    b = meta["build"]
    assert b["recipe"]["text"] == (REPO / "recipes" / "ci-small.toml").read_text()
    assert b["command"] == "perfmodel build --recipe recipes/ci-small.toml"  # --out is where, not what
    assert b["out"] == str(built) and meta["settings"]["command"] == b["command"]
    assert [s["step"] for s in b["steps"]] == ["data", "load", "train", "baselines", "distill", "inductor-figures",
                                               "problem-head", "bmm-head", "evaluate", "write"]
    assert all(s["seconds"] >= 0 for s in b["steps"]) and b["threads"] == 2 and b["seed"] == 0
    assert b["commit"] == "unknown" or len(b["commit"].removesuffix("-dirty")) == 40
    steps = {s["step"]: s["settings"] for s in b["steps"]}
    assert steps["train"]["epochs"] == 2 and steps["train"]["config_net"] is True and steps["problem-head"]["members"] == 1
    sha, files = _shards_sha256(REPO / "data" / "h100")
    assert b["data"] == [{"path": "data/h100", "sha256": sha, "files": files, "slice": {"problems": 200, "seed": 0}}]
    assert meta["dataset"]["sha256"] == sha and meta["dataset"]["gemm_problems"] == 200
    card = (built / "MODEL_CARD.md").read_text()
    assert f"Regenerate with:\n\n    {b['command']}\n" in card and "Refitted after the build" not in card
    # the slice was read from a temporary folder, gone now: the record and the card name the recipe's folder
    text = (built / "metadata.json").read_text()
    assert "perfmodel-build-" not in text and "perfmodel-build-" not in card, "a temporary folder named as the data"
    bmm_data = meta["bmm_settings"]["data"]  # one device: its folder's record
    assert meta["settings"]["data"] == ["data/h100"], meta["settings"]["data"]
    assert bmm_data["path"] == "data/h100" and bmm_data["slice"] == {"problems": 200, "seed": 0}, bmm_data
    # a one-member gemm head: no spread around a mean of members; no figure printed as nan
    assert card.splitlines()[0] == "# perfmodel H100 model" and "nan" not in card.lower()


@pytest.mark.slow
def test_build_only_fits_one_head_into_the_folder(built, tmp_path, capsys, monkeypatch):
    """`build --only problem` refits the problem network of a built folder with the recipe's [problem] section,
    appends its step to the record and rewrites the folder; a head of the train step is refused, and a failed fit
    leaves the folder as it was."""
    import shutil

    from perfmodel.cli import main
    from perfmodel.train import refit

    folder = tmp_path / "m"
    shutil.copytree(built, folder)
    before = json.loads((folder / "metadata.json").read_text())["build"]["steps"]
    recipe = tmp_path / "r.toml"
    recipe.write_text((REPO / "recipes" / "ci-small.toml").read_text().replace(
        "[problem]                    # the problem network: torch.mm's time and the cuBLAS-or-Triton calls, one MLP\n"
        "hidden = [16]", "[problem]\nhidden = [8]"))
    monkeypatch.chdir(REPO)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["build", "--recipe", str(recipe), "--out", str(folder), "--only", "gemm"]) == 2
    assert "rebuild the folder" in capsys.readouterr().err

    def fail(*a, **k):
        raise RuntimeError("the problem fit failed")

    with monkeypatch.context() as m:
        m.setattr(refit, "problem_step", fail)
        assert main(["build", "--recipe", str(recipe), "--out", str(folder), "--only", "problem"]) == 2
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    assert main(["build", "--recipe", str(recipe), "--out", str(folder), "--only", "problem"]) == 0
    meta = json.loads((folder / "metadata.json").read_text())
    steps = meta["build"]["steps"]
    assert steps[:-1] == before and steps[-1]["step"] == "problem-head" and steps[-1]["refit"] is True
    assert "--only problem" in steps[-1]["command"]
    assert steps[-1]["settings"]["hidden"] == [8] and meta["problem_settings"]["hidden"] == [8]
    card = (folder / "MODEL_CARD.md").read_text()
    assert "perfmodel build --recipe recipes/ci-small.toml" in card and "Refitted after the build" in card
    # the refit read a slice in a temporary folder, gone now: the record and the card name data/h100
    text = (folder / "metadata.json").read_text()
    assert "perfmodel-build-" not in text and "perfmodel-build-" not in card
    assert meta["problem_settings"]["data"] == ["data/h100"] and "nan" not in card.lower()


def test_the_removed_head_commands_say_what_replaces_them(capsys):
    from perfmodel.cli import main

    for name, instead in (("distill", "--only student"), ("problem-head", "--only problem"), ("bmm-head", "--only bmm"),
                          ("train", "perfmodel build --recipe"), ("static-head", "config_net")):
        assert main([name, "--model", "x", "--epochs", "1"]) == 2
        err = capsys.readouterr().err
        assert f"perfmodel {name}: removed; use" in err and instead in err


def test_recipe_errors_name_the_key(tmp_path):
    from perfmodel.train.recipe import load_recipe

    base = (REPO / "recipes" / "ci-small.toml").read_text()
    for bad, where in ((base.replace("epochs = 2\n", "epochs = \"two\"\n"), "[train].epochs"),
                       (base.replace("[student]\n", "[student]\nwidth = 3\n"), "[student].width"),
                       (base + "\n[static]\nhidden = [16]\n", "[static]: a head of an older layout"),
                       (base + "\n[call]\nmembers = 1\n", "[call]: a head of an older layout"),
                       (base.replace("hidden = [32, 32]\n", "hidden = 32\n"), "[train].hidden"),
                       (base.replace("threads = 2\n", "threads = 2\ncores = 4\n"), "[build].cores"),
                       (base + "\n[extra]\na = 1\n", "[extra]")):
        path = tmp_path / "r.toml"
        path.write_text(bad)
        with pytest.raises(ValueError, match=f"^recipe.*{where.replace('[', '.').replace(']', '.')}"):
            load_recipe(path)
    r = load_recipe(REPO / "recipes" / "h100.toml")  # the shipped model's recipe parses, its settings as recorded
    shipped = json.loads((REPO / "models" / "h100" / "metadata.json").read_text())
    assert (r.train.epochs, r.train.gemm_members, r.train.screen_keep, r.train.lead_keep) == \
        (shipped["settings"]["epochs"], shipped["settings"]["gemm_members"], shipped["screen_keep"], shipped["lead_keep"])
    assert r.train.config_net and shipped["kernel_mode_input"] == {"autotune": 0.0, "inductor": 1.0}
    # the shipped problem network (in place of the cuBLAS and call heads), with the recipe's settings
    assert (r.problem.hidden, r.problem.members, r.problem.epochs, r.problem.weight_decay) == (
        tuple(shipped["problem_settings"]["hidden"]), shipped["problem_settings"]["members"],
        shipped["problem_settings"]["epochs"], shipped["problem_settings"]["weight_decay"])


def test_the_family_recipe_is_the_h100_recipe_split_by_family():
    """recipes/h100-family.toml (the family-held-out figures of the README) is a copy of recipes/h100.toml: every
    setting the same but the split, where it writes, its registered name, and no bmm step."""
    from dataclasses import replace

    from perfmodel.train.recipe import load_recipe

    h100, family = load_recipe(REPO / "recipes" / "h100.toml"), load_recipe(REPO / "recipes" / "h100-family.toml")
    assert family.train.split == "family" and family.bmm is None and family.out == Path("build/h100-family")
    train = replace(family.train, split=h100.train.split, out=h100.train.out, register_name=h100.train.register_name)
    assert train == h100.train
    assert (family.data, family.seed, family.threads, family.mlflow) == (h100.data, h100.seed, h100.threads, h100.mlflow)
    assert (family.student, family.problem) == (h100.student, h100.problem)


def test_a_failed_build_leaves_the_previous_folder(tmp_path, monkeypatch):
    pytest.importorskip("lightning", reason="building needs the train extra (pip install 'perfmodel[train]')")
    from perfmodel.train import recipe

    out = tmp_path / "model"
    out.mkdir()
    (out / "metadata.json").write_text("{}")
    monkeypatch.chdir(REPO)

    def fail(*a, **k):
        raise RuntimeError("the problem step failed")

    monkeypatch.setattr(recipe, "problem_step", fail)
    small = (REPO / "recipes" / "ci-small.toml").read_text().replace("slice_problems = 200", "slice_problems = 40")
    (tmp_path / "r.toml").write_text(small)
    with pytest.raises(RuntimeError, match="problem step"):
        recipe.run_build(tmp_path / "r.toml", out=out, log=lambda *a: None)
    assert [p.name for p in out.iterdir()] == ["metadata.json"] and (out / "metadata.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["model", "r.toml"]  # no temporary folder left


@pytest.mark.parametrize("name,data", [("h100", ["h100"]), ("h200", ["h100", "h200"])])
def test_the_shipped_folders_are_their_recipes_builds(name, data):
    """models/<name> is `perfmodel build --recipe recipes/<name>.toml`: its record holds that recipe's text, the
    command on its card, and the sha256 over every shard file of today's data folders (recomputed here);
    one speed head (the student screens); besides the bmm heads, four heads: gemm (models/h100: the config
    network, serving both kernel modes), student, problem, pad -- and the grouped head where the record has its
    refit step (`build --only grouped`, after the build)."""
    meta = json.loads((REPO / "models" / name / "metadata.json").read_text())
    b = meta["build"]
    assert b["command"] == f"perfmodel build --recipe recipes/{name}.toml" and b["out"] == f"models/{name}"
    assert b["recipe"]["text"] == (REPO / "recipes" / f"{name}.toml").read_text()
    want = []
    recipe = tomllib.loads(b["recipe"]["text"])
    bmm_step = "bmm" in recipe
    for i, folder in enumerate(data):  # the bmm step alone reads bmm shards, every folder's
        static = bool(recipe["train"].get("config_net")) or "inductor" in recipe or (
            i == 0 and bmm_step and recipe["bmm"].get("static_rows", True))
        sha, files = _shards_sha256(REPO / "data" / folder, bmm=bmm_step, static=static)
        want.append({"path": f"data/{folder}", "sha256": sha, "files": files})
    assert b["data"] == want
    assert meta["encoder_version"] == 3 and b["threads"] == 2 and b["seed"] == 0
    card = (REPO / "models" / name / "MODEL_CARD.md").read_text()
    assert f"Regenerate with:\n\n    {b['command']}\n" in card
    assert meta["screen_head"] == "student" and "screen" not in meta["heads"]
    refits = {s["step"] for s in b["steps"] if s.get("refit")}
    grouped = {"grouped"} if "grouped-head" in refits else set()
    inductor = {"gemm_inductor"} if "inductor-head" in refits else set()
    tutorial = {"gemm_tutorial"} if "tutorial-head" in refits else set()
    assert set(meta["heads"]) - {"bmm", "bmm_call"} == \
        {"gemm", "student", "problem", "pad"} | grouped | inductor | tutorial, sorted(meta["heads"])
    if inductor:  # the refit's own record: the folders it read, each one's shard files hashed as they are today
        for rec in meta["inductor_metrics"]["data"]:
            sha, files = _shards_sha256(REPO / rec["path"], only=("gemm", "cublas", "pad", "gemm_static", "cublas_only"))
            assert rec["sha256"] == sha and rec["files"] == files, rec["path"]
    if tutorial:  # likewise: the gemm and gemm_tutorial shards it read
        for rec in meta["tutorial_metrics"]["data"]:
            sha, files = _shards_sha256(REPO / rec["path"], only=("gemm", "gemm_tutorial"))
            assert rec["sha256"] == sha and rec["files"] == files, rec["path"]
    assert ("kernel_mode_input" in meta) == (name == "h100")


@pytest.mark.slow
def test_build_only_grouped_fits_the_registered_grouped_head(tmp_path, monkeypatch):
    """The grouped head is one registered spec (perfmodel/heads/grouped.py) and one build step: `build --only
    grouped` refits it into a copy of models/h200 with the recipe's [grouped] section, every other head's weights
    bit for bit, and the folder serves."""
    import shutil

    from safetensors.torch import load_file

    from perfmodel import Predictor
    from perfmodel.cli import main

    folder = shutil.copytree(REPO / "models" / "h200", tmp_path / "m")
    recipe = tmp_path / "r.toml"
    recipe.write_text((REPO / "recipes" / "h200.toml").read_text()
                      + "\n[grouped]\nhidden = [8]\nmembers = 1\nepochs = 1\nbmm_share = 0.0\n")
    monkeypatch.chdir(REPO)
    before = load_file(str(folder / "model.safetensors"))
    assert main(["build", "--recipe", str(recipe), "--out", str(folder), "--only", "grouped"]) == 0
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["heads"]["grouped"]["mlp"]["hidden"] == [8] and meta["grouped_settings"]["epochs"] == 1
    assert meta["build"]["steps"][-1]["step"] == "grouped-head" and meta["build"]["steps"][-1]["refit"] is True
    after = load_file(str(folder / "model.safetensors"))
    kept = [k for k in before if not k.startswith("grouped.")]
    assert kept and all(torch_equal(before[k], after[k]) for k in kept)
    assert "- grouped head (" in (folder / "MODEL_CARD.md").read_text()
    assert "grouped" in Predictor.load(folder, backend="torch").bundle.heads


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)
