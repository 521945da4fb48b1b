"""The tutorial head (perfmodel/heads/tutorial.py, train/tutorial_head.py): kernel="tutorial", the Triton tutorial's
matmul as an @autotune user writes it, fitted as the inductor head is on the data's gemm_tutorial rows and stored as
gemm_tutorial; served by both backends, by `perfmodel rank --kernel tutorial` and by the Triton hook's kernel=. On
SYNTHETIC data (tests/_synthetic.py formula timings; tutorial rows made up from them as the dataset's x 1.3 on NT
layouts) and random-weight models: what is tested is the plumbing, not the figures."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from perfmodel import GemmProblem

pytest.importorskip("lightning", reason="fitting needs the train extra (pip install 'perfmodel[train]')")

DEVICES = ("h100-sxm", "h200")


def tutorial_run(folder: Path, run: Path, every: int) -> Path:
    """SYNTHETIC: a sweep folder as tutorial_kernel.py `sweep` writes it -- every `every`-th problem of the folder's
    gemm rows re-timed (the dataset's time, x 1.3 on NT layouts) and a run.json naming the kernel."""
    from tests._synthetic import write_retimed_run

    write_retimed_run(folder, run, slice(None, None, every), lambda r: 1.3 if r["transpose_right"] else 1.0)
    (run / "run.json").write_text(json.dumps({"kernel": "triton tutorial 03 matmul", "kernel_hash": "0" * 16}))
    return run


@pytest.fixture(scope="module")
def data_and_model(tmp_path_factory):
    """SYNTHETIC: the H100's and the H200's folder (the same problems), tutorial rows on the H200's only, and a
    random-weight two-device model folder with a 2-member gemm head."""
    from perfmodel.cli import main
    from tests._synthetic import write_synthetic_dataset, write_synthetic_model

    root = tmp_path_factory.mktemp("tutorial")
    folders = [write_synthetic_dataset(root / dev, device=dev, n_problems=48, configs=8) for dev in DEVICES]
    assert main(["gen", "static", "--kind", "gemm_tutorial", str(tutorial_run(folders[1], root / "run", 2)),
                 "--out", str(folders[1])]) == 0
    model = write_synthetic_model(root / "m", hidden=(16,), members=2, devices=DEVICES, screen="random",
                                  screen_keep=6, lead_keep=3)
    return folders, model


def _gemm(config):
    from perfmodel.serve.triton_hook import config_to_gemm

    return config_to_gemm(config)


def _settings(**kw):
    from perfmodel.train.tutorial_head import TutorialSettings

    return TutorialSettings(**{"hidden": (8,), "members": 2, "epochs": 1, "problems_per_batch": 4, **kw})


def test_gen_static_writes_tutorial_parts_with_the_runs_kernel(data_and_model, tmp_path, capsys):
    from perfmodel.cli import main
    from perfmodel.data_gen.shards import read_dataset

    folders, _ = data_and_model
    rows, headers = read_dataset(folders[1], "gemm_tutorial")
    assert len({r["unit"] for r in rows}) == 24 and headers[0]["kind"] == "gemm_tutorial"
    assert headers[0]["kernel_mode"] == "triton tutorial 03 matmul" and headers[0]["kernel_hash"] == "0" * 16
    assert not read_dataset(folders[1], "gemm_static")[0]          # the inductor mode's parts are another kind
    run = tmp_path / "run"
    run.mkdir()
    (run / "static_rows.jsonl.gz").write_bytes((tutorial_run(folders[1], tmp_path / "r2", 3)
                                                / "static_rows.jsonl.gz").read_bytes())
    assert main(["gen", "static", "--kind", "gemm_tutorial", str(run), "--out", str(folders[1])]) == 2
    assert "run.json" in capsys.readouterr().err                    # which kernel timed them is not said
    other = tutorial_run(folders[0], tmp_path / "r3", 1)            # a unit neither the folder's nor its fields' id
    with gzip.open(other / "static_rows.jsonl.gz", "rt") as fh:
        rows = [{**json.loads(line), "unit": "not-a-unit"} for line in fh]
    with gzip.open(other / "static_rows.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert main(["gen", "static", "--kind", "gemm_tutorial", str(other), "--out", str(folders[1])]) == 2
    assert "not in" in capsys.readouterr().err


def test_the_refit_adds_the_head_and_every_entry_point_serves_it(data_and_model, tmp_path, capsys):
    from safetensors.torch import load_file

    from perfmodel import Predictor
    from perfmodel.artifact import TUTORIAL_GEMM, load
    from perfmodel.cli import main
    from perfmodel.serve.triton_hook import perfmodel_prune
    from perfmodel.train.tutorial_head import refit_tutorial

    folders, model = data_and_model
    folder = shutil.copytree(model, tmp_path / "m")
    before = load_file(str(folder / "model.safetensors"))
    prob = GemmProblem(m=1000, n=3000, k=777, dtype="bfloat16", transpose_right=True)
    autotune = {b: Predictor.load(folder, backend=b, device="h200").rank(prob, top_k=4) for b in ("torch", "onnx")}
    with pytest.raises(ValueError, match="tutorial head"):   # none yet, and the error says how to get one
        Predictor.load(folder, backend="torch", kernel="tutorial")
    lines = []
    metrics = refit_tutorial(_settings(split="problem"), folder, folders, log=lines.append)
    assert set(metrics["devices"]) == {"h200"} and metrics["split"] == "problem"
    assert any("h100-sxm" in line and "its own gemm rows" in line for line in lines)   # plain rows of the H100
    m = metrics["devices"]["h200"]
    assert m["static_problems"] == 24 and 0.0 < m["test_static/static_head/all/top1_eff"] <= 1.0
    assert [d["device"] for d in metrics["data"]] == list(DEVICES)
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["heads"][TUTORIAL_GEMM]["features"] == meta["heads"]["gemm"]["features"]   # the flag folded in
    assert meta["tutorial_settings"]["plain"] is True
    from perfmodel.heads.tutorial import tutorial_head_card
    card = tutorial_head_card(meta)
    assert card.startswith("- Tutorial head") and "h200: 24 test problems" not in card and "h200:" in card
    after = load_file(str(folder / "model.safetensors"))
    assert all(k in after and before[k].equal(after[k]) for k in before)                  # every other head as it was
    assert {k.split(".")[0] for k in after} - {k.split(".")[0] for k in before} == {TUTORIAL_GEMM}
    assert load(folder).heads[TUTORIAL_GEMM].cfg.n_inputs == len(load(folder).encoders["gemm"])
    got = {}
    for backend in ("torch", "onnx"):   # kernel="autotune" ranks as before; "tutorial" by its head, on both devices
        assert Predictor.load(folder, backend=backend, device="h200").rank(prob, top_k=4) == autotune[backend]
        for dev in DEVICES:
            p = Predictor.load(folder, backend=backend, device=dev, kernel="tutorial")
            assert p.kernel == "tutorial" and p.backend == backend and p.predict_head == TUTORIAL_GEMM
            got[backend, dev] = [c for c, _ in p.rank(prob, top_k=4)]
    assert got["torch", "h200"] == got["onnx", "h200"] and got["torch", "h100-sxm"] == got["onnx", "h100-sxm"]
    assert main(["rank", "--m", "1000", "--n", "3000", "--k", "777", "--dtype", "bfloat16", "--transpose-right",
                 "--kernel", "tutorial", "--model", str(folder), "--device", "h200", "--json", "--top-k", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    fields = ("block_m", "block_n", "block_k", "group_m", "num_stages", "num_warps")
    assert out["kernel"] == "tutorial" and out["device"] == "h200"
    cli = [tuple(c[f] for f in fields) for c in out["configs"]]
    assert cli == [tuple(getattr(c, f) for f in fields) for c in got[out["backend"], "h200"]]
    # the @autotune hook ranks the launch's problem in the mode it is given (the predictor's own by default)
    import torch
    import triton

    p = Predictor.load(folder, backend="torch", device="h200")
    space = [triton.Config(dict(zip(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), c[:4])), num_stages=c[4],
                           num_warps=c[5]) for c in cli + [(64, 64, 32, 8, 3, 4), (128, 64, 64, 8, 4, 8)]]
    args = {"a": torch.empty(1000, 777, dtype=torch.bfloat16), "b": torch.empty(3000, 777, dtype=torch.bfloat16).t(),
            "M": 1000, "N": 3000, "K": 777}
    for kernel, pred in (("tutorial", p), (None, p.with_kernel("tutorial")), ("autotune", p.with_kernel("tutorial"))):
        kept = perfmodel_prune(top_k=4, predictor=pred, kernel=kernel)(space, args)
        want = pred.with_kernel(kernel or pred.kernel).rank(prob, [c for c in map(_gemm, space)], top_k=4)
        assert [_gemm(c) for c in kept] == [c for c, _ in want]
    with pytest.raises(ValueError, match="kernel"):
        perfmodel_prune(predictor=p, kernel="tutorials")
    with pytest.raises(ValueError, match="kernel"):
        perfmodel_prune(predictor=p, kernel="tutorials")


def test_eval_reports_the_tutorial_kernel_on_the_heads_split(data_and_model, tmp_path):
    # `perfmodel eval --split family`: the H200's gemm_tutorial rows of the head's held-out families, ranked in the
    # autotune mode and with the head -- the figures the fit recorded (SYNTHETIC data: the plumbing, not the figures)
    from perfmodel.artifact import load
    from perfmodel.train.data import load_device_datasets
    from perfmodel.train.eval_cmd import evaluate_datasets
    from perfmodel.train.tutorial_head import refit_tutorial

    folders, model = data_and_model
    folder = shutil.copytree(model, tmp_path / "m")
    metrics = refit_tutorial(_settings(), folder, folders, log=lambda *a: None)
    res = evaluate_datasets(load(folder), load_device_datasets(folders), full_space=False, split="family")
    assert "tutorial" not in res[0]                                   # no tutorial rows in the H100's folder
    tu = res[1]["tutorial"]
    want = metrics["devices"]["h200"]
    assert tu["split"] == "the tutorial head's family split (its metadata)" and tu["problems"] == want["test_static/problems"]
    for mode, key in (("tutorial", "static_head"), ("autotune", "without")):
        assert tu[mode]["all/top1_eff"] == pytest.approx(want[f"test_static/{key}/all/top1_eff"], rel=1e-9)
    assert len(tu["worst"]["tutorial"]) == min(5, tu["problems"])


def own_problems_run(folder: Path, run: Path, n: int = 40) -> Path:
    """SYNTHETIC: a sweep of the tutorial kernel's own problems (the unaligned sweep's kind): the Triton rows of the
    folder's first n problems, each moved to a new weight shape (K + 1 + i % 7: no gemm row holds it), its unit the
    id of its fields, and a run.json naming the kernel."""
    from perfmodel.data_gen.problems import problem_id
    from perfmodel.data_gen.shards import read_dataset

    rows, _ = read_dataset(folder, "gemm")
    units = sorted({r["unit"] for r in rows})[:n]
    new_k = {u: None for u in units}
    run.mkdir(parents=True)
    with gzip.open(run / "static_rows.jsonl.gz", "wt") as fh:
        for r in rows:
            if r["unit"] in new_k and r["kind"] == "triton":
                k = r["k"] + 1 + units.index(r["unit"]) % 7
                fields = {f: r[f] for f in ("m", "n", "dtype", "allow_tf32", "transpose_left", "transpose_right")}
                unit = problem_id(GemmProblem(k=k, **fields))
                fh.write(json.dumps({**r, "k": k, "unit": unit}) + "\n")
    (run / "run.json").write_text(json.dumps({"kernel": "triton tutorial 03 matmul", "kernel_hash": "0" * 16}))
    return run


def test_the_kernels_own_problems_join_the_fit_split_by_their_keys(data_and_model, tmp_path, capsys):
    # problems the gemm rows lack (the unaligned sweep's shapes) are written with the id of their own fields, fitted
    # and held out by their weight shape (train/families.py extra_key_side), and `perfmodel eval` splits them alike
    from perfmodel.artifact import load
    from perfmodel.cli import main
    from perfmodel.data_gen.shards import read_dataset
    from perfmodel.train.data import load_device_datasets
    from perfmodel.train.eval_cmd import evaluate_datasets
    from perfmodel.train.families import extra_key_side, family_key, split_from_record
    from perfmodel.train.static_head import load_static
    from perfmodel.train.tutorial_head import refit_tutorial

    folders, model = data_and_model
    h200 = shutil.copytree(folders[1], tmp_path / "h200")
    run = own_problems_run(h200, tmp_path / "own")
    with gzip.open(run / "static_rows.jsonl.gz", "rt") as fh:
        own = [json.loads(line) for line in fh]
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    with gzip.open(bad / "static_rows.jsonl.gz", "wt") as fh:   # a new problem under another problem's id
        fh.writelines(json.dumps({**r, "k": r["k"] + 1}) + "\n" for r in own)
    assert main(["gen", "static", "--kind", "gemm_tutorial", str(bad), "--out", str(h200)]) == 2
    assert "is not in" in capsys.readouterr().err and len({r["unit"] for r in read_dataset(h200, "gemm_tutorial")[0]}) == 24
    assert main(["gen", "static", "--kind", "gemm_tutorial", str(run), "--out", str(h200)]) == 0
    keys = {family_key(r["k"], r["n"]) for r in own}
    gemm_keys = {family_key(r["k"], r["n"]) for r in read_dataset(h200, "gemm")[0]}
    assert not keys & gemm_keys
    sides = {k: extra_key_side(k, 0) for k in keys}
    assert 2 in sides.values() and 0 in sides.values()      # (the synthetic shapes give both: the test has teeth)
    folder = shutil.copytree(model, tmp_path / "m")
    lines = []
    metrics = refit_tutorial(_settings(), folder, [folders[0], h200], log=lines.append)
    rec = metrics["family_split"]
    assert rec["extra"]["keys"] == len(keys) and rec["extra"]["test_keys"] == sum(v == 2 for v in sides.values())
    assert {k for k, v in sides.items() if v == 2} <= set(rec["test_keys"])
    assert any(f"{len({r['unit'] for r in own})} of them not in the gemm rows" in line for line in lines)
    static = load_static(h200, "gemm_tutorial")
    side = split_from_record(static.problems, rec)
    own_units = {r["unit"] for r in own}
    own_test = sum(s == 2 and u in own_units for s, u in zip(side, static.problem_keys))
    assert own_test == sum(sides[family_key(r["k"], r["n"])] == 2 for r in {r["unit"]: r for r in own}.values())
    assert metrics["devices"]["h200"]["test_static/problems"] == int((side == 2).sum()) > own_test > 0
    res = evaluate_datasets(load(folder), load_device_datasets([folders[0], h200]), full_space=False, split="family")
    assert res[1]["tutorial"]["problems"] == int((side == 2).sum())
    assert res[1]["tutorial"]["tutorial"]["all/top1_eff"] == pytest.approx(
        metrics["devices"]["h200"]["test_static/static_head/all/top1_eff"], rel=1e-9)


def test_a_fit_without_tutorial_rows_is_refused_by_name(data_and_model):
    # the H100's folder alone: its gemm rows (plain) would fit a second mode with no rows of it
    from perfmodel.artifact import load
    from perfmodel.train.tutorial_head import tutorial_step

    folders, model = data_and_model
    with pytest.raises(ValueError, match="gemm_tutorial"):
        tutorial_step(load(model), folders[:1], _settings(), log=lambda *a: None)
